//! More connections than the server allows are refused politely, and ten
//! thousand at once are all held and served.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delayq::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::common::{Backend, Client, TestServer, Yaml};

backend_tests!(
    beyond_max_connections_a_client_is_refused_politely,
    connections_and_hang_up_watches_share_one_budget_of_descriptors,
    ten_thousand_connections_at_once,
    a_connection_watching_many_tubes_closes_without_holding_up_others,
);

/// One connection watches 40,000 tubes (and ignores some), then closes:
/// letting go of its tubes took time growing with the square of their
/// number (a tube's removal shifted every later one; 60,000 stopped the
/// memory-only server for 42 s), and the real binary's one runtime thread
/// answered nobody meanwhile. Another connection must be answered at once.
async fn a_connection_watching_many_tubes_closes_without_holding_up_others(backend: Backend) {
    // 40,000 where the slowness was (the embedded engines' state); on
    // Redis, where each watch and each letting go is a call of its own,
    // fewer.
    let n = match backend {
        Backend::Memory | Backend::Durable => 40_000,
        Backend::Redis | Backend::Cluster => 5_000,
    };
    let (daemon, redis) = crate::daemon_on(backend).await;
    let mut many = daemon.client().await;
    let mut other = daemon.client().await;
    let watches: String = (0..n).map(|k| format!("watch w{k}\r\n")).collect();
    let started = Instant::now();
    many.send(watches.as_bytes()).await;
    for k in 0..n {
        assert_eq!(many.line().await, format!("WATCHING {}", k + 2));
    }
    let watching = started.elapsed();
    // Ignored tubes leave their place to the last one, as in beanstalkd.
    assert_eq!(many.cmd("ignore w0").await, format!("WATCHING {n}"));
    let listed = many.yaml("list-tubes-watched").await;
    let order = &listed.items;
    assert_eq!(order.len(), n);
    assert_eq!(
        (&*order[0], &*order[1], &*order[2], &*order[n - 1]),
        (
            "default",
            &*format!("w{}", n - 1),
            "w1",
            &*format!("w{}", n - 2)
        )
    );
    drop(many);
    // Whatever the closing connection is doing, this one is answered.
    let closed = Instant::now();
    let mut slowest = Duration::ZERO;
    while closed.elapsed() < Duration::from_secs(1) {
        let asked = Instant::now();
        stats_patiently(&mut other).await;
        slowest = slowest.max(asked.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(2),
        "a closing connection held the server up: a stats took {slowest:?}"
    );
    if redis.is_some() || backend == Backend::Cluster {
        // On Redis each tube is let go of by a call of its own, which
        // takes a while for thousands, but holds up nobody (above).
        return;
    }
    let tubes = loop {
        let stats = stats_patiently(&mut other).await;
        if stats.num("current-connections") == 1 {
            break stats.num("current-tubes");
        }
        assert!(
            closed.elapsed() < Duration::from_secs(5),
            "the closed connection's tubes still held after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(tubes, 1, "only default is left");
    println!(
        "{n} watches in {watching:?}; let go of in {:?}",
        closed.elapsed()
    );
}

async fn beyond_max_connections_a_client_is_refused_politely(backend: Backend) {
    let limit = 10;
    let config = Config {
        max_connections: limit,
        ..Config::default()
    };
    let server = TestServer::start_with(backend, config).await;
    let mut held = Vec::new();
    for _ in 0..limit {
        let mut c = server.client().await;
        c.ping().await;
        held.push(c);
    }
    // One over: told why, then closed, whatever it sends.
    let mut extra = server.client().await;
    assert_eq!(extra.line().await, "TOO_MANY_CONNECTIONS");
    assert_eq!(extra.expect_closed().await, b"");
    let mut extra = server.client().await;
    extra.send(b"put 0 0 60 1\r\nx\r\n").await;
    assert_eq!(extra.line().await, "TOO_MANY_CONNECTIONS");
    extra.expect_closed().await;

    // The ones held are unaffected.
    for c in &mut held {
        c.ping().await;
    }
    // One leaves: its place is free again (once the server has noticed).
    drop(held.pop());
    crate::eventually(
        "a freed slot is offered again",
        Duration::from_secs(5),
        async || {
            let mut c = server.client().await;
            c.send_line("list-tube-used").await;
            match c.line().await.as_str() {
                "USING default" => {
                    held.push(c);
                    true
                }
                "TOO_MANY_CONNECTIONS" => false,
                other => panic!("unexpected reply {other:?}"),
            }
        },
    )
    .await;
    assert_eq!(held.len(), limit);
    let mut extra = server.client().await;
    assert_eq!(extra.line().await, "TOO_MANY_CONNECTIONS");
    let stats = held[0].stats().await;
    assert_eq!(stats.num("current-connections"), limit as u64);
}

/// Text connections, HTTP connections and the hang-up watches of a
/// blocked reserve and a long-poll (a second descriptor each) draw on one
/// budget of descriptors, whatever `--max-connections` allows: unbounded,
/// they once used up the descriptors delayq needs for its own files.
async fn connections_and_hang_up_watches_share_one_budget_of_descriptors(backend: Backend) {
    let config = Config {
        max_connections: 100,
        client_files: 5,
        ..Config::default()
    };
    let server = TestServer::start_full(backend, config, true).await;
    let http = server.http.expect("an HTTP port");
    // Opened first, so that watching the others takes no descriptor they
    // could want. One.
    let mut observer = server.client().await;
    // A reserve with more pipelined behind it than the server reads ahead:
    // watched for its hang-up through a descriptor of its own. Three.
    let mut blocked = server.client().await;
    let mut greeting = b"reserve\r\n".to_vec();
    greeting.extend(std::iter::repeat_n(b'x', 70_000));
    blocked.send(&greeting).await;
    // A long-poll, watched the same way. Five.
    let mut poll = TcpStream::connect(http).await.expect("connect to HTTP");
    poll.write_all(
        b"POST /v1/tubes/idle/reserve?timeout=60 HTTP/1.1\r\n\
          Host: delayq\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .expect("send a long-poll");
    observer.wait_stat("current-waiting", 2).await;
    // A watch that finds the budget used up is not made (the hang-up is
    // then seen once the input before it is read): no other connection
    // may come before both are, and each is made just after its reserve
    // blocks, once the input ahead is read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut late = server.client().await;
    late.send_line("list-tube-used").await;
    assert_eq!(late.line().await, "TOO_MANY_CONNECTIONS");
    // Over HTTP too, though far below --max-connections there.
    let mut late = TcpStream::connect(http).await.expect("connect to HTTP");
    late.write_all(b"GET /v1/stats HTTP/1.1\r\nHost: delayq\r\n\r\n")
        .await
        .expect("send a request");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), late.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("TOO_MANY_CONNECTIONS"),
        "{answer}"
    );
    // The blocked client leaves: its connection and its watch are given
    // back, and two new connections are served.
    drop(blocked);
    crate::eventually(
        "the departed client's descriptors given back",
        Duration::from_secs(5),
        async || {
            let mut two = [server.client().await, server.client().await];
            let mut served = true;
            for c in &mut two {
                c.send_line("list-tube-used").await;
                match c.line().await.as_str() {
                    "USING default" => {}
                    "TOO_MANY_CONNECTIONS" => served = false,
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            served
        },
    )
    .await;
    drop((observer, poll));
}

/// `stats`, asked again while it is answered `INTERNAL_ERROR`: on Redis,
/// a machine loaded enough can hold it behind ten thousand connections'
/// first commands for longer than a command may take (2 s).
async fn stats_patiently(c: &mut Client) -> Yaml {
    loop {
        let line = c.cmd("stats").await;
        if line == "INTERNAL_ERROR" {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        return c.yaml_after(&line).await;
    }
}

/// Ten thousand connections, each blocked in `reserve-with-timeout`, on the
/// real binary with its default limit; then a thousand jobs, each delivered
/// to exactly one of them.
async fn ten_thousand_connections_at_once(backend: Backend) {
    // One backend at a time: both at once would need twice the descriptors.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let fds = delayq::server::raise_fd_limit();
    // The test holds its end of every connection; leave room for the rest.
    let n = 10_000.min(fds.saturating_sub(200));
    if n < 10_000 {
        println!("open-file limit {fds}: trying {n} connections, not 10,000");
    }
    let jobs = 1_000.min(n);
    let redis = (backend == Backend::Redis).then(|| RedisServer::start(&[]));
    let daemon = match &redis {
        Some(r) => Daemon::redis(&r.url).await,
        // The memory-only engine must be asked for: the default is durable.
        None if backend == Backend::Memory => Daemon::start(&["--in-memory"]).await,
        None => Daemon::start(&[]).await,
    };
    let rss_before = crate::rss_bytes(daemon.child.id());

    let delivered = Arc::new(AtomicU64::new(0));
    let timed_out = Arc::new(AtomicU64::new(0));
    let connected = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    // Why workers failed. A worker that fails says why here and ends,
    // rather than panicking: the test then fails with that reason, instead
    // of it being lost among thousands of panics of workers whose server
    // went when the test failed.
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Connections the server has yet to answer, at most: far fewer than
    // the kernel queues for accepting (somaxconn, 4096 here). Ten thousand
    // at once overflowed that queue whenever other tests kept the server
    // from accepting quickly (the kernel counted hundreds of overflows in
    // one run of this suite), and now and then a client whose handshake
    // was dropped there was reset or closed, which no server can prevent.
    let connecting = Arc::new(tokio::sync::Semaphore::new(512));
    let start = Instant::now();
    let mut workers = Vec::with_capacity(n);
    for _ in 0..n {
        let delivered = delivered.clone();
        let timed_out = timed_out.clone();
        let connected = connected.clone();
        let retried = retried.clone();
        let connecting = connecting.clone();
        let failures = failures.clone();
        let addr = daemon.addr;
        workers.push(tokio::spawn(async move {
            let turn = connecting.acquire_owned().await.expect("never closed");
            let worked = async {
                let mut s = TcpStream::connect(addr).await?;
                connected.fetch_add(1, Ordering::SeqCst);
                // Answered, so accepted.
                s.write_all(b"list-tube-used\r\n").await?;
                let mut using = [0u8; 15];
                s.read_exact(&mut using).await?;
                if &using != b"USING default\r\n" {
                    return Err(format!("answered {:?}", String::from_utf8_lossy(&using)).into());
                }
                drop(turn);
                let reserve = b"reserve-with-timeout 120\r\n";
                s.write_all(reserve).await?;
                // Whatever comes first is the whole answer: a job of
                // `RESERVED <id> 1\r\nj\r\n` or `TIMED_OUT\r\n`. On Redis, a
                // reserve whose look at the store takes longer than a
                // command may (2 s) is answered `INTERNAL_ERROR`. Ten
                // thousand connections opening at once used to queue twenty
                // thousand count changes ahead of their looks, and
                // thousands were so answered; now each change joins the
                // operation of its tube still queued and none were in the
                // runs tried, but a machine loaded enough can still take
                // 2 s over one. Like any client, this one asks again.
                let mut got = Vec::new();
                let mut buf = [0u8; 64];
                while !(got.ends_with(b"\r\nj\r\n") || got == b"TIMED_OUT\r\n") {
                    let k = s.read(&mut buf).await?;
                    if k == 0 {
                        let got = String::from_utf8_lossy(&got);
                        return Err(format!("closed after {got:?}").into());
                    }
                    got.extend_from_slice(&buf[..k]);
                    if got == b"INTERNAL_ERROR\r\n" {
                        retried.fetch_add(1, Ordering::SeqCst);
                        got.clear();
                        s.write_all(reserve).await?;
                    }
                }
                if got.starts_with(b"RESERVED ") {
                    delivered.fetch_add(1, Ordering::SeqCst);
                } else {
                    timed_out.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(s)
            };
            match worked.await {
                Ok(s) => Some(s),
                Err(e) => {
                    failures.lock().expect("not poisoned").push(e.to_string());
                    None
                }
            }
        }));
    }
    let no_failures = || {
        // Read, then let go before failing, so no worker finds the lock
        // poisoned.
        let (count, first) = {
            let failures = failures.lock().expect("not poisoned");
            (failures.len(), failures.first().cloned())
        };
        if let Some(first) = first {
            panic!("{count} of the {n} workers failed, the first because: {first}");
        }
    };
    let mut c = daemon.client().await;
    // Counted by hand rather than with `eventually`, so that a failure says
    // where it stood.
    let (limit, asking) = (Duration::from_secs(60), Instant::now());
    loop {
        no_failures();
        let stats = stats_patiently(&mut c).await;
        let (connections, waiting) = (
            stats.num("current-connections"),
            stats.num("current-waiting"),
        );
        if waiting == n as u64 {
            break;
        }
        assert!(
            asking.elapsed() < limit,
            "every connection is blocked in reserve: not within {limit:?}; the server had \
             {connections} connections, {waiting} of them waiting, {} of the {n} clients \
             had connected, and their reserves had been answered INTERNAL_ERROR {} times",
            connected.load(Ordering::SeqCst),
            retried.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all_waiting = start.elapsed();
    let stats = c.stats().await;
    assert_eq!(stats.num("current-connections"), n as u64 + 1);
    let rss_waiting = crate::rss_bytes(daemon.child.id());

    let put_at = Instant::now();
    let mut batch = Vec::new();
    for _ in 0..jobs {
        batch.extend_from_slice(b"put 0 0 60 1\r\nj\r\n");
    }
    c.send(&batch).await;
    for _ in 0..jobs {
        assert!(c.line().await.starts_with("INSERTED "));
    }
    crate::eventually("every job delivered", Duration::from_secs(30), async || {
        no_failures();
        delivered.load(Ordering::SeqCst) == jobs as u64
    })
    .await;
    let deliver = put_at.elapsed();
    let stats = c.stats().await;
    assert_eq!(stats.num("current-jobs-ready"), 0);
    assert_eq!(stats.num("current-jobs-reserved"), jobs as u64);
    assert_eq!(stats.num("current-waiting"), (n - jobs) as u64);
    assert_eq!(timed_out.load(Ordering::SeqCst), 0);

    // A served worker counts its job a moment before its task ends.
    crate::eventually(
        "every served worker ends",
        Duration::from_secs(10),
        async || {
            no_failures();
            workers.iter().filter(|w| w.is_finished()).count() == jobs
        },
    )
    .await;
    no_failures();
    // Every connection goes: the server notices each one, and the jobs the
    // served ones held are ready again. The waiting ones go first, or they
    // would be handed the jobs the served ones give back.
    let (served, waiting): (Vec<_>, Vec<_>) = workers.into_iter().partition(|w| w.is_finished());
    for w in waiting {
        w.abort();
        match w.await {
            Err(e) if e.is_cancelled() => {}
            Err(e) => panic!("a waiting worker failed: {e}"),
            Ok(_) => panic!("a waiting worker ended after all jobs were served"),
        }
    }
    for w in served {
        drop(w.await.expect("worker").expect("served"));
    }
    crate::eventually(
        "the server lets go of closed connections",
        Duration::from_secs(30),
        async || c.stats().await.num("current-connections") == 1,
    )
    .await;
    let stats = c.stats().await;
    assert_eq!(stats.num("current-jobs-ready"), jobs as u64);
    let mut other = Client::connect(daemon.addr).await;
    other.ping().await;
    println!(
        "{backend:?}: {n} connections blocked in reserve after {all_waiting:.1?} \
         ({} reserves asked again after INTERNAL_ERROR), {} bytes of RSS each; {jobs} jobs \
         delivered {deliver:.1?} after the put began",
        retried.load(Ordering::SeqCst),
        (rss_waiting.saturating_sub(rss_before)) / n as u64
    );
}
