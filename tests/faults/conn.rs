//! A client that expects its server to die: EOF and resets are results,
//! not panics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::common::REPLY_TIMEOUT;

/// Longest any single reply may take in the multi-process tests (a blocked
/// `reserve-with-timeout 1` included) before the test fails instead of hanging.
const LINE_LIMIT: Duration = Duration::from_secs(10);

/// The connection ended under us: the process was killed.
#[derive(Debug)]
pub struct Gone;

pub type Io<T> = Result<T, Gone>;

/// A protocol connection on which EOF and resets are results, not panics.
pub struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Io<Conn> {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect within the timeout")
            .map_err(|_| Gone)?;
        stream.set_nodelay(true).map_err(|_| Gone)?;
        Ok(Conn {
            stream: BufReader::new(stream),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Io<()> {
        self.stream
            .get_mut()
            .write_all(bytes)
            .await
            .map_err(|_| Gone)
    }

    pub async fn line(&mut self) -> Io<String> {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(LINE_LIMIT, self.stream.read_until(b'\n', &mut buf))
            .await
            .unwrap_or_else(|_| panic!("no reply within {LINE_LIMIT:?} (got {buf:?})"))
            .map_err(|_| Gone)?;
        if n == 0 || !buf.ends_with(b"\r\n") {
            return Err(Gone);
        }
        buf.truncate(buf.len() - 2);
        Ok(String::from_utf8(buf).expect("reply line is UTF-8"))
    }

    async fn block(&mut self, len: usize) -> Io<Vec<u8>> {
        let mut buf = vec![0; len + 2];
        tokio::time::timeout(LINE_LIMIT, self.stream.read_exact(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{len} bytes did not arrive within {LINE_LIMIT:?}"))
            .map_err(|_| Gone)?;
        assert_eq!(&buf[len..], b"\r\n", "data block is followed by CRLF");
        buf.truncate(len);
        Ok(buf)
    }

    pub async fn cmd(&mut self, line: &str) -> Io<String> {
        self.send(format!("{line}\r\n").as_bytes()).await?;
        self.line().await
    }

    /// The id and body of a job whose `RESERVED <id> <bytes>` line was read.
    pub async fn job(&mut self, line: &str) -> Io<(String, Vec<u8>)> {
        let (id, len) = line
            .strip_prefix("RESERVED ")
            .and_then(|rest| rest.split_once(' '))
            .unwrap_or_else(|| panic!("expected RESERVED <id> <bytes>, got {line:?}"));
        let len = len.parse().expect("byte count");
        Ok((id.to_string(), self.block(len).await?))
    }

    /// Whether the server's storage answers: `stats` needs it, and is
    /// answered `INTERNAL_ERROR` while it is away.
    pub async fn storage_answers(&mut self) -> Io<bool> {
        let line = self.cmd("stats").await?;
        if line == "INTERNAL_ERROR" {
            return Ok(false);
        }
        let len = line
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("expected OK <bytes> to stats, got {line:?}"));
        self.block(len).await?;
        Ok(true)
    }

    /// `stats`, as a map of its numeric figures.
    pub async fn stats(&mut self) -> Io<HashMap<String, u64>> {
        let line = self.cmd("stats").await?;
        let len = line
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("expected OK <bytes> to stats, got {line:?}"));
        let doc = String::from_utf8(self.block(len).await?).expect("YAML is UTF-8");
        Ok(doc
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect())
    }
}

/// A figure of a `stats` map; panics if absent.
pub fn figure(stats: &HashMap<String, u64>, key: &str) -> u64 {
    *stats
        .get(key)
        .unwrap_or_else(|| panic!("no `{key}` in stats"))
}

/// The job counts that must all be zero once everything is drained.
pub const CURRENT: [&str; 5] = [
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
];
