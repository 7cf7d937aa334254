//! A minimal beanstalkd-protocol client, built for the load generator: it
//! queues commands into one buffer, writes them with one call, and parses
//! replies in place, so that the generator spends as little CPU per command
//! as it can and the server is what gets measured.

use std::io::{self, Write};

use bytes::{Buf, Bytes, BytesMut};

use crate::secure::{Endpoint, Stream};

/// One reply: its first line without the CRLF, and the body that follows
/// `RESERVED`, `FOUND` or `OK`.
pub struct Reply {
    pub line: Bytes,
    pub body: Option<Bytes>,
}

impl Reply {
    /// The line's words.
    fn words(&self) -> impl Iterator<Item = &[u8]> {
        self.line.split(|&b| b == b' ')
    }

    /// The id of an `INSERTED <id>` or `RESERVED <id> <bytes>` reply.
    pub fn id(&self, word: &str) -> io::Result<u64> {
        let mut words = self.words();
        if words.next() != Some(word.as_bytes()) {
            return Err(self.unexpected(word));
        }
        words
            .next()
            .and_then(|id| std::str::from_utf8(id).ok()?.parse().ok())
            .ok_or_else(|| self.unexpected(word))
    }

    /// Fails unless the reply is exactly `line`.
    pub fn expect(&self, line: &str) -> io::Result<()> {
        if self.line == line.as_bytes() {
            Ok(())
        } else {
            Err(self.unexpected(line))
        }
    }

    /// Whether the reply is exactly `line`.
    pub fn is(&self, line: &str) -> bool {
        self.line == line.as_bytes()
    }

    fn unexpected(&self, wanted: &str) -> io::Error {
        io::Error::other(format!(
            "expected {wanted}, got {:?}",
            String::from_utf8_lossy(&self.line)
        ))
    }

    /// The value of `key` in a YAML dictionary body (`stats`).
    pub fn field(&self, key: &str) -> Option<u64> {
        let body = std::str::from_utf8(self.body.as_deref()?).ok()?;
        body.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(": "))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// A connection to a beanstalkd-protocol server.
pub struct Conn {
    stream: Stream,
    input: BytesMut,
    output: Vec<u8>,
}

impl Conn {
    /// Connects to `at` (over TLS and authenticated, if the server wants
    /// that), with small buffers: the `conns` workload opens ten thousand
    /// of these.
    pub async fn connect(at: &Endpoint) -> io::Result<Conn> {
        let mut conn = Conn {
            stream: at.connect(false).await?,
            input: BytesMut::with_capacity(256),
            output: Vec::with_capacity(256),
        };
        if let Some(token) = at.token() {
            conn.queue(format_args!("auth {token}"));
            conn.round_trip()
                .await?
                .expect("AUTHENTICATED")
                .map_err(|e| io::Error::other(format!("auth: {e}")))?;
        }
        Ok(conn)
    }

    /// Queues a command line (without its CRLF).
    pub fn queue(&mut self, line: std::fmt::Arguments<'_>) {
        let _ = self.output.write_fmt(line);
        self.output.extend_from_slice(b"\r\n");
    }

    /// Queues a `put`.
    pub fn queue_put(&mut self, pri: u32, delay: u64, ttr: u64, body: &[u8]) {
        self.queue(format_args!("put {pri} {delay} {ttr} {}", body.len()));
        self.output.extend_from_slice(body);
        self.output.extend_from_slice(b"\r\n");
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        self.stream.send(&self.output).await?;
        self.output.clear();
        Ok(())
    }

    /// Reads the next reply.
    pub async fn reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some(reply) = self.parse()? {
                return Ok(reply);
            }
            if self.input.capacity() - self.input.len() < 128 {
                self.input.reserve(4096);
            }
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Writes what is queued and reads one reply.
    pub async fn round_trip(&mut self) -> io::Result<Reply> {
        self.flush().await?;
        self.reply().await
    }

    fn parse(&mut self) -> io::Result<Option<Reply>> {
        let Some(end) = memchr::memmem::find(&self.input, b"\r\n") else {
            return Ok(None);
        };
        let line = &self.input[..end];
        let size = [&b"RESERVED "[..], b"FOUND ", b"OK "]
            .iter()
            .find(|word| line.starts_with(word))
            .map(|_| {
                line.rsplit(|&b| b == b' ')
                    .next()
                    .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                    .ok_or_else(|| io::Error::other("a reply with a bad body size"))
            })
            .transpose()?;
        match size {
            None => {
                let line = self.input.split_to(end).freeze();
                self.input.advance(2);
                Ok(Some(Reply { line, body: None }))
            }
            Some(n) if self.input.len() >= end + 2 + n + 2 => {
                let line = self.input.split_to(end).freeze();
                self.input.advance(2);
                let body = self.input.split_to(n).freeze();
                self.input.advance(2);
                Ok(Some(Reply {
                    line,
                    body: Some(body),
                }))
            }
            Some(n) => {
                self.input.reserve(end + 2 + n + 2 - self.input.len());
                Ok(None)
            }
        }
    }
}
