//! Clients that send command after command and never read a reply: the
//! server stops reading from them once their replies stop leaving, so what
//! it holds for them stays bounded, and everyone else is served on.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::Backend;
use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;

backend_tests!(clients_that_never_read_hold_bounded_memory);

/// Bytes of `peek` commands each client offers; what the server would owe
/// them if it went on answering is this over 8 times the body size.
const OFFERED: usize = 64 << 20;

/// A reply this large makes each answered command count.
const BODY: usize = 60_000;

/// No more than this much RSS may the server gain for all of them.
const BOUND: u64 = 64 << 20;

async fn clients_that_never_read_hold_bounded_memory(backend: Backend) {
    let clients = crate::scale(4, 20);
    let redis = (backend == Backend::Redis).then(|| RedisServer::start(&[]));
    let daemon = match &redis {
        Some(r) => Daemon::redis(&r.url).await,
        // The memory-only engine must be asked for: the default is durable.
        None if backend == Backend::Memory => Daemon::start(&["--in-memory"]).await,
        None => Daemon::start(&[]).await,
    };
    let mut c = daemon.client().await;
    let id = c.put_ok(0, 0, 60, &vec![b'b'; BODY]).await;
    // Warm up what answering a peek allocates, so it is not counted.
    for _ in 0..10 {
        assert_eq!(c.found(&format!("peek {id}")).await.body.len(), BODY);
    }
    let pid = daemon.child.id();
    let before = crate::rss_bytes(pid);

    let peek = format!("peek {id}\r\n");
    let chunk = peek.repeat((64 << 10) / peek.len());
    let mut hogs = Vec::new();
    for _ in 0..clients {
        let addr = daemon.addr;
        let chunk = chunk.clone();
        hogs.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let mut sent = 0;
            // Once nothing more goes in for a while, the server (and the
            // kernel buffers between us) have stopped taking commands.
            while sent < OFFERED {
                let write = s.write_all(chunk.as_bytes());
                match tokio::time::timeout(Duration::from_secs(1), write).await {
                    Ok(r) => r.expect("write"),
                    Err(_) => break,
                }
                sent += chunk.len();
            }
            (s, sent)
        }));
    }
    let mut accepted = Vec::new();
    let mut streams = Vec::new();
    for h in hogs {
        let (s, sent) = h.await.expect("hog");
        accepted.push(sent);
        streams.push(s);
    }
    for &sent in &accepted {
        assert!(
            sent < OFFERED,
            "the server took all {sent} bytes of commands whose replies nobody read"
        );
    }
    let during = crate::rss_bytes(pid);

    // Everyone else is served meanwhile.
    let mut other = daemon.client().await;
    let start = Instant::now();
    for _ in 0..100 {
        let id = other.put_ok(0, 0, 60, b"x").await;
        assert_eq!(other.cmd(&format!("delete {id}")).await, "DELETED");
    }
    let served = start.elapsed();
    let grown = during.saturating_sub(before);
    assert!(
        grown < BOUND,
        "the server grew by {grown} bytes for {clients} clients that never read"
    );

    // Once they go, the server lets go of them.
    drop(streams);
    crate::eventually(
        "the server lets go of the clients",
        Duration::from_secs(10),
        async || c.stats().await.num("current-connections") == 2,
    )
    .await;
    let after = crate::rss_bytes(pid);
    println!(
        "{backend:?}: {clients} clients offered {} MB of peeks each and never read; \
         the server took at most {:.1} MB of them (kernel buffers included) and grew \
         {:.1} MB (to {:.1} MB; {:.1} MB once they left); 100 cycles on another \
         connection took {served:.1?}",
        OFFERED >> 20,
        *accepted.iter().max().expect("a client") as f64 / 1e6,
        grown as f64 / 1e6,
        during as f64 / 1e6,
        after as f64 / 1e6,
    );
}
