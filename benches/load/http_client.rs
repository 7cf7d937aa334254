//! A minimal HTTP/1.1 keep-alive client for delayq's JSON API, built for
//! the load generator in the spirit of `client.rs`: one request written
//! with one call, the answer parsed in place. A general client (reqwest,
//! hyper's) spends several times the CPU per request on pools, header maps
//! and wakers, and with the generator on one core that would be what the
//! `http-cycle` figures measure rather than the server.
//!
//! It reads only what delayq's API sends: a status line, headers with a
//! `content-length` (axum always gives one for a JSON body), and the body.

use std::io::{self, Write};

use bytes::{Buf, Bytes, BytesMut};

use crate::secure::{Endpoint, Stream};

/// One answer: its status and its body.
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, as many bytes as `content-length` said.
    pub body: Bytes,
}

impl Answer {
    /// The body as a JSON value.
    pub fn json(&self) -> io::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).map_err(|e| {
            io::Error::other(format!(
                "{} {:?} is not JSON: {e}",
                self.status,
                String::from_utf8_lossy(&self.body)
            ))
        })
    }

    /// The `id` of a successful answer with `status` (a put's, a
    /// reserve's, a finish's); an error names what came instead.
    pub fn id(&self, status: u16) -> io::Result<String> {
        let value = self.json()?;
        match (self.status == status, &value["success"], &value["id"]) {
            (true, serde_json::Value::Bool(true), serde_json::Value::String(id)) => Ok(id.clone()),
            _ => Err(io::Error::other(format!(
                "expected {status} with an id, got {} {value}",
                self.status
            ))),
        }
    }
}

/// One keep-alive connection to delayq's HTTP listener.
pub struct HttpConn {
    stream: Stream,
    input: BytesMut,
    output: Vec<u8>,
    /// An `authorization` header line with its CRLF, or nothing.
    auth: String,
}

impl HttpConn {
    /// Connects to `at` (over TLS, if the server wants it); every request
    /// carries the server's token, if it wants one.
    pub async fn connect(at: &Endpoint) -> io::Result<HttpConn> {
        Ok(HttpConn {
            stream: at.connect(true).await?,
            input: BytesMut::with_capacity(1024),
            output: Vec::with_capacity(512),
            auth: at
                .token()
                .map(|t| format!("authorization: Bearer {t}\r\n"))
                .unwrap_or_default(),
        })
    }

    /// Sends `method path` with `body` (JSON, or nothing if empty) and reads
    /// the answer.
    pub async fn call(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Answer> {
        self.output.clear();
        let _ = write!(
            self.output,
            "{method} {path} HTTP/1.1\r\nhost: delayq\r\n{}content-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            self.auth,
            body.len()
        );
        self.output.extend_from_slice(body);
        self.stream.send(&self.output).await?;
        loop {
            if let Some(answer) = self.parse()? {
                return Ok(answer);
            }
            if self.input.capacity() - self.input.len() < 256 {
                self.input.reserve(4096);
            }
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    fn parse(&mut self) -> io::Result<Option<Answer>> {
        let Some(end) = memchr::memmem::find(&self.input, b"\r\n\r\n") else {
            return Ok(None);
        };
        let head = std::str::from_utf8(&self.input[..end])
            .map_err(|_| io::Error::other("an answer head that is not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|line| line.split(' ').nth(1)?.parse().ok())
            .ok_or_else(|| io::Error::other(format!("a bad status line in {head:?}")))?;
        let length: usize = lines
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("no content-length in {head:?}")))?;
        if self.input.len() < end + 4 + length {
            self.input.reserve(end + 4 + length - self.input.len());
            return Ok(None);
        }
        self.input.advance(end + 4);
        let body = self.input.split_to(length).freeze();
        Ok(Some(Answer { status, body }))
    }
}
