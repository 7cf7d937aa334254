//! Faults under the Redis engine, with real processes and a real
//! redis-server: delayq processes killed with SIGKILL mid-work and restarted,
//! several processes whose timers race, redis-server killed and restarted on
//! its own data, and a Redis that is full.
//!
//! The multi-process tests keep a [`Ledger`] of every put (acknowledged with
//! `INSERTED`, or in doubt because its connection died before the reply),
//! every delivery and every `DELETED`, and check the delivery guarantees
//! against it at the end.

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use delayq::config::Config;
use delayq::server::{Control, run};
use delayq::store::redis::RedisStore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use common::daemon::Daemon;
use common::redis::RedisServer;
use common::{Client, REPLY_TIMEOUT};

/// Longest any single reply may take in the multi-process tests (a blocked
/// `reserve-with-timeout 1` included) before the test fails instead of hanging.
const LINE_LIMIT: Duration = Duration::from_secs(10);

/// Longest a test waits for its workers to drain everything.
const DRAIN_LIMIT: Duration = Duration::from_secs(20);

/// Clock slack when comparing our instants with times Redis's clock set
/// (Redis works in whole milliseconds).
const SLACK: Duration = Duration::from_millis(20);

/// How long after its TTR a job held by a killed process may take to reach
/// a worker again.
const ORPHAN_SLACK: Duration = Duration::from_secs(6);

// ---------------------------------------------------------------------------
// Processes

/// A delayq server inside the test process, on the Redis at `url`, for tests
/// that kill Redis rather than delayq. Stops when dropped.
struct InProcess {
    addr: SocketAddr,
    control: Control,
    _task: JoinHandle<()>,
}

impl InProcess {
    async fn start(url: &str) -> InProcess {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let store = RedisStore::connect(url, "delayq:")
            .await
            .expect("connect to the test's redis-server");
        let control = Control::default();
        let task = tokio::spawn(run(listener, store, Config::default(), control.clone()));
        InProcess {
            addr,
            control,
            _task: task,
        }
    }

    async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.control.shutdown.cancel();
    }
}

/// Where a role finds its delayq process: the address changes when the
/// process is killed and restarted, and becomes `None` when it is killed for
/// good.
type Endpoint = watch::Receiver<Option<SocketAddr>>;

/// Waits until the endpoint changes (the process was restarted or is gone).
async fn next_endpoint(endpoint: &mut Endpoint, who: &str) {
    match tokio::time::timeout(Duration::from_secs(15), endpoint.changed()).await {
        Ok(_) => {}
        Err(_) => panic!("{who}: lost its connection but no process replaced it"),
    }
}

// ---------------------------------------------------------------------------
// A client that expects its server to die

/// The connection ended under us: the process was killed.
#[derive(Debug)]
struct Gone;

type Io<T> = Result<T, Gone>;

/// A protocol connection on which EOF and resets are results, not panics.
struct Conn {
    stream: BufReader<TcpStream>,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> Io<Conn> {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect within the timeout")
            .map_err(|_| Gone)?;
        stream.set_nodelay(true).map_err(|_| Gone)?;
        Ok(Conn {
            stream: BufReader::new(stream),
        })
    }

    async fn send(&mut self, bytes: &[u8]) -> Io<()> {
        self.stream
            .get_mut()
            .write_all(bytes)
            .await
            .map_err(|_| Gone)
    }

    async fn line(&mut self) -> Io<String> {
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

    async fn cmd(&mut self, line: &str) -> Io<String> {
        self.send(format!("{line}\r\n").as_bytes()).await?;
        self.line().await
    }

    /// The id and body of a job whose `RESERVED <id> <bytes>` line was read.
    async fn job(&mut self, line: &str) -> Io<(String, Vec<u8>)> {
        let (id, len) = line
            .strip_prefix("RESERVED ")
            .and_then(|rest| rest.split_once(' '))
            .unwrap_or_else(|| panic!("expected RESERVED <id> <bytes>, got {line:?}"));
        let len = len.parse().expect("byte count");
        Ok((id.to_string(), self.block(len).await?))
    }

    /// `stats`, as a map of its numeric figures.
    async fn stats(&mut self) -> Io<HashMap<String, u64>> {
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
fn figure(stats: &HashMap<String, u64>, key: &str) -> u64 {
    *stats
        .get(key)
        .unwrap_or_else(|| panic!("no `{key}` in stats"))
}

/// The job counts that must all be zero once everything is drained.
const CURRENT: [&str; 5] = [
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
];

// ---------------------------------------------------------------------------
// The ledger

/// A job as put.
#[derive(Debug, Clone)]
struct Put {
    body: Vec<u8>,
    delay: u32,
    ttr: u32,
}

/// One `RESERVED` a worker received.
#[derive(Debug, Clone)]
struct Delivery {
    worker: String,
    id: String,
    body: Vec<u8>,
    /// When the `reserve` was sent (before the reservation was made).
    asked: Instant,
    /// When the reply arrived.
    at: Instant,
}

#[derive(Default)]
struct Books {
    /// Every put sent, by body (bodies are unique), with when it was sent.
    sent: HashMap<Vec<u8>, (Put, Instant)>,
    /// Puts answered `INSERTED`: id -> body.
    acked: HashMap<String, Vec<u8>>,
    /// Puts whose connection died before the reply: maybe stored, maybe not.
    in_doubt: HashSet<Vec<u8>>,
    deliveries: Vec<Delivery>,
    /// `DELETED` received: id -> when.
    deleted: HashMap<String, Instant>,
    /// Deletes whose connection died before the reply.
    delete_in_doubt: HashSet<String>,
    /// Jobs a worker held (reserved, not deleted) when its process was killed.
    orphans: Vec<Delivery>,
}

/// What every producer and worker of a test records, shared.
#[derive(Default)]
struct Ledger {
    books: Mutex<Books>,
    /// Jobs workers hold right now, per worker name.
    holding: Mutex<HashMap<String, usize>>,
    /// Set once every producer has finished: workers then drain and stop.
    done: AtomicBool,
}

/// What [`Ledger::check`] found.
#[derive(Debug)]
struct Summary {
    acked: usize,
    in_doubt: usize,
    /// Puts in doubt that turned out stored (they were delivered).
    in_doubt_stored: usize,
    deliveries: usize,
    /// Jobs delivered more than once.
    redelivered: usize,
    orphans: usize,
    /// Deliveries per worker.
    per_worker: HashMap<String, usize>,
}

impl Ledger {
    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acked_count(&self) -> usize {
        self.books().acked.len()
    }

    fn holding(&self, worker: &str) -> usize {
        let holding = self.holding.lock().unwrap_or_else(PoisonError::into_inner);
        holding.get(worker).copied().unwrap_or(0)
    }

    fn set_holding(&self, worker: &str, n: usize) {
        let mut holding = self.holding.lock().unwrap_or_else(PoisonError::into_inner);
        holding.insert(worker.to_string(), n);
    }

    /// Checks the guarantees: every acknowledged job delivered, nothing
    /// delivered that was not put, bodies intact, nothing delivered after
    /// its `DELETED`, delays and TTRs respected, and (if `exactly_once`) no
    /// job delivered twice.
    fn check(&self, exactly_once: bool) -> Summary {
        let b = self.books();
        let mut by_id: HashMap<&str, Vec<&Delivery>> = HashMap::new();
        for d in &b.deliveries {
            by_id.entry(&d.id).or_default().push(d);
        }
        // Nothing delivered that was never put; bodies match their ids.
        let mut in_doubt_stored = HashSet::new();
        for d in &b.deliveries {
            match b.acked.get(&d.id) {
                Some(body) => assert_eq!(
                    &d.body, body,
                    "job {} delivered to {} with another job's body",
                    d.id, d.worker
                ),
                None => {
                    assert!(
                        b.in_doubt.contains(&d.body),
                        "job {} ({:?}) delivered to {} but never acknowledged, \
                         nor put on a connection that died",
                        d.id,
                        String::from_utf8_lossy(&d.body),
                        d.worker
                    );
                    in_doubt_stored.insert(&d.body);
                }
            }
        }
        // Every acknowledged job delivered.
        let mut missing: Vec<&String> = b
            .acked
            .keys()
            .filter(|id| !by_id.contains_key(id.as_str()))
            .collect();
        missing.sort();
        assert!(
            missing.is_empty(),
            "{} of {} acknowledged jobs never delivered: {missing:?}",
            missing.len(),
            b.acked.len()
        );
        // A delayed job is not delivered before its delay has passed.
        for d in &b.deliveries {
            let (put, sent) = &b.sent[&d.body];
            let due = *sent + Duration::from_secs(put.delay.into());
            assert!(
                d.at + SLACK >= due,
                "job {} (delay {}s) delivered {:?} early",
                d.id,
                put.delay,
                due - d.at
            );
        }
        // Nothing comes back once deleted.
        for d in &b.deliveries {
            if let Some(deleted_at) = b.deleted.get(&d.id) {
                assert!(
                    d.at <= *deleted_at,
                    "job {} delivered to {} {:?} after it was DELETED",
                    d.id,
                    d.worker,
                    d.at - *deleted_at
                );
            }
        }
        // A job held by a killed process comes back, once its TTR has run out.
        for o in &b.orphans {
            if b.delete_in_doubt.contains(&o.id) {
                continue;
            }
            let ttr = Duration::from_secs(b.sent[&o.body].0.ttr.into());
            let again = by_id[o.id.as_str()]
                .iter()
                .find(|d| d.at > o.at)
                .unwrap_or_else(|| {
                    panic!(
                        "job {} held by {} when its process was killed never came back",
                        o.id, o.worker
                    )
                });
            let after = again.at - o.asked;
            assert!(
                again.at + SLACK >= o.asked + ttr,
                "job {} came back {after:?} after it was reserved, before its TTR of {ttr:?}",
                o.id,
            );
            // The timer wakes at least once a second; the rest is slack for
            // a loaded machine and a worker reconnecting.
            assert!(
                after <= ttr + ORPHAN_SLACK,
                "job {} came back only {after:?} after it was reserved, with a TTR of {ttr:?}",
                o.id,
            );
        }
        let redelivered = by_id.values().filter(|ds| ds.len() > 1).count();
        if exactly_once {
            let mut twice: Vec<String> = by_id
                .iter()
                .filter(|(_, ds)| ds.len() > 1)
                .map(|(id, ds)| {
                    let who: Vec<&str> = ds.iter().map(|d| d.worker.as_str()).collect();
                    format!("{id} to {who:?}")
                })
                .collect();
            twice.sort();
            assert!(
                twice.is_empty(),
                "{} jobs delivered more than once: {:?}",
                twice.len(),
                &twice[..twice.len().min(20)]
            );
        }
        let mut per_worker = HashMap::new();
        for d in &b.deliveries {
            *per_worker.entry(d.worker.clone()).or_default() += 1;
        }
        Summary {
            acked: b.acked.len(),
            in_doubt: b.in_doubt.len(),
            in_doubt_stored: in_doubt_stored.len(),
            deliveries: b.deliveries.len(),
            redelivered,
            orphans: b.orphans.len(),
            per_worker,
        }
    }
}

// ---------------------------------------------------------------------------
// Producers and workers

/// The `n`th job of a test: a unique body, a delay of 0–2 s, the TTR given.
fn job(test: &str, n: usize, ttr: u32) -> Put {
    Put {
        body: format!("{test}-{n}").into_bytes(),
        delay: u32::try_from(n % 3).expect("small"),
        ttr,
    }
}

/// Puts `jobs` through `endpoint`, `window` at a time (pipelined), pausing
/// `pace` between windows. When the process is killed, the puts awaiting a
/// reply are in doubt, and the rest go to its replacement; when it is gone
/// for good, the rest are not put.
async fn produce(
    name: &str,
    mut endpoint: Endpoint,
    ledger: Arc<Ledger>,
    jobs: Vec<Put>,
    window: usize,
    pace: Duration,
) {
    let mut conn: Option<Conn> = None;
    for chunk in jobs.chunks(window) {
        let c = loop {
            if let Some(c) = conn.as_mut() {
                break c;
            }
            let Some(addr) = *endpoint.borrow_and_update() else {
                return;
            };
            match Conn::connect(addr).await {
                Ok(c) => conn = Some(c),
                Err(Gone) => next_endpoint(&mut endpoint, name).await,
            }
        };
        let mut msg = Vec::new();
        for put in chunk {
            msg.extend_from_slice(
                format!("put 100 {} {} {}\r\n", put.delay, put.ttr, put.body.len()).as_bytes(),
            );
            msg.extend_from_slice(&put.body);
            msg.extend_from_slice(b"\r\n");
        }
        {
            let mut b = ledger.books();
            let now = Instant::now();
            for put in chunk {
                b.sent.insert(put.body.clone(), (put.clone(), now));
            }
        }
        let mut answered = 0;
        let mut died = c.send(&msg).await.is_err();
        while !died && answered < chunk.len() {
            match c.line().await {
                Ok(reply) => {
                    let id = reply
                        .strip_prefix("INSERTED ")
                        .unwrap_or_else(|| panic!("{name}: expected INSERTED <id>, got {reply:?}"));
                    let body = chunk[answered].body.clone();
                    let before = ledger.books().acked.insert(id.to_string(), body);
                    assert!(before.is_none(), "{name}: id {id} acknowledged twice");
                    answered += 1;
                }
                Err(Gone) => died = true,
            }
        }
        if died {
            ledger
                .books()
                .in_doubt
                .extend(chunk[answered..].iter().map(|put| put.body.clone()));
            conn = None;
            next_endpoint(&mut endpoint, name).await;
        }
        tokio::time::sleep(pace).await;
    }
}

/// Reserves and deletes through `endpoint`, keeping up to `hold` jobs
/// reserved at a time (deleting the oldest when it has more, and all of them
/// when nothing is ready). Once the ledger is done and `stats` shows no job
/// left anywhere, returns those stats; returns `None` if its process is
/// killed for good.
async fn work(
    name: String,
    mut endpoint: Endpoint,
    ledger: Arc<Ledger>,
    hold: usize,
) -> Option<HashMap<String, u64>> {
    loop {
        let addr = (*endpoint.borrow_and_update())?;
        let mut held = VecDeque::new();
        let outcome = match Conn::connect(addr).await {
            Ok(mut conn) => work_on(&name, &mut conn, &ledger, hold, &mut held).await,
            Err(Gone) => Err(Gone),
        };
        match outcome {
            Ok(stats) => return Some(stats),
            Err(Gone) => {
                ledger.books().orphans.extend(held);
                ledger.set_holding(&name, 0);
                next_endpoint(&mut endpoint, &name).await;
            }
        }
    }
}

async fn work_on(
    name: &str,
    conn: &mut Conn,
    ledger: &Ledger,
    hold: usize,
    held: &mut VecDeque<Delivery>,
) -> Io<HashMap<String, u64>> {
    loop {
        let asked = Instant::now();
        let reply = conn.cmd("reserve-with-timeout 1").await?;
        if reply.starts_with("RESERVED ") {
            let (id, body) = conn.job(&reply).await?;
            let d = Delivery {
                worker: name.to_string(),
                id,
                body,
                asked,
                at: Instant::now(),
            };
            ledger.books().deliveries.push(d.clone());
            held.push_back(d);
            ledger.set_holding(name, held.len());
            while held.len() > hold {
                delete_oldest(name, conn, ledger, held).await?;
            }
        } else if reply == "TIMED_OUT" || reply == "DEADLINE_SOON" {
            while !held.is_empty() {
                delete_oldest(name, conn, ledger, held).await?;
            }
            if reply == "TIMED_OUT" && ledger.done.load(Ordering::SeqCst) {
                let stats = conn.stats().await?;
                if CURRENT.iter().all(|k| figure(&stats, k) == 0) {
                    return Ok(stats);
                }
            }
        } else {
            panic!("{name}: unexpected reply to reserve: {reply:?}");
        }
    }
}

async fn delete_oldest(
    name: &str,
    conn: &mut Conn,
    ledger: &Ledger,
    held: &mut VecDeque<Delivery>,
) -> Io<()> {
    let d = held.pop_front().expect("a held job");
    ledger.set_holding(name, held.len());
    match conn.cmd(&format!("delete {}", d.id)).await {
        Ok(reply) => {
            assert_eq!(reply, "DELETED", "{name}: delete {}", d.id);
            ledger.books().deleted.insert(d.id, Instant::now());
            Ok(())
        }
        Err(Gone) => {
            ledger.books().delete_in_doubt.insert(d.id);
            Err(Gone)
        }
    }
}

/// Waits until `ok` holds, polling; panics after `limit`.
async fn wait_until(what: &str, limit: Duration, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Awaits a role's task, failing the test if it panicked or overran. An
/// overrun is first checked against the ledger, which names what is missing.
async fn join<T>(what: &str, task: JoinHandle<T>, ledger: &Ledger) -> T {
    match tokio::time::timeout(DRAIN_LIMIT, task).await {
        Ok(done) => done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        Err(_) => {
            ledger.check(false);
            panic!("{what} did not finish within {DRAIN_LIMIT:?}")
        }
    }
}

// ---------------------------------------------------------------------------
// Killing delayq

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayq_killed_and_restarted_loses_nothing() {
    const JOBS: usize = 300;
    const KILLS: usize = 3;
    let started = Instant::now();
    let redis = RedisServer::start(&[]);
    let mut daemon = Daemon::redis(&redis.url).await;
    let (tx, endpoint) = watch::channel(Some(daemon.addr));
    let ledger = Arc::new(Ledger::default());
    let jobs = (0..JOBS).map(|n| job("restart", n, 2 + (n % 2) as u32));
    let producer = tokio::spawn({
        let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
        async move {
            let pace = Duration::from_millis(8);
            produce("producer", endpoint, ledger, jobs.collect(), 1, pace).await;
        }
    });
    let worker = tokio::spawn(work("worker".into(), endpoint.clone(), ledger.clone(), 3));

    for k in 1..=KILLS {
        // Kill once a share of the jobs is in, while the worker holds some.
        let ledger = &ledger;
        let enough = k * JOBS / (KILLS + 1);
        wait_until("jobs acknowledged", Duration::from_secs(15), || {
            ledger.acked_count() >= enough
        })
        .await;
        wait_until("the worker holds a job", Duration::from_secs(5), || {
            ledger.holding("worker") > 0
        })
        .await;
        daemon.kill();
        daemon = Daemon::redis(&redis.url).await;
        tx.send(Some(daemon.addr)).expect("roles listening");
    }
    join("the producer", producer, &ledger).await;
    ledger.done.store(true, Ordering::SeqCst);
    let stats = join("the worker", worker, &ledger)
        .await
        .expect("the worker's process is never gone for good");

    let summary = ledger.check(false);
    eprintln!("{summary:?} in {:?}", started.elapsed());
    // With one put in flight at a time, each kill leaves at most one in doubt.
    assert!(summary.in_doubt <= KILLS, "{summary:?}");
    assert_eq!(summary.acked + summary.in_doubt, JOBS, "{summary:?}");
    assert!(
        summary.orphans > 0,
        "no kill caught the worker holding a job: {summary:?}"
    );
    assert_eq!(
        figure(&stats, "total-jobs"),
        (summary.acked + summary.in_doubt_stored) as u64,
        "every job stored was acknowledged or in doubt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_one_killed_the_other_serves_on() {
    const JOBS: usize = 300;
    let started = Instant::now();
    let redis = RedisServer::start(&[]);
    let mut a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let (tx_a, endpoint_a) = watch::channel(Some(a.addr));
    let (_tx_b, endpoint_b) = watch::channel(Some(b.addr));
    let ledger = Arc::new(Ledger::default());
    let pace = Duration::from_millis(8);
    let mut producers = Vec::new();
    for (name, endpoint, range) in [
        ("producer-a", &endpoint_a, 0..JOBS / 2),
        ("producer-b", &endpoint_b, JOBS / 2..JOBS),
    ] {
        let jobs = range.map(|n| job("two", n, 2 + (n % 2) as u32)).collect();
        let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
        producers.push(tokio::spawn(async move {
            produce(name, endpoint, ledger, jobs, 1, pace).await;
        }));
    }
    let worker_a = tokio::spawn(work("worker-a".into(), endpoint_a, ledger.clone(), 3));
    let worker_b = tokio::spawn(work("worker-b".into(), endpoint_b, ledger.clone(), 3));

    // Kill A a third of the way in, while its worker holds jobs.
    wait_until("jobs acknowledged", Duration::from_secs(15), || {
        ledger.acked_count() >= JOBS / 3
    })
    .await;
    wait_until("worker-a holds a job", Duration::from_secs(5), || {
        ledger.holding("worker-a") > 0
    })
    .await;
    a.kill();
    tx_a.send(None).expect("roles listening");

    for (i, p) in producers.into_iter().enumerate() {
        join(&format!("producer {i}"), p, &ledger).await;
    }
    ledger.done.store(true, Ordering::SeqCst);
    assert!(
        join("worker-a", worker_a, &ledger).await.is_none(),
        "worker-a outlived its process"
    );
    let stats = join("worker-b", worker_b, &ledger)
        .await
        .expect("worker-b's process lives on");

    let summary = ledger.check(false);
    eprintln!("{summary:?} in {:?}", started.elapsed());
    assert!(summary.orphans > 0, "{summary:?}");
    assert!(summary.per_worker.get("worker-a").copied().unwrap_or(0) > 0);
    assert_eq!(
        figure(&stats, "total-jobs"),
        (summary.acked + summary.in_doubt_stored) as u64,
        "every job stored was acknowledged or in doubt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_timers_deliver_each_job_exactly_once() {
    // 3000 keeps CI quick; DELAYQ_TIMER_JOBS=30000 is the 10k per
    // process, run by hand.
    let jobs_wanted = std::env::var("DELAYQ_TIMER_JOBS").ok();
    let jobs_wanted = jobs_wanted.and_then(|n| n.parse().ok());
    let jobs_count: usize = jobs_wanted.unwrap_or(3000);
    let started = Instant::now();
    let redis = RedisServer::start(&[]);
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(Daemon::redis(&redis.url).await);
    }
    let ledger = Arc::new(Ledger::default());
    let mut senders = Vec::new();
    let mut workers = Vec::new();
    for (p, daemon) in daemons.iter().enumerate() {
        let (tx, endpoint) = watch::channel(Some(daemon.addr));
        senders.push(tx);
        for w in 0..2 {
            let name = format!("worker-{p}.{w}");
            workers.push(tokio::spawn(work(
                name,
                endpoint.clone(),
                ledger.clone(),
                0,
            )));
        }
    }
    let jobs = (0..jobs_count).map(|n| job("timers", n, 30)).collect();
    let endpoint = senders[0].subscribe();
    produce(
        "producer",
        endpoint,
        ledger.clone(),
        jobs,
        100,
        Duration::ZERO,
    )
    .await;
    ledger.done.store(true, Ordering::SeqCst);
    let mut stats = None;
    for (i, w) in workers.into_iter().enumerate() {
        stats = join(&format!("worker {i}"), w, &ledger).await;
    }
    let stats = stats.expect("no process was killed");

    let summary = ledger.check(true);
    eprintln!("{summary:?} in {:?}", started.elapsed());
    assert_eq!(summary.acked, jobs_count, "{summary:?}");
    assert_eq!(summary.deliveries, jobs_count, "{summary:?}");
    assert_eq!(summary.redelivered, 0, "{summary:?}");
    assert_eq!(figure(&stats, "total-jobs"), jobs_count as u64);
    assert_eq!(figure(&stats, "job-timeouts"), 0);
    for p in 0..3 {
        let got: usize = (0..2)
            .map(|w| summary.per_worker.get(&format!("worker-{p}.{w}")))
            .map(|n| n.copied().unwrap_or(0))
            .sum();
        assert!(got > 0, "process {p}'s workers got nothing: {summary:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_process_leaves_no_tube_users_behind() {
    let redis = RedisServer::start(&[]);
    let mut a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut on_a = Client::connect(a.addr).await;
    assert_eq!(on_a.cmd("use only-a").await, "USING only-a");
    assert_eq!(on_a.cmd("watch only-a").await, "WATCHING 2");
    let mut on_b = Client::connect(b.addr).await;
    // Wait out the connections `Daemon::start` opened to see the ports open.
    on_b.poll_yaml("stats-tube default", |s| {
        (s.num("current-using"), s.num("current-watching")) == (1, 2)
    })
    .await;
    a.kill();
    // The figures cover every process, so they are Redis's: once A is gone
    // (it had no chance to clean up), they must come to count only B's
    // connection, and the tube only A's connection kept alive must go.
    let start = Instant::now();
    loop {
        let s = on_b.stats_tube("default").await;
        let users = (s.num("current-using"), s.num("current-watching"));
        let tubes = on_b.tubes().await;
        if users == (1, 1) && tubes == ["default"] {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "5 s after A was killed, `default` still counts A's connection \
             (current-using, current-watching = {users:?}, expected (1, 1)) \
             and list-tubes is {tubes:?}, expected [\"default\"]"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// Killing Redis

/// Polls until delayq reaches Redis again (`list-tubes` needs it).
async fn wait_for_redis(c: &mut Client) -> Duration {
    let start = Instant::now();
    loop {
        match c.reply("list-tubes").await.as_str() {
            "OK" => return start.elapsed(),
            "INTERNAL_ERROR" => {}
            other => panic!("list-tubes answered {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "delayq never got Redis back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts `cmd` answers `INTERNAL_ERROR` promptly.
async fn internal_error(c: &mut Client, cmd: &str) {
    let start = Instant::now();
    assert_eq!(
        c.cmd(cmd).await,
        "INTERNAL_ERROR",
        "{cmd} while Redis is down"
    );
    assert!(
        start.elapsed() < REPLY_TIMEOUT,
        "{cmd} took {:?} to fail",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restart_with_appendonly_always_keeps_every_acknowledged_job() {
    let mut redis = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let server = InProcess::start(&redis.url).await;
    let mut producer = server.client().await;
    let mut acked: HashMap<String, Vec<u8>> = HashMap::new();
    for n in 0..40u32 {
        let body = format!("durable-{n}").into_bytes();
        let reply = producer.put(n % 4, n % 3, 60, &body).await;
        let id = reply
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("expected INSERTED <id>, got {reply:?}"));
        acked.insert(id.to_string(), body);
    }
    let reply = producer.put_id(0, 1, 60, b"named", "order:1").await;
    assert_eq!(reply, "INSERTED order:1");
    acked.insert("order:1".into(), b"named".to_vec());
    // One job is reserved across the outage; its holder deletes it after.
    let mut holder = server.client().await;
    let held = holder.reserved("reserve-with-timeout 0").await;
    assert_eq!(acked.remove(&held.id), Some(held.body));

    redis.kill();
    internal_error(&mut producer, "put 0 0 60 4\r\nlost").await;
    internal_error(&mut producer, "peek-ready").await;
    internal_error(&mut producer, "stats").await;
    internal_error(&mut producer, "reserve-with-timeout 0").await;
    internal_error(&mut holder, &format!("touch {}", held.id)).await;
    // Both connections are still open and answer what needs no Redis.
    producer.ping().await;
    holder.ping().await;

    redis.restart();
    let took = wait_for_redis(&mut producer).await;
    eprintln!("delayq reached the restarted Redis after {took:?}");
    assert_eq!(holder.cmd(&format!("delete {}", held.id)).await, "DELETED");
    let s = producer.stats().await;
    assert_eq!(s.num("total-jobs"), 41, "the refused put stored nothing");
    assert_eq!(
        s.num("current-jobs-ready") + s.num("current-jobs-delayed"),
        40
    );
    // Ids go on after the last one stored: none is handed out twice.
    assert_eq!(producer.put(0, 0, 60, b"after").await, "INSERTED 42");
    acked.insert("42".into(), b"after".to_vec());

    let mut worker = server.client().await;
    let mut got = HashMap::new();
    while got.len() < acked.len() {
        let job = worker.reserved("reserve-with-timeout 5").await;
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
        assert!(
            got.insert(job.id.clone(), job.body).is_none(),
            "{} twice",
            job.id
        );
    }
    assert_eq!(got, acked);
    let s = producer.stats().await;
    for k in CURRENT {
        assert_eq!(s.num(k), 0, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_outage_keeps_clients_and_resumes_blocked_workers() {
    let mut redis = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let server = InProcess::start(&redis.url).await;
    let mut producer = server.client().await;
    let mut watcher = server.client().await;
    // One worker waits for a job put after the outage, one for a job that
    // falls due during it.
    let mut worker = server.client().await;
    worker.send_line("reserve").await;
    let mut late_worker = server.client().await;
    assert_eq!(late_worker.cmd("watch later").await, "WATCHING 2");
    assert_eq!(late_worker.cmd("ignore default").await, "WATCHING 1");
    late_worker.send_line("reserve").await;
    watcher.wait_stat("current-waiting", 2).await;
    assert_eq!(producer.cmd("use later").await, "USING later");
    assert_eq!(producer.put(0, 1, 60, b"due-in-outage").await, "INSERTED 1");
    assert_eq!(producer.cmd("use default").await, "USING default");

    let outage = Instant::now();
    redis.kill();
    internal_error(&mut producer, "put 0 0 60 4\r\nlost").await;
    internal_error(&mut producer, "stats").await;
    assert_eq!(producer.cmd("list-tube-used").await, "USING default");
    internal_error(&mut producer, "put 0 0 60 5\r\nlost2").await;
    // A client that connects during the outage is kept too.
    let mut newcomer = server.client().await;
    assert_eq!(newcomer.cmd("list-tube-used").await, "USING default");
    internal_error(&mut newcomer, "put 0 0 60 5\r\nlost3").await;
    // The blocked workers hear nothing meanwhile, and stay connected.
    let quiet = Duration::from_secs(3).saturating_sub(outage.elapsed());
    worker.expect_silence(quiet / 2).await;
    late_worker.expect_silence(quiet / 2).await;
    assert_eq!(producer.cmd("list-tube-used").await, "USING default");

    redis.restart();
    wait_for_redis(&mut producer).await;
    let put_at = Instant::now();
    assert_eq!(producer.put(0, 0, 60, b"after").await, "INSERTED 2");
    let line = worker.line().await;
    let job = worker.job_after("RESERVED", &line).await;
    assert_eq!((job.id.as_str(), &job.body[..]), ("2", &b"after"[..]));
    assert!(
        put_at.elapsed() < Duration::from_secs(2),
        "{:?}",
        put_at.elapsed()
    );
    let line = late_worker.line().await;
    let job = late_worker.job_after("RESERVED", &line).await;
    assert_eq!(
        (job.id.as_str(), &job.body[..]),
        ("1", &b"due-in-outage"[..])
    );
    let s = watcher.stats().await;
    assert_eq!(s.num("current-waiting"), 0);
    assert_eq!(s.num("current-jobs-reserved"), 2);
    assert_eq!(s.num("total-jobs"), 2, "the refused puts stored nothing");
}

// ---------------------------------------------------------------------------
// A full Redis

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_of_memory_put_answers_out_of_memory() {
    let redis = RedisServer::start(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let server = InProcess::start(&redis.url).await;
    let mut c = server.client().await;
    // Redis alone takes about 0.9 MB; 2 MB leaves room for about 11 jobs of
    // 60 kB (at 1.5 MB only 2 fit; at 1.2 MB not even a 1-byte job does).
    let body = |n: u64| {
        let mut b = format!("big-{n}-").into_bytes();
        b.resize(60_000, b'x');
        b
    };
    let mut inserted = 0u64;
    let refused = loop {
        let reply = c.put(0, 0, 60, &body(inserted + 1)).await;
        if reply != format!("INSERTED {}", inserted + 1) {
            break reply;
        }
        inserted += 1;
        assert!(inserted < 200, "Redis never filled up");
    };
    assert_eq!(refused, "OUT_OF_MEMORY");
    assert!(inserted > 0, "not even one job fitted");
    assert_eq!(c.put(0, 0, 60, &body(0)).await, "OUT_OF_MEMORY");
    c.ping().await;

    // Redis holds exactly the jobs acknowledged, nothing of the refused ones.
    let client = ::redis::Client::open(redis.url.as_str()).expect("redis URL");
    let mut r = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let count = |cmd: &str, key: &str| {
        let mut r = r.clone();
        let (cmd, key) = (cmd.to_string(), format!("{{delayq:}}{key}"));
        async move {
            let n: Option<u64> = ::redis::cmd(&cmd)
                .arg(&key)
                .query_async(&mut r)
                .await
                .unwrap_or_else(|e| panic!("{cmd} {key}: {e}"));
            n.unwrap_or(0)
        }
    };
    assert_eq!(count("HLEN", "jobs").await, inserted);
    assert_eq!(count("HLEN", "bodies").await, inserted);
    assert_eq!(count("ZCARD", "ready:default").await, inserted);
    assert_eq!(
        count("GET", "seq").await,
        inserted,
        "a refused put took an id"
    );
    let total: Option<u64> = ::redis::cmd("HGET")
        .arg("{delayq:}totals")
        .arg("jobs")
        .query_async(&mut r)
        .await
        .expect("HGET totals");
    assert_eq!(total, Some(inserted));

    // delayq's own view agrees, while Redis is still full. (Redis refuses
    // a write once it is over `maxmemory`; the last put that fitted may well
    // have taken it over, so Redis stays over until jobs are deleted, and
    // reading and deleting must still work.)
    c.send_line("stats").await;
    let line = c.line().await;
    assert!(
        line.starts_with("OK "),
        "stats with {inserted} jobs in a full Redis answered {line:?}"
    );
    let len: usize = line[3..].parse().expect("byte count");
    let doc = c.read_exact(len + 2).await;
    let s = common::Yaml::parse(std::str::from_utf8(&doc[..len]).expect("UTF-8"));
    assert_eq!(s.num("current-jobs-ready"), inserted);
    assert_eq!(s.num("current-jobs-urgent"), inserted);
    assert_eq!(s.num("total-jobs"), inserted);

    // Workers can still drain a full Redis, which makes room again.
    for _ in 0..inserted {
        let line = c.cmd("reserve-with-timeout 0").await;
        let job = c.job_after("RESERVED", &line).await;
        assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    let next = inserted + 1;
    assert_eq!(
        c.put(0, 0, 60, &body(next)).await,
        format!("INSERTED {next}")
    );
}
