//! Tokens and TLS for the bench's connections, so that it can measure
//! delayq with them on. A delayq target's arguments say what its
//! connections need: `--tokens FILE` (each connection authenticates with
//! the file's first admin token without a prefix) and `--tls-cert C` (each
//! connection speaks TLS and trusts exactly the certificate C, which must
//! name `localhost`). The bench-only argument `--secure` makes both for a
//! target: a self-signed certificate and a tokens file, in a temporary
//! directory.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Where a bench connection goes, and what it must do there first.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// `None`: plain TCP and no token, as against beanstalkd.
    pub access: Option<Arc<Access>>,
}

impl Endpoint {
    /// The token to present, if the server wants one.
    pub fn token(&self) -> Option<&str> {
        self.access.as_ref()?.token.as_deref()
    }

    /// Connects over TCP and, if the server wants it, TLS (`http` picks
    /// the connector that offers ALPN `http/1.1`).
    pub async fn connect(&self, http: bool) -> io::Result<Stream> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.access.as_ref().and_then(|a| match http {
            true => a.http_tls.as_ref(),
            false => a.text_tls.as_ref(),
        });
        Ok(match tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let name = ServerName::try_from("localhost").expect("a DNS name");
                Stream::Tls(Box::new(tls.connect(name, tcp).await?))
            }
        })
    }
}

/// A connection's byte stream. An enum rather than a `dyn` so that the
/// plain path costs one branch per call and no allocation or virtual call;
/// the TLS stream is boxed only to keep the enum small.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Writes all of `buf` and, with TLS, flushes it: tokio-rustls may keep
    /// records it could not write yet until the next write or flush, and
    /// the bench waits for a reply right after.
    pub async fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(buf).await,
            Stream::Tls(s) => {
                s.write_all(buf).await?;
                s.flush().await
            }
        }
    }

    /// Reads what has come into `buf`; 0 at the end of the stream.
    pub async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read_buf(buf).await,
            Stream::Tls(s) => s.read_buf(buf).await,
        }
    }
}

/// What a delayq target's connections need: TLS connectors (one for the
/// text port, one offering ALPN `http/1.1` for the HTTP port) and a token.
pub struct Access {
    text_tls: Option<TlsConnector>,
    http_tls: Option<TlsConnector>,
    token: Option<String>,
}

impl Access {
    /// What a delayq started with `args` wants of its clients: `None` if
    /// neither `--tokens` nor `--tls-cert` is among them.
    pub fn from_args(args: &[String]) -> io::Result<Option<Arc<Access>>> {
        let token = arg_value(args, "--tokens")
            .map(|file| admin_token(Path::new(file)))
            .transpose()?;
        let tls = arg_value(args, "--tls-cert")
            .map(|cert| client_config(Path::new(cert)))
            .transpose()?;
        if token.is_none() && tls.is_none() {
            return Ok(None);
        }
        let connector = |alpn: &[&[u8]]| {
            tls.as_ref().map(|config| {
                let mut config = config.clone();
                config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
                TlsConnector::from(Arc::new(config))
            })
        };
        Ok(Some(Arc::new(Access {
            text_tls: connector(&[]),
            http_tls: connector(&[b"http/1.1"]),
            token,
        })))
    }
}

/// The value after `name` in `args` (`name VALUE` or `name=VALUE`, as the
/// server's parser takes them).
pub fn arg_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

/// The first token of the tokens file `path` that has the admin role and
/// no prefix: the one that may do everything every workload does, and
/// read `/metrics`.
fn admin_token(path: &Path) -> io::Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::other(format!("--tokens {}: {e}", path.display())))?;
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [token, roles] if roles.split(',').any(|r| r == "admin") => Some(token.to_owned()),
                _ => None,
            },
        )
        .ok_or_else(|| {
            io::Error::other(format!(
                "--tokens {}: the bench needs a token with the admin role and no prefix \
                 (a line `TOKEN admin`), and there is none",
                path.display()
            ))
        })
}

/// A TLS client configuration that trusts the certificate in the PEM file
/// `cert` only, as delayq's own admin CLI does.
fn client_config(cert: &Path) -> io::Result<rustls::ClientConfig> {
    delayq::tls::client_config(cert).map_err(|e| io::Error::other(format!("--tls-cert {e}")))
}

/// What `--secure` makes for one target: a self-signed certificate for
/// `localhost` (and 127.0.0.1), its key and a tokens file with one admin
/// token, in a temporary directory removed with it.
pub struct Secrets {
    dir: tempfile::TempDir,
}

impl Secrets {
    /// The files, and the server arguments that use them.
    pub fn make() -> io::Result<Secrets> {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .map_err(io::Error::other)?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("cert.pem"), made.cert.pem())?;
        std::fs::write(dir.path().join("key.pem"), made.signing_key.serialize_pem())?;
        let token = format!("bench-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        std::fs::write(dir.path().join("tokens"), format!("{token} admin\n"))?;
        Ok(Secrets { dir })
    }

    fn path(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        path.to_str().expect("a UTF-8 temporary path").to_owned()
    }

    /// `--tls-cert`, `--tls-key` and `--tokens` with these files.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.path("cert.pem"),
            "--tls-key".into(),
            self.path("key.pem"),
            "--tokens".into(),
            self.path("tokens"),
        ]
    }
}
