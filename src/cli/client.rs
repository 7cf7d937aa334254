//! A small client of the text protocol, for the admin commands: one
//! connection, one command at a time, every reply read whole.
//!
//! It knows the shapes of replies (a line; a line and a YAML document; a
//! line and a job body), not the meaning of commands: the subcommands pick
//! the words, so a new subcommand needs nothing new here.

use std::fmt;
use std::time::Duration;

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

use crate::config::MAX_JOB_SIZE_CEILING;

/// How long connecting may take. An address that drops packets would
/// otherwise hold a script for the kernel's two minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long any one reply may take. Admin commands never block on the
/// server side (no `reserve`), so a reply this late means a stuck server.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest reply line accepted. delayq's lines are short; a longer one
/// means the address is not a delayq (or beanstalkd) server.
const MAX_LINE: u64 = 4096;

/// Why a command could not be carried out: the server's fault, or the
/// network's, never the user's (clap reports those before we connect).
#[derive(Debug)]
pub enum Fault {
    /// Nothing accepted a connection at the address.
    Connect {
        /// The address as given.
        addr: String,
        /// Why, as the system said it.
        why: String,
    },
    /// The connection failed or closed while a command was under way.
    Io(String),
    /// The server answered with an error word (`INTERNAL_ERROR`,
    /// `OUT_OF_MEMORY`, `BAD_FORMAT`...) or with something the protocol
    /// does not allow at that point.
    Server(String),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Connect { addr, why } => write!(f, "cannot connect to {addr}: {why}"),
            Fault::Io(why) => write!(f, "connection to the server failed: {why}"),
            Fault::Server(why) => write!(f, "the server refused: {why}"),
        }
    }
}

impl std::error::Error for Fault {}

/// A job as `peek` and `reserve` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its id, a server id or a client-chosen one, as the server printed it.
    pub id: String,
    /// Its body, byte for byte.
    pub body: Vec<u8>,
}

/// A connection's byte stream: plain TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection to a server.
pub struct Client {
    stream: BufReader<Box<dyn Stream>>,
}

impl Client {
    /// Connects to `addr` (`HOST:PORT`, a name resolved; or `unix:PATH`,
    /// a Unix domain socket); over TLS if
    /// `ca` names the PEM file of the certificate (or its issuer's) that
    /// the server must show for the host name of `addr`.
    pub async fn connect(addr: &str, ca: Option<&Path>) -> Result<Client, Fault> {
        let fault = |why: String| Fault::Connect {
            addr: addr.to_string(),
            why,
        };
        if let Some(path) = addr.strip_prefix("unix:") {
            if ca.is_some() {
                return Err(fault(
                    "TLS is for TCP; a Unix socket's file is its guard".into(),
                ));
            }
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(path))
                .await
                .map_err(|_| fault(format!("no answer within {CONNECT_TIMEOUT:?}")))?
                .map_err(|e| fault(e.to_string()))?;
            return Ok(Client {
                stream: BufReader::new(Box::new(stream)),
            });
        }
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| fault(format!("no answer within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| fault(e.to_string()))?;
        // One short command at a time, each waiting for its reply: Nagle
        // would only add latency.
        stream.set_nodelay(true).map_err(|e| fault(e.to_string()))?;
        let stream: Box<dyn Stream> = match ca {
            None => Box::new(stream),
            Some(ca) => {
                let connector = tls_connector(ca).map_err(fault)?;
                let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| fault(format!("{host} is not a host name: {e}")))?;
                let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, stream))
                    .await
                    .map_err(|_| fault(format!("no TLS handshake within {CONNECT_TIMEOUT:?}")))?
                    .map_err(|e| fault(format!("TLS: {e}")))?;
                Box::new(tls)
            }
        };
        Ok(Client {
            stream: BufReader::new(stream),
        })
    }

    /// Sends one command line (the CRLF is added).
    pub async fn send(&mut self, line: &str) -> Result<(), Fault> {
        self.send_with_body(line, None).await
    }

    /// Sends one command line and, for a command that carries data (`put`),
    /// its body; both go in one write so a body never waits on a round trip.
    pub async fn send_with_body(&mut self, line: &str, body: Option<&[u8]>) -> Result<(), Fault> {
        let mut msg = Vec::with_capacity(line.len() + 4 + body.map_or(0, <[u8]>::len));
        msg.extend_from_slice(line.as_bytes());
        msg.extend_from_slice(b"\r\n");
        if let Some(body) = body {
            msg.extend_from_slice(body);
            msg.extend_from_slice(b"\r\n");
        }
        let stream = self.stream.get_mut();
        // A TLS stream holds what it was given until flushed.
        async {
            stream.write_all(&msg).await?;
            stream.flush().await
        }
        .await
        .map_err(|e| Fault::Io(e.to_string()))
    }

    /// Reads one reply line, without its line ending. A reply that is an
    /// error word whatever the command (`INTERNAL_ERROR`...) is a [`Fault`].
    pub async fn line(&mut self) -> Result<String, Fault> {
        let line = self.reply().await?;
        match line.as_str() {
            "INTERNAL_ERROR"
            | "OUT_OF_MEMORY"
            | "BAD_FORMAT"
            | "UNKNOWN_COMMAND"
            | "TOO_MANY_CONNECTIONS" => Err(Fault::Server(line)),
            _ => Ok(line),
        }
    }

    /// Reads one reply line, without its line ending, whatever it says: for
    /// a command whose error words are answers about one item of many
    /// (an `import` line refused while the rest go on).
    pub async fn reply(&mut self) -> Result<String, Fault> {
        let mut buf = Vec::new();
        let mut capped = (&mut self.stream).take(MAX_LINE);
        let n = tokio::time::timeout(REPLY_TIMEOUT, capped.read_until(b'\n', &mut buf))
            .await
            .map_err(|_| Fault::Io(format!("no reply within {REPLY_TIMEOUT:?}")))?
            .map_err(|e| Fault::Io(e.to_string()))?;
        if n == 0 {
            return Err(Fault::Io("the server closed the connection".into()));
        }
        let Some(line) = buf.strip_suffix(b"\r\n") else {
            return Err(Fault::Server(format!(
                "a reply line that does not end in CRLF: {:?}",
                String::from_utf8_lossy(&buf)
            )));
        };
        String::from_utf8(line.to_vec())
            .map_err(|_| Fault::Server("a reply line that is not text".into()))
    }

    /// Sends one command and reads its reply line.
    pub async fn command(&mut self, line: &str) -> Result<String, Fault> {
        self.send(line).await?;
        self.line().await
    }

    /// Sends a command that answers `OK <bytes>` and a YAML document
    /// (`stats`, `stats-tube`, `list-tubes`...); `None` if it answered
    /// `NOT_FOUND`.
    pub async fn yaml(&mut self, line: &str) -> Result<Option<String>, Fault> {
        let reply = self.command(line).await?;
        if reply == "NOT_FOUND" {
            return Ok(None);
        }
        let len = reply
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| unexpected(line, &reply))?;
        let doc = self.data(len).await?;
        String::from_utf8(doc)
            .map(Some)
            .map_err(|_| Fault::Server(format!("the document `{line}` answered is not text")))
    }

    /// Sends a command that answers `FOUND <id> <bytes>` (or `RESERVED`)
    /// and a body; `None` if it answered `NOT_FOUND`.
    pub async fn job(&mut self, line: &str) -> Result<Option<Job>, Fault> {
        let reply = self.command(line).await?;
        if reply == "NOT_FOUND" {
            return Ok(None);
        }
        let (id, len) = reply
            .strip_prefix("FOUND ")
            .or_else(|| reply.strip_prefix("RESERVED "))
            .and_then(|rest| rest.split_once(' '))
            .and_then(|(id, len)| Some((id, len.parse().ok()?)))
            .ok_or_else(|| unexpected(line, &reply))?;
        let id = id.to_string();
        let body = self.data(len).await?;
        Ok(Some(Job { id, body }))
    }

    /// Reads a data block of `len` bytes and the CRLF after it.
    pub async fn data(&mut self, len: usize) -> Result<Vec<u8>, Fault> {
        // No job body or document is larger than the largest job the
        // server may be configured to take; a larger count is not to be
        // believed, nor allocated.
        if len > MAX_JOB_SIZE_CEILING {
            return Err(Fault::Server(format!("a data block of {len} bytes")));
        }
        let mut buf = vec![0; len + 2];
        tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_exact(&mut buf))
            .await
            .map_err(|_| Fault::Io(format!("no data within {REPLY_TIMEOUT:?}")))?
            .map_err(|e| Fault::Io(e.to_string()))?;
        if !buf.ends_with(b"\r\n") {
            return Err(Fault::Server("a data block not followed by CRLF".into()));
        }
        buf.truncate(len);
        Ok(buf)
    }
}

/// A TLS client that trusts the certificates in the PEM file `ca` only
/// (see [`crate::tls::client_config`]).
fn tls_connector(ca: &Path) -> Result<tokio_rustls::TlsConnector, String> {
    let config = crate::tls::client_config(ca).map_err(|e| format!("--tls-ca {e}"))?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A reply the protocol does not allow to `line`.
pub fn unexpected(line: &str, reply: &str) -> Fault {
    let command = line.split(' ').next().unwrap_or(line);
    Fault::Server(format!("unexpected reply to {command}: {reply}"))
}
