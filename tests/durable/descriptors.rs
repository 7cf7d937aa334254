//! Clients cannot take the descriptors the log needs. A server holding as
//! many clients as its open-file limit allows (text connections, HTTP
//! long-polls, and the extra descriptor each blocked reserve watches its
//! client's hang-up with) once had none left to begin its next log file:
//! the log failed, and every change after it was refused until a restart.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::daemon::Daemon;
use crate::reserve_all;

/// The server's open-file limit in this test: small enough for a test to
/// reach, large enough for its own files.
const FILES: u64 = 300;

/// Opens `n` connections to `port` and sends each `greeting`; returns those
/// that connected (the server refuses some: that is what is tried).
async fn crowd(port: u16, n: usize, greeting: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = s.write_all(greeting).await;
            held.push(s);
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_using_every_descriptor_leave_the_log_its_files() {
    // This process holds its side of every connection too.
    delayq::server::raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    // Small log files, so the puts below begin several.
    let mut daemon = Daemon::durable_with_open_files(dir.path(), &["-s", "65536"], FILES).await;
    let http_port = daemon.http.expect("an HTTP listener").port();
    let mut producer = daemon.client().await;
    assert_eq!(producer.cmd("use work").await, "USING work");

    // Text connections blocked in reserve with more pipelined behind them
    // than the server reads ahead: each is watched for its hang-up through
    // a descriptor of its own.
    let mut greeting = b"reserve\r\n".to_vec();
    greeting.extend(std::iter::repeat_n(b'x', 70_000));
    let mut held = crowd(daemon.addr.port(), 150, &greeting).await;
    // HTTP long-polls, also watched for their clients' hang-ups.
    let poll = b"POST /v1/tubes/idle/reserve?timeout=60 HTTP/1.1\r\n\
                 Host: delayq\r\nContent-Length: 0\r\n\r\n";
    held.extend(crowd(http_port, 150, poll).await);
    // Until the server has taken (or refused) all it can: a refused text
    // connection is told so.
    let mut extra = daemon.client().await;
    assert_eq!(
        extra.line().await,
        "TOO_MANY_CONNECTIONS",
        "the crowd was meant to use up what clients may hold"
    );
    // The connections before it are all taken; their watches are made once
    // the input ahead of each is read, a moment later.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Enough 2,000-byte jobs to begin about ten log files.
    let body = vec![b'j'; 2_000];
    for n in 0..300 {
        let reply = producer.put(0, 0, 60, &body).await;
        assert!(
            reply.starts_with("INSERTED "),
            "put {n} with the clients' descriptors all in use: {reply}"
        );
    }
    drop(held);
    drop(extra);

    daemon.kill();
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    c.cmd("watch work").await;
    assert_eq!(reserve_all(&mut c).await.len(), 300);
}
