//! TLS for clients (`--tls-cert`, `--tls-key`) on the real binary: the
//! text protocol and the HTTP API over TLS, from our own rustls client and
//! from stock tools (`openssl s_client`, `curl`), hostile clients that must
//! not stall anyone, and the start-up refusals.
//!
//! Each test makes its own self-signed certificate for `localhost` and
//! 127.0.0.1, and its clients trust that certificate only.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, finish_piped, spawn_piped};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Longest any reply may take before a test fails rather than hangs.
const LIMIT: Duration = Duration::from_secs(10);

/// The server's handshake time limit (`delayq::tls::HANDSHAKE_TIMEOUT`).
const HANDSHAKE: Duration = delayq::tls::HANDSHAKE_TIMEOUT;

/// A self-signed certificate and its key, in PEM files in a directory of
/// their own.
struct Cert {
    dir: tempfile::TempDir,
    der: CertificateDer<'static>,
}

impl Cert {
    fn new() -> Cert {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("a self-signed certificate");
        let dir = tempfile::tempdir().expect("a directory for the certificate");
        std::fs::write(dir.path().join("cert.pem"), made.cert.pem()).expect("write cert.pem");
        std::fs::write(dir.path().join("key.pem"), made.signing_key.serialize_pem())
            .expect("write key.pem");
        Cert {
            der: made.cert.der().clone(),
            dir,
        }
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("key.pem")
    }

    /// The server's TLS flags for this certificate.
    fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            path(&self.cert()),
            "--tls-key".into(),
            path(&self.key()),
        ]
    }

    /// A client that trusts this certificate only, offering `alpn`.
    fn connector(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone()).expect("trust the certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

fn path(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

/// A running TLS server: the text port, and the HTTP port if asked for.
struct Server {
    daemon: Daemon,
    http: Option<SocketAddr>,
}

/// Starts delayq with TLS on `cert` and the `extra` flags, and waits for
/// the HTTP port too if `http`.
async fn start(cert: &Cert, extra: &[&str], http: bool) -> Server {
    let mut args = cert.flags();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = if http {
        Daemon::start_with_http(&args).await
    } else {
        Daemon::start(&args).await
    };
    let http = daemon.http;
    Server { daemon, http }
}

/// A text-protocol client over TLS.
struct Client {
    stream: BufReader<TlsStream<TcpStream>>,
}

impl Client {
    async fn connect(cert: &Cert, addr: SocketAddr) -> Client {
        Client {
            stream: BufReader::new(tls_connect(cert, addr, &[]).await),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        let s = self.stream.get_mut();
        s.write_all(bytes).await.expect("write");
        s.flush().await.expect("flush");
    }

    async fn line(&mut self) -> String {
        let mut buf = String::new();
        let n = tokio::time::timeout(LIMIT, self.stream.read_line(&mut buf))
            .await
            .expect("a reply in time")
            .expect("read");
        assert!(n > 0, "connection closed while waiting for a reply");
        buf.strip_suffix("\r\n")
            .unwrap_or_else(|| panic!("not CRLF-terminated: {buf:?}"))
            .to_string()
    }

    async fn cmd(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n").as_bytes()).await;
        self.line().await
    }

    /// A command answered `OK <bytes>` and a YAML document: the document.
    async fn document(&mut self, line: &str) -> String {
        let reply = self.cmd(line).await;
        let len: usize = reply
            .strip_prefix("OK ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}: {reply}"));
        let mut body = vec![0; len + 2];
        self.stream
            .read_exact(&mut body)
            .await
            .expect("the document");
        String::from_utf8_lossy(&body).into_owned()
    }

    async fn put(&mut self, body: &str) -> String {
        self.send(format!("put 0 0 60 {}\r\n{body}\r\n", body.len()).as_bytes())
            .await;
        self.line().await
    }
}

async fn tls_connect(cert: &Cert, addr: SocketAddr, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("a server name");
    tokio::time::timeout(LIMIT, cert.connector(alpn).connect(name, tcp))
        .await
        .expect("a handshake in time")
        .expect("the TLS handshake")
}

/// Everything `stream` sends until it ends (or fails: a TLS peer may close
/// without a close_notify), within `limit`.
async fn read_to_end(stream: &mut (impl AsyncRead + Unpin), limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the connection did not end within {limit:?} (got {got:?})"));
    got
}

/// The text protocol works over TLS: put, reserve, delete, and pipelined
/// commands answered in order.
async fn text_protocol_works_over_tls(engine: &[&str]) {
    let cert = Cert::new();
    let server = start(&cert, engine, false).await;
    let mut c = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(c.put("hello").await, "INSERTED 1");
    assert_eq!(c.cmd("reserve-with-timeout 0").await, "RESERVED 1 5");
    assert_eq!(c.line().await, "hello");
    assert_eq!(c.cmd("delete 1").await, "DELETED");
    assert_eq!(c.cmd("delete 1").await, "NOT_FOUND");
    // Pipelined: three puts, a use, a reserve and a bad command in one write.
    c.send(
        b"put 0 0 60 1\r\na\r\nput 0 0 60 2\r\nbb\r\nput 0 0 60 3\r\nccc\r\n\
          use other\r\nreserve\r\nbogus\r\nstats-job 3\r\n",
    )
    .await;
    for want in [
        "INSERTED 2",
        "INSERTED 3",
        "INSERTED 4",
        "USING other",
        "RESERVED 2 1",
        "a",
        "UNKNOWN_COMMAND",
    ] {
        assert_eq!(c.line().await, want);
    }
    assert!(c.line().await.starts_with("OK "), "stats-job answers OK");
    // Another client sees the same jobs.
    let mut other = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(other.cmd("peek-ready").await, "FOUND 3 2");
    assert_eq!(other.line().await, "bb");
    // `quit` ends the session with a close_notify: a clean end of input,
    // not rustls's "closed without close_notify" error.
    other.send(b"quit\r\n").await;
    let mut rest = Vec::new();
    let end = tokio::time::timeout(LIMIT, other.stream.read_to_end(&mut rest))
        .await
        .expect("the end in time");
    assert!(
        matches!(end, Ok(0)),
        "quit ended with {end:?} after {rest:?}"
    );
}

#[tokio::test]
async fn text_protocol_over_tls_in_memory() {
    text_protocol_works_over_tls(&["--in-memory"]).await;
}

#[tokio::test]
async fn text_protocol_over_tls_on_the_durable_engine() {
    let dir = tempfile::tempdir().expect("a data directory");
    text_protocol_works_over_tls(&["-b", &path(dir.path())]).await;
}

/// A blocked `reserve` over TLS is served when another client puts, and
/// sees its client hang up (the job comes back).
#[tokio::test]
async fn blocked_reserve_over_tls_is_served_and_sees_a_hang_up() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], false).await;
    let mut worker = Client::connect(&cert, server.daemon.addr).await;
    worker.send(b"reserve\r\n").await;
    let mut producer = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(producer.put("job").await, "INSERTED 1");
    assert_eq!(worker.line().await, "RESERVED 1 3");
    assert_eq!(worker.line().await, "job");
    // Blocked again, with a command pipelined behind the reserve.
    worker
        .send(b"reserve-with-timeout 1\r\nlist-tube-used\r\n")
        .await;
    assert_eq!(worker.line().await, "TIMED_OUT");
    assert_eq!(worker.line().await, "USING default");
    worker.send(b"reserve\r\n").await;
    drop(worker);
    // The hang-up releases job 1: it is ready again for someone else.
    let start = Instant::now();
    loop {
        if producer
            .document("stats-job 1")
            .await
            .contains("state: ready")
        {
            break;
        }
        assert!(start.elapsed() < LIMIT, "the job never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker blocked in `reserve` over TLS that pipelined more than the
/// server reads ahead while it waits (64 KiB) and left is let go: the
/// hang-up, behind input the server does not read, is watched for on the
/// socket under the TLS session.
#[tokio::test]
async fn a_worker_that_pipelined_past_the_read_ahead_over_tls_and_left_is_let_go() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], false).await;
    let mut worker = Client::connect(&cert, server.daemon.addr).await;
    worker.send(b"reserve\r\n").await;
    let mut producer = Client::connect(&cert, server.daemon.addr).await;
    let start_wait = Instant::now();
    while !producer
        .document("stats")
        .await
        .contains("current-waiting: 1\n")
    {
        assert!(start_wait.elapsed() < LIMIT, "the worker never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 160,000 bytes: past the read-ahead, and within the socket buffers.
    worker.send(&b"list-tube-used\r\n".repeat(10_000)).await;
    // A shutdown sends the FIN whoever else holds the socket.
    let tcp = worker.stream.into_inner().into_inner().0;
    tcp.into_std()
        .expect("into_std")
        .shutdown(std::net::Shutdown::Both)
        .expect("shutdown");
    let gone = Instant::now();
    loop {
        let now = producer.document("stats").await;
        if now.contains("current-waiting: 0\n") && now.contains("current-connections: 1\n") {
            break;
        }
        assert!(
            gone.elapsed() < LIMIT,
            "the departed worker is still held:\n{now}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The HTTP API over TLS, from our own client: ALPN picks HTTP/1.1 and a
/// put answers 201.
#[tokio::test]
async fn http_api_over_tls_negotiates_http_1_1() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], true).await;
    let http = server.http.expect("HTTP");
    let mut s = tls_connect(&cert, http, &[b"h2", b"http/1.1"]).await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let body = br#"{"body":"hello"}"#;
    let request = format!(
        "POST /v1/tubes/t/jobs HTTP/1.1\r\nhost: localhost\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(request.as_bytes()).await.expect("write");
    s.write_all(body).await.expect("write");
    s.flush().await.expect("flush");
    let response = String::from_utf8(read_to_end(&mut s, LIMIT).await).expect("UTF-8");
    assert!(
        response.starts_with("HTTP/1.1 201"),
        "not created: {response}"
    );
    assert!(response.contains(r#""id":"1""#), "{response}");
    // The text protocol, over TLS too, sees the job.
    let mut c = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(c.cmd("use t").await, "USING t");
    assert_eq!(c.cmd("peek-ready").await, "FOUND 1 5");
}

/// Stock clients: `openssl s_client` speaks the text protocol, `curl`
/// the HTTP API, each verifying the server against the certificate. The
/// tools must be installed: a missing one fails the test.
#[tokio::test]
async fn stock_clients_openssl_and_curl() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], true).await;
    let port = server.daemon.addr.port();
    let mut openssl = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error"])
        .args(["-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-CAfile", &path(&cert.cert())])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl must be installed (Debian package openssl)");
    // `quit` makes the server close, which ends s_client (-quiet ignores
    // the end of its input).
    openssl
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"put 0 0 60 5\r\nhello\r\nreserve\r\ndelete 1\r\nquit\r\n")
        .expect("write to openssl");
    let out = tokio::task::spawn_blocking(move || finish_output(openssl))
        .await
        .expect("openssl ran");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text,
        "INSERTED 1\r\nRESERVED 1 5\r\nhello\r\nDELETED\r\n",
        "openssl s_client: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // It verified the certificate, and the server's close_notify ended the
    // session cleanly (without one s_client reports "unexpected eof").
    assert!(
        out.status.success(),
        "openssl s_client: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let http = server.http.expect("HTTP");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert", &path(&cert.cert())])
        .args(["-w", "\n%{http_code} %{http_version}", "-X", "POST"])
        .args(["-H", "content-type: application/json"])
        .args(["-d", r#"{"body":"from curl"}"#])
        .arg(format!("https://localhost:{}/v1/tubes/c/jobs", http.port()))
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", http.port())])
        .output()
        .expect("curl must be installed (Debian package curl)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.ends_with("\n201 1.1"),
        "curl: {:?} {text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(r#""id":"2""#), "{text}");
    // Plain http:// to the TLS port is not served.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{}/v1/stats", http.port()))
        .output()
        .expect("curl");
    assert!(
        !out.status.success(),
        "plain HTTP was served over the TLS port"
    );
}

/// Waits for a child with piped output to end, within [`LIMIT`].
fn finish_output(child: std::process::Child) -> std::process::Output {
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(out) => out.expect("the child's output"),
        Err(_) => {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(libc::pid_t::try_from(id).expect("pid"), libc::SIGKILL) };
            panic!("the child did not end within {LIMIT:?}");
        }
    }
}

/// A plaintext client on either TLS port is disconnected at once, without
/// being served; the server goes on serving TLS clients.
#[tokio::test]
async fn plaintext_on_a_tls_port_is_disconnected() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], true).await;
    let mut plain = TcpStream::connect(server.daemon.addr)
        .await
        .expect("connect");
    plain
        .write_all(b"put 0 0 60 5\r\nhello\r\n")
        .await
        .expect("write");
    // Well within the handshake timeout: the bytes are not TLS.
    let got = read_to_end(&mut plain, HANDSHAKE / 2).await;
    assert!(
        !String::from_utf8_lossy(&got).contains("INSERTED"),
        "plaintext served: {got:?}"
    );
    let mut plain = TcpStream::connect(server.http.expect("HTTP"))
        .await
        .expect("connect");
    plain
        .write_all(b"GET /v1/stats HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let got = read_to_end(&mut plain, HANDSHAKE / 2).await;
    assert!(
        !String::from_utf8_lossy(&got).contains("HTTP/1.1 200"),
        "plaintext HTTP served: {got:?}"
    );
    let mut c = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(c.put("after").await, "INSERTED 1");
    // And no job came in through the plaintext put.
    assert_eq!(c.cmd("peek-ready").await, "FOUND 1 5");
}

/// A client that connects and never shakes hands is dropped once the
/// handshake timeout is up, and meanwhile stalls no one: other clients
/// (text and HTTP) connect and are served.
#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], true).await;
    let began = Instant::now();
    let mut silent = TcpStream::connect(server.daemon.addr)
        .await
        .expect("connect");
    // Half a ClientHello record header: a handshake begun and not finished.
    let mut stalled = TcpStream::connect(server.http.expect("HTTP"))
        .await
        .expect("connect");
    stalled.write_all(&[0x16, 0x03, 0x01]).await.expect("write");
    let mut c = Client::connect(&cert, server.daemon.addr).await;
    assert_eq!(c.put("meanwhile").await, "INSERTED 1");
    assert_eq!(c.cmd("reserve").await, "RESERVED 1 9");
    assert_eq!(c.line().await, "meanwhile");
    let mut h = tls_connect(&cert, server.http.expect("HTTP"), &[b"http/1.1"]).await;
    h.write_all(b"GET /v1/stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let response = read_to_end(&mut h, LIMIT).await;
    assert!(response.starts_with(b"HTTP/1.1 200"), "{response:?}");
    assert!(
        began.elapsed() < HANDSHAKE / 2,
        "others were not served while the silent clients waited"
    );
    let got = read_to_end(&mut silent, HANDSHAKE + LIMIT).await;
    let waited = began.elapsed();
    assert!(got.is_empty(), "the silent client was sent {got:?}");
    assert!(
        waited >= HANDSHAKE - Duration::from_millis(500),
        "dropped after {waited:?}, before the handshake timeout"
    );
    assert!(
        waited < HANDSHAKE + Duration::from_secs(3),
        "dropped only after {waited:?}"
    );
    // The stalled one went at the same time.
    let got = read_to_end(&mut stalled, Duration::from_secs(2)).await;
    assert!(!got.starts_with(b"HTTP"), "{got:?}");
    // The TLS client is still served.
    assert_eq!(c.cmd("delete 1").await, "DELETED");
}

/// Over TLS a connection over `--max-connections` is closed without a
/// word (a plaintext refusal would garble the handshake), on the text port
/// and the HTTP port alike; the ones in are unaffected.
#[tokio::test]
async fn over_the_limit_a_tls_client_is_closed() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory", "--max-connections", "1"], true).await;
    let http = server.http.expect("HTTP");
    let mut first = Client {
        stream: BufReader::new(let_in(&cert, server.daemon.addr, &[]).await),
    };
    assert_eq!(first.put("x").await, "INSERTED 1");
    let mut held = let_in(&cert, http, &[b"http/1.1"]).await;
    for addr in [server.daemon.addr, http] {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::try_from("localhost").expect("a server name");
        let refused = tokio::time::timeout(LIMIT, cert.connector(&[]).connect(name, tcp))
            .await
            .expect("the refusal in time");
        assert!(refused.is_err(), "{addr}: a second connection was let in");
        // Not even a plaintext refusal: the connection just ends.
        let mut raw = TcpStream::connect(addr).await.expect("connect");
        let got = read_to_end(&mut raw, LIMIT).await;
        assert!(
            got.is_empty(),
            "{addr}: a refused TLS client was sent {got:?}"
        );
    }
    assert_eq!(first.cmd("peek-ready").await, "FOUND 1 1");
    held.write_all(b"GET /v1/stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let response = read_to_end(&mut held, LIMIT).await;
    assert!(response.starts_with(b"HTTP/1.1 200"), "{response:?}");
}

/// A TLS session with `addr`, retried while the one place under a limit
/// of 1 is still held by the start-up probe's connection.
async fn let_in(cert: &Cert, addr: SocketAddr, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let began = Instant::now();
    loop {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::try_from("localhost").expect("a server name");
        let connect = cert.connector(alpn).connect(name, tcp);
        if let Ok(Ok(s)) = tokio::time::timeout(LIMIT, connect).await {
            return s;
        }
        assert!(began.elapsed() < LIMIT, "{addr}: never let in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start-up refusals: each names the file at fault and exits with 2,
/// before listening.
#[test]
fn bad_certificate_files_stop_the_start_with_exit_code_2() {
    let cert = Cert::new();
    let other = Cert::new();
    let missing = cert.dir.path().join("no-such-cert.pem");
    let empty = cert.dir.path().join("empty.pem");
    std::fs::File::create(&empty)
        .and_then(|mut f| f.write_all(b"not a certificate\n"))
        .expect("write empty.pem");
    let cases = [
        (missing.clone(), cert.key(), path(&missing)),
        (empty.clone(), cert.key(), path(&empty)),
        (cert.cert(), empty.clone(), path(&empty)),
        (cert.cert(), other.key(), "does not belong".to_string()),
    ];
    for (c, k, says) in cases {
        // Port 0: a port picked free beforehand may be another test's by
        // the time this server listens, and the start fail on that.
        let out = finish_piped(spawn_piped(&[
            "--in-memory",
            "-p",
            "0",
            "--tls-cert",
            &path(&c),
            "--tls-key",
            &path(&k),
        ]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{c:?} {k:?}: {err}");
        assert!(err.contains(&says), "{c:?} {k:?}: no {says:?} in: {err}");
        assert!(!err.contains("listening"), "{err}");
    }
}

/// One of the two flags alone is a usage error, caught by the flag parser.
#[test]
fn a_certificate_without_a_key_is_a_usage_error() {
    let cert = Cert::new();
    for (flag, file, needs) in [
        ("--tls-cert", cert.cert(), "--tls-key"),
        ("--tls-key", cert.key(), "--tls-cert"),
    ] {
        let out = finish_piped(spawn_piped(&["--in-memory", flag, &path(&file)]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains("required") && err.contains(needs) && err.contains("Usage"),
            "{flag}: {err}"
        );
    }
}

#[tokio::test]
async fn the_admin_cli_connects_over_tls_with_tls_ca() {
    let cert = Cert::new();
    let server = start(&cert, &["--in-memory"], false).await;
    let at = format!("localhost:{}", server.daemon.addr.port());
    let ca = path(&cert.cert());
    let ran = finish_piped(spawn_piped(&["stats", "--server", &at, "--tls-ca", &ca]));
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(String::from_utf8_lossy(&ran.stdout).contains("current-connections:"));
    // Without it the CLI speaks plaintext, which the TLS port refuses.
    let ran = finish_piped(spawn_piped(&["stats", "--server", &at]));
    assert_eq!(ran.status.code(), Some(3));
    // A certificate it does not trust is refused by the CLI.
    let other = Cert::new();
    let ran = finish_piped(spawn_piped(&[
        "stats",
        "--server",
        &at,
        "--tls-ca",
        &path(&other.cert()),
    ]));
    assert_eq!(ran.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(stderr.contains("TLS"), "{stderr}");
}
