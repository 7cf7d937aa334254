//! delayq on a Redis Cluster (and one Redis) when parts of it fail, with
//! real processes: a primary killed under load, with and without
//! `--redis-wait`; a delayq process killed while the shards it ticks hold
//! delayed jobs; and Redis frozen with SIGSTOP while clients wait for
//! their replies.
//!
//! The cluster's layout comes from delayq's own functions (whose unit tests
//! check the slots against Redis): shard `k`'s keys carry one hash tag, and
//! a client-chosen id lives in the shard of its own slot. So a test can aim
//! jobs at the primary it is about to break.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use delayq::store::redis::{SHARDS, shard_of_key, shard_tag};
use tokio::sync::watch;

use crate::common::Client;
use crate::common::cluster::{RedisCluster, Shared, blocking, start_shared};
use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::conn::{Gone, Io};
use crate::ledger::{Ledger, Summary};
use crate::load::{job, join, join_within, produce, wait_until, work};

/// The prefix delayq uses unless told otherwise.
const PREFIX: &str = "delayq:";

/// The slot Redis gives `key`.
fn slot(key: &str) -> u16 {
    u16::try_from(delayq::store::redis::slot(key.as_bytes())).expect("slots fit in u16")
}

/// The node serving each shard of `prefix` now, and the one serving the
/// control slot (the key sequence, the live processes, the tubes' users).
fn layout(cluster: &RedisCluster, prefix: &str) -> (Vec<usize>, usize) {
    let shards = (0..SHARDS)
        .map(|k| cluster.slot_owner(slot(&shard_tag(prefix, k))))
        .collect();
    (shards, cluster.slot_owner(slot(&format!("{{{prefix}}}"))))
}

/// Client-chosen ids `STEM-N` whose jobs live on shards that `node` serves
/// (`owners`: the node of each shard).
fn ids_on(
    owners: Vec<usize>,
    node: usize,
    stem: &str,
) -> impl Iterator<Item = String> + Send + use<> {
    let stem = stem.to_string();
    (0u64..)
        .map(move |n| format!("{stem}-{n}"))
        .filter(move |id| owners[shard_of_key(id.as_bytes())] == node)
}

/// The value of a reply on a connection delayq must keep open.
fn kept<T>(io: Io<T>, who: &str) -> T {
    io.unwrap_or_else(|Gone| panic!("delayq closed {who}'s connection"))
}

/// Asserts the delayq process is still running.
fn still_up(daemon: &mut Daemon) {
    let status = daemon.child.try_wait().expect("try_wait delayq");
    assert!(status.is_none(), "delayq exited: {status:?}");
}

/// One put of [`probe`].
struct Probed {
    sent: Instant,
    took: Duration,
    inserted: bool,
}

/// Puts a job with a fresh id of `ids` in the tube `probe` every 50 ms
/// until `stop`, and deletes each one inserted, recording every put in
/// `seen`; returns the ids of the puts answered `INTERNAL_ERROR` (they may
/// be stored).
async fn probe(
    addr: SocketAddr,
    ids: impl Iterator<Item = String> + Send,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Probed>>>,
) -> Vec<String> {
    let mut c = Client::connect(addr).await;
    assert_eq!(c.cmd("use probe").await, "USING probe");
    let mut doubt = Vec::new();
    for id in ids {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let sent = Instant::now();
        let put = format!("put 0 0 60 {} {id}\r\n{id}\r\n", id.len());
        kept(c.try_send(put.as_bytes()).await, "the probe");
        let reply = kept(c.try_line().await, "the probe");
        let took = sent.elapsed();
        let inserted = reply == format!("INSERTED {id}");
        if inserted {
            match kept(c.try_cmd(&format!("delete {id}")).await, "the probe").as_str() {
                "DELETED" => {}
                "INTERNAL_ERROR" => doubt.push(id),
                other => panic!("the probe's delete {id} answered {other:?}"),
            }
        } else {
            assert_eq!(reply, "INTERNAL_ERROR", "the probe's put {id}");
            doubt.push(id);
        }
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Probed {
                sent,
                took,
                inserted,
            });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doubt
}

/// Deletes the jobs `ids` if they exist, retrying while delayq cannot
/// reach Redis.
async fn delete_all(addr: SocketAddr, ids: &[String]) {
    let mut c = Client::connect(addr).await;
    for id in ids {
        let start = Instant::now();
        loop {
            match c.cmd(&format!("delete {id}")).await.as_str() {
                "DELETED" | "NOT_FOUND" => break,
                "INTERNAL_ERROR" if start.elapsed() < Duration::from_secs(15) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => panic!("delete {id} answered {other:?}"),
            }
        }
    }
}

/// What [`primary_killed_under_load`] saw.
struct PrimaryKilled {
    summary: Summary,
    /// Shards the killed primary served.
    shards: usize,
    /// From the kill until a replica was primary and the cluster agreed.
    failover: Duration,
    /// From the kill until the killed node was back, as a replica.
    rejoined: Duration,
    /// From the kill until a put on the killed primary's shards was
    /// acknowledged again.
    puts_back: Duration,
    /// The longest any probe put took to be answered.
    slowest_put: Duration,
}

/// A 3-primary cluster with a replica each, one delayq process (with
/// `--redis-wait 1` if `wait`, and `extra` flags), two producers and two workers keeping the
/// ledger; a few seconds in, the primary serving the control slot (and a
/// third of the shards) is killed with SIGKILL, its replica takes over, and
/// the killed node is started again on its own data (it comes back as a
/// replica; without it, a put with `--redis-wait 1` could never again be
/// confirmed on that primary's shards). A probe puts on the killed
/// primary's shards throughout, to time the outage.
async fn primary_killed_under_load(wait: bool, extra: &[&str]) -> PrimaryKilled {
    let per_producer = crate::scale(800, 4000);
    let name = match (wait, extra.is_empty()) {
        (true, true) => "waited",
        (false, true) => "unwaited",
        (true, false) => "waited-flags",
        (false, false) => "unwaited-flags",
    };
    let cluster = start_shared(|| RedisCluster::start(3, 1)).await;
    let (owners, victim) = blocking(&cluster, |c| layout(c, PREFIX)).await;
    let shards = owners.iter().filter(|&&o| o == victim).count();
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let mut args = vec!["--redis-cluster", seeds.as_str()];
    if wait {
        args.extend(["--redis-wait", "1"]);
    }
    args.extend(extra);
    let mut daemon = Daemon::start(&args).await;
    let (_tx, endpoint) = watch::channel(Some(daemon.addr));
    let ledger = Arc::new(Ledger::default());
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let puts = (p * per_producer..(p + 1) * per_producer)
                .map(|n| job(name, n, 5))
                .collect();
            let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
            tokio::spawn(async move {
                let who = format!("producer-{p}");
                produce(&who, endpoint, ledger, puts, 2, Duration::from_millis(20)).await;
            })
        })
        .collect();
    let workers: Vec<_> = (0..2)
        .map(|w| {
            tokio::spawn(work(
                format!("worker-{w}"),
                endpoint.clone(),
                ledger.clone(),
                2,
            ))
        })
        .collect();
    // A connection that does nothing through the outage but must outlive it.
    let mut idle = daemon.client().await;
    idle.ping().await;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let prober = tokio::spawn(probe(
        daemon.addr,
        ids_on(owners, victim, &format!("probe-{name}")),
        stop.clone(),
        seen.clone(),
    ));

    wait_until(
        "a third of the jobs acknowledged",
        Duration::from_secs(30),
        || ledger.acked_count() >= per_producer * 2 / 3,
    )
    .await;
    let killed = Instant::now();
    blocking(&cluster, move |c| c.kill(victim)).await;
    let promoted = blocking(&cluster, move |c| c.wait_for_failover(victim)).await;
    let failover = killed.elapsed();
    blocking(&cluster, move |c| c.restart(victim)).await;
    let rejoined = killed.elapsed();
    let back = || {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.iter()
            .find(|p| p.sent > killed && p.inserted)
            .map(|p| p.sent + p.took - killed)
    };
    // Well before the producers give up on `stats` (30 s after their
    // first refusal), so that this says what went wrong.
    wait_until(
        "a put on the killed primary's shards to be acknowledged again once the cluster \
         healed (if every command times out meanwhile, delayq's cluster connection never \
         recovered from the failover)",
        Duration::from_secs(20),
        || back().is_some(),
    )
    .await;
    let puts_back = back().expect("just seen");
    stop.store(true, Ordering::SeqCst);
    let doubt = prober
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    // Two thirds of the puts were still to make at the kill: at the soak's
    // scale, paced, that is most of a minute.
    let puts_left = Duration::from_secs(crate::scale(30, 120));
    for (p, task) in producers.into_iter().enumerate() {
        join_within(&format!("producer {p}"), task, &ledger, puts_left).await;
    }
    // The probe's puts in doubt may be stored: gone before the workers
    // wait for every job to be done.
    delete_all(daemon.addr, &doubt).await;
    ledger.done.store(true, Ordering::SeqCst);
    for (w, task) in workers.into_iter().enumerate() {
        join(&format!("worker {w}"), task, &ledger)
            .await
            .expect("the worker's process lives on");
    }

    still_up(&mut daemon);
    assert_eq!(idle.cmd("list-tube-used").await, "USING default");
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        seen.iter().any(|p| p.sent > killed && !p.inserted),
        "no probe put met the dead primary: the kill was not felt"
    );
    let slowest_put = seen.iter().map(|p| p.took).max().unwrap_or_default();
    assert!(
        slowest_put <= Duration::from_secs(3),
        "a put took {slowest_put:?} to be answered; each command is limited to 2 s"
    );
    let summary = ledger.check_with(false, !wait);
    assert_eq!(
        summary.acked + summary.in_doubt,
        2 * per_producer,
        "every put was answered: {summary:?}"
    );
    assert_ne!(promoted, victim);
    PrimaryKilled {
        summary,
        shards,
        failover,
        rejoined,
        puts_back,
        slowest_put,
    }
}

/// Prints what [`primary_killed_under_load`] saw.
fn report(how: &str, run: &PrimaryKilled, took: Duration) {
    let s = &run.summary;
    eprintln!(
        "cluster primary SIGKILLed under load ({how}): it served the control slot and {} of \
         {SHARDS} shards; failover {:.1?}, node back as a replica {:.1?}, puts on its shards \
         failed for {:.1?} (slowest put answered in {:.2?}); {} jobs acknowledged, {} of them \
         lost, {} puts in doubt, {} delivered twice; {s:?} in {took:.1?}",
        run.shards,
        run.failover,
        run.rejoined,
        run.puts_back,
        run.slowest_put,
        s.acked,
        s.lost.len(),
        s.in_doubt,
        s.redelivered,
    );
}

/// With `--redis-wait 1` a put is acknowledged only once the replica has
/// it, so the failover loses none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_loses_nothing_acknowledged_with_wait() {
    let started = Instant::now();
    let run = primary_killed_under_load(true, &[]).await;
    report("--redis-wait 1", &run, started.elapsed());
    assert!(run.summary.lost.is_empty(), "{:?}", run.summary);
}

/// The same with a tube on one shard per primary (`--shards primaries`):
/// the jobs' shards are chosen from the slot map, which the failover
/// changes (another node serves the killed primary's slots), and nothing
/// acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_loses_nothing_with_one_shard_per_primary() {
    let started = Instant::now();
    let run = primary_killed_under_load(true, &["--shards", "primaries"]).await;
    report("--redis-wait 1 --shards primaries", &run, started.elapsed());
    assert!(run.summary.lost.is_empty(), "{:?}", run.summary);
}

/// Without `--redis-wait`, Redis replicates asynchronously and a failover
/// may lose what the primary acknowledged last: the test reports how many,
/// and asserts only that delayq and its connections lived through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_without_wait_reports_its_loss() {
    let started = Instant::now();
    let run = primary_killed_under_load(false, &[]).await;
    report("no --redis-wait", &run, started.elapsed());
}

/// How late the jobs of [`handed_over`] came, past their due time.
struct Lateness {
    latest: Duration,
    /// Jobs more than a second late: those whose shard the killed process
    /// ticked, which waited for its alive mark to expire.
    late: usize,
}

/// How a process of [`handed_over`] ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// SIGKILL: the others take it for dead once its alive mark expires.
    Killed,
    /// SIGTERM: it says it is leaving.
    Stopped,
}

/// Two delayq processes on one cluster under `prefix`; 128 jobs, delayed 2
/// or 3 s, put through the first, spread over the shards. Then one ends
/// (`how`) before they fall due: the other (`end_producer`: the first one,
/// else the second) must take over the shards the one gone ticked, so a
/// worker on the survivor gets every job, none early and none later than
/// `late_limit`.
async fn handed_over(
    seeds: &str,
    prefix: &str,
    end_producer: bool,
    how: Ending,
    late_limit: Duration,
) -> Lateness {
    const JOBS: usize = 128;
    let args = ["--redis-cluster", seeds, "--redis-prefix", prefix];
    let producer_side = Daemon::start(&args).await;
    let other = Daemon::start(&args).await;
    // Each process renews its alive mark and reads the live ones every
    // 0.5 s (its timer sleeps at most 1 s): by now each knows the other,
    // and the shards are divided between them.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut producer = producer_side.client().await;
    let mut due = std::collections::HashMap::new();
    for n in 0..JOBS {
        let body = format!("{prefix}{n}");
        let delay = 2 + (n % 2) as u32;
        let sent = Instant::now();
        producer.put_ok(0, delay, 30, body.as_bytes()).await;
        due.insert(body, sent + Duration::from_secs(delay.into()));
    }
    let (mut survivor, mut dead) = (producer_side, other);
    if end_producer {
        std::mem::swap(&mut survivor, &mut dead);
    }
    match how {
        Ending::Killed => dead.kill(),
        Ending::Stopped => dead.signal(libc::SIGTERM),
    }
    let killed = Instant::now();
    let last_due = due.values().max().copied().expect("jobs");
    assert!(last_due > killed, "the jobs fell due before the kill");

    let mut worker = survivor.client().await;
    let mut latest = Duration::ZERO;
    let mut late = 0;
    while !due.is_empty() {
        assert!(
            Instant::now() < last_due + late_limit + Duration::from_secs(2),
            "{} of {JOBS} jobs never came after the process that ticked their shards was \
             killed: {:?}",
            due.len(),
            due.keys().take(10).collect::<Vec<_>>()
        );
        let line = worker.cmd("reserve-with-timeout 1").await;
        if line == "TIMED_OUT" {
            continue;
        }
        let job = worker.job_after("RESERVED", &line).await;
        let at = Instant::now();
        let body = String::from_utf8(job.body).expect("a text body");
        let due_at = due
            .remove(&body)
            .unwrap_or_else(|| panic!("{body:?} delivered twice, or never put"));
        assert!(
            at + Duration::from_millis(20) >= due_at,
            "{body} delivered {:?} early",
            due_at - at
        );
        let after = at.saturating_duration_since(due_at);
        assert!(
            after <= late_limit,
            "{body} delivered {after:?} after it was due"
        );
        latest = latest.max(after);
        late += usize::from(after > Duration::from_secs(1));
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    still_up(&mut survivor);
    Lateness { latest, late }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_delayq_process_hands_its_shards_to_another() {
    let started = Instant::now();
    let cluster = start_shared(|| RedisCluster::start(3, 0)).await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let late = Duration::from_secs(5);
    // A worker's process killed: the producer's takes its shards over.
    let worker_side = handed_over(&seeds, "worker-killed:", false, Ending::Killed, late).await;
    // The producer's process killed: the worker's takes its shards over.
    let producer_side = handed_over(&seeds, "producer-killed:", true, Ending::Killed, late).await;
    for (what, l) in [
        ("the other process", &worker_side),
        ("the producer's process", &producer_side),
    ] {
        eprintln!(
            "delayed jobs with {what} SIGKILLed before they fell due: all 128 delivered by the \
             survivor, the latest {:.2?} after it was due, {} more than 1 s late",
            l.latest, l.late
        );
    }
    eprintln!("handover test took {:.1?}", started.elapsed());
}

/// A process stopped the usual way (SIGTERM, as in a rolling restart) says
/// so: the other takes over its shards at its next heartbeat, not once the
/// stopped one's alive mark has expired (3 s after its last tick, which
/// left a reviewer's jobs due just after each stop 2 s late).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_delayq_process_hands_its_shards_over_at_once() {
    let cluster = start_shared(|| RedisCluster::start(3, 0)).await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let limit = Duration::from_millis(1000);
    let l = handed_over(&seeds, "producer-stopped:", true, Ending::Stopped, limit).await;
    eprintln!(
        "delayed jobs with the producer's process stopped (SIGTERM) before they fell due: all \
         128 delivered by the other, the latest {:.2?} after it was due",
        l.latest
    );
}

/// Longest a put may take to answer while Redis is frozen: the 2 s promised
/// (each command may wait on Redis 1.8 s, leaving its reply time to go).
const FROZEN_PUT_LIMIT: Duration = Duration::from_secs(2);
/// Longest `reserve-with-timeout 1` may take then: its timeout and 2 s.
const FROZEN_RESERVE_LIMIT: Duration = Duration::from_secs(3);

/// Clients of one delayq process, ready to find its Redis frozen.
struct Frozen {
    addr: SocketAddr,
    /// Connections putting in the tube `during`, with the ids they use.
    putters: Vec<Client>,
    ids: Vec<String>,
    /// Connections reserving from `default`, where ready jobs wait.
    reservers: Vec<Client>,
}

/// What a client of [`Frozen::round`] was: one of the putters, one of the
/// reservers, or a connection made during the freeze (true: it put).
#[derive(Clone, Copy)]
enum Role {
    Putter,
    Reserver,
    Fresh(bool),
}

/// The slowest replies of one round of [`Frozen::round`].
#[derive(Debug, Default, Clone, Copy)]
struct Slowest {
    put: Duration,
    reserve: Duration,
}

impl Frozen {
    /// Three putters and three reservers on delayq at `addr`, and 10 ready
    /// jobs in `default`; `ids` gives the client-chosen ids of every job
    /// (on a cluster, all on the primary to be frozen).
    async fn prepare(addr: SocketAddr, ids: impl Iterator<Item = String>) -> Frozen {
        // Ten ready jobs, then a put for each of the three putters and for a
        // connection made during the freeze, in each of two rounds.
        let mut ids: Vec<String> = ids.take(10 + 4 * 2).collect();
        let mut c = Client::connect(addr).await;
        for id in ids.drain(..10) {
            assert_eq!(
                c.put_id(0, 0, 60, id.as_bytes(), &id).await,
                format!("INSERTED {id}")
            );
        }
        let mut putters = Vec::new();
        let mut reservers = Vec::new();
        for _ in 0..3 {
            let mut p = Client::connect(addr).await;
            assert_eq!(p.cmd("use during").await, "USING during");
            putters.push(p);
            let mut r = Client::connect(addr).await;
            r.ping().await;
            reservers.push(r);
        }
        Frozen {
            addr,
            putters,
            ids,
            reservers,
        }
    }

    /// Every client asks at once while Redis is frozen: each put must be
    /// refused with `INTERNAL_ERROR` and each `reserve-with-timeout 1` must
    /// time out or fail, all in time. Two connections made during the
    /// freeze ask too, a put and a reserve, and must be answered as soon:
    /// opening a connection counts its use of `default` in Redis, which
    /// once held its first reply for 6 to 8 s.
    async fn round(&mut self) -> Slowest {
        let mut tasks = Vec::new();
        let fresh_id = self.ids.pop().expect("an id for the new connection's put");
        for (put, id) in [(true, Some(fresh_id)), (false, None)] {
            let addr = self.addr;
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let mut c = Client::connect(addr).await;
                let reply = match &id {
                    Some(id) => c.put_id(0, 0, 60, id.as_bytes(), id).await,
                    None => c.cmd("reserve-with-timeout 1").await,
                };
                let took = start.elapsed();
                let (ok, limit) = match id {
                    Some(_) => (reply == "INTERNAL_ERROR", FROZEN_PUT_LIMIT),
                    None => (
                        reply == "TIMED_OUT" || reply == "INTERNAL_ERROR",
                        FROZEN_RESERVE_LIMIT,
                    ),
                };
                assert!(
                    ok,
                    "a connection made during the freeze was answered {reply:?}"
                );
                assert!(
                    took <= limit,
                    "a connection made during the freeze was answered after {took:?}"
                );
                (c, Role::Fresh(put), took)
            }));
        }
        for mut p in std::mem::take(&mut self.putters) {
            let id = self.ids.pop().expect("an id for each put");
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let reply = p.put_id(0, 0, 60, id.as_bytes(), &id).await;
                let took = start.elapsed();
                assert_eq!(reply, "INTERNAL_ERROR", "put {id} while Redis is frozen");
                assert!(
                    took <= FROZEN_PUT_LIMIT,
                    "put {id} answered after {took:?} while Redis is frozen"
                );
                (p, Role::Putter, took)
            }));
        }
        for mut r in std::mem::take(&mut self.reservers) {
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                let reply = r.cmd("reserve-with-timeout 1").await;
                let took = start.elapsed();
                assert!(
                    reply == "TIMED_OUT" || reply == "INTERNAL_ERROR",
                    "reserve-with-timeout 1 while Redis is frozen answered {reply:?}"
                );
                assert!(
                    took <= FROZEN_RESERVE_LIMIT,
                    "reserve-with-timeout 1 answered after {took:?} while Redis is frozen"
                );
                (r, Role::Reserver, took)
            }));
        }
        let mut slowest = Slowest::default();
        for task in tasks {
            let (c, role, took) = task
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            match role {
                Role::Putter => self.putters.push(c),
                Role::Reserver => self.reservers.push(c),
                Role::Fresh(_) => {}
            }
            if matches!(role, Role::Putter | Role::Fresh(true)) {
                slowest.put = slowest.put.max(took);
            } else {
                slowest.reserve = slowest.reserve.max(took);
            }
        }
        slowest
    }

    /// After Redis runs again: a new job is taken (within 20 s, while a
    /// cluster heals) and delivered, and every connection of the freeze is
    /// served as usual. Returns how long the first put took to be taken.
    async fn thawed(mut self) -> Duration {
        let thawed = Instant::now();
        let mut c = Client::connect(self.addr).await;
        // `use` needs Redis too (it counts the tube's users there).
        let mut using = false;
        loop {
            if !using {
                match c.cmd("use after").await.as_str() {
                    "USING after" => using = true,
                    "INTERNAL_ERROR" => {}
                    other => panic!("use after answered {other:?}"),
                }
            }
            if using {
                match c.put(0, 0, 60, b"after").await.as_str() {
                    "INTERNAL_ERROR" => {}
                    reply => {
                        assert!(reply.starts_with("INSERTED "), "{reply}");
                        break;
                    }
                }
            }
            assert!(
                thawed.elapsed() < Duration::from_secs(20),
                "delayq still refuses puts 20 s after Redis was let run"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let back = thawed.elapsed();
        assert_eq!(c.cmd("watch after").await, "WATCHING 2");
        assert_eq!(c.cmd("ignore default").await, "WATCHING 1");
        let job = c.reserved("reserve-with-timeout 5").await;
        assert_eq!(job.body, b"after");
        assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
        for p in &mut self.putters {
            assert_eq!(p.cmd("list-tube-used").await, "USING during");
            p.put_ok(0, 0, 60, b"after the freeze").await;
        }
        // Of the 10 ready jobs at most 6 were taken by the reserves the
        // freeze held up (Redis runs them once it runs again).
        for r in &mut self.reservers {
            // A cluster may still be settling on the node that was frozen.
            let line = loop {
                match r.cmd("reserve-with-timeout 5").await.as_str() {
                    "INTERNAL_ERROR" if thawed.elapsed() < Duration::from_secs(20) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    line => break line.to_string(),
                }
            };
            let job = r.job_after("RESERVED", &line).await;
            assert!(job.body.starts_with(b"frozen-"), "{:?}", job.body);
            assert_eq!(r.cmd(&format!("delete {}", job.id)).await, "DELETED");
        }
        back
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_every_reply_in_time() {
    let started = Instant::now();

    // One Redis, frozen whole.
    let redis = RedisServer::start(&[]);
    let daemon = Daemon::redis(&redis.url).await;
    let ids = (0..).map(|n| format!("frozen-{n}"));
    let mut clients = Frozen::prepare(daemon.addr, ids).await;
    redis.signal(libc::SIGSTOP);
    let single = [clients.round().await, clients.round().await];
    redis.signal(libc::SIGCONT);
    let single_back = clients.thawed().await;

    // A cluster, its primary serving the jobs' shards frozen (not the one
    // serving the control slot, which other commands need).
    let cluster = start_shared(|| RedisCluster::start(3, 0)).await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let daemon = Daemon::start(&["--redis-cluster", &seeds]).await;
    let (owners, control) = blocking(&cluster, |c| layout(c, PREFIX)).await;
    let node = blocking(&cluster, move |c| {
        c.masters()
            .into_iter()
            .find(|&m| m != control)
            .expect("another primary")
    })
    .await;
    let mut clients = Frozen::prepare(daemon.addr, ids_on(owners, node, "frozen")).await;
    blocking(&cluster, move |c| c.stop(node)).await;
    let sharded = [clients.round().await, clients.round().await];
    blocking(&cluster, move |c| c.cont(node)).await;
    let sharded_back = clients.thawed().await;

    eprintln!(
        "Redis frozen with SIGSTOP, 4 puts and 4 reserve-with-timeout 1 at once (one of \
         each on a connection made during the freeze), twice: \
         one Redis: slowest {single:?}, puts taken {single_back:.1?} after SIGCONT; \
         cluster (one primary frozen): slowest {sharded:?}, puts taken {sharded_back:.1?} \
         after SIGCONT; in {:.1?}",
        started.elapsed()
    );
}

/// The node serving each shard, a primary that does not serve the control
/// slot, and its replica.
fn not_the_control_slots(cluster: &mut RedisCluster) -> (Vec<usize>, usize, usize) {
    let (owners, control) = layout(cluster, PREFIX);
    let node = cluster
        .masters()
        .into_iter()
        .find(|&m| m != control)
        .expect("another primary");
    (owners, node, cluster.replicas_of(node)[0])
}

/// How long after a frozen primary's replica is promoted puts on its slots
/// must be taken again.
const FOLLOWED_WITHIN: Duration = Duration::from_millis(1500);

/// A primary that hangs (SIGSTOP) rather than dies: its replica is
/// promoted, and delayq follows while the old primary is still frozen. The
/// crate, never told (the frozen node answers nothing, not even `MOVED`),
/// went on sending that primary's slots' calls to it while the other
/// primaries' calls succeeded, so the watchdog, which looked at every call
/// together, never stepped in: puts on those shards failed until SIGCONT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primarys_failover_is_followed_while_it_is_still_frozen() {
    let cluster = start_shared(|| RedisCluster::start(3, 1)).await;
    let (owners, node, replica) = blocking(&cluster, not_the_control_slots).await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let daemon = Daemon::start(&["--redis-cluster", &seeds]).await;
    let mut c = daemon.client().await;
    let mut ids = ids_on(owners.clone(), node, "thawless");
    let id = ids.next().expect("an id");
    let reply = c.put_id(0, 0, 60, b"before", &id).await;
    assert!(reply.starts_with("INSERTED "), "{reply}");

    let frozen = Instant::now();
    blocking(&cluster, move |c| c.stop(node)).await;
    // Traffic for the frozen primary's shards meanwhile, as under load: a
    // put every 0.2 s, each on a connection of its own.
    let busy = Arc::new(AtomicBool::new(true));
    let traffic = {
        let (busy, addr) = (busy.clone(), daemon.addr);
        let mut ids = ids_on(owners.clone(), node, "meanwhile");
        tokio::spawn(async move {
            let mut puts = tokio::task::JoinSet::new();
            while busy.load(Ordering::Relaxed) {
                let id = ids.next().expect("an id");
                puts.spawn(async move {
                    let mut c = Client::connect(addr).await;
                    c.put_id(0, 0, 60, b"meanwhile", &id).await
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Answered, each of them, before the server goes.
            while let Some(reply) = puts.join_next().await {
                let reply = reply.expect("a put");
                assert!(
                    reply.starts_with("INSERTED ") || reply == "INTERNAL_ERROR",
                    "{reply}"
                );
            }
        })
    };
    wait_for_role(&cluster, replica, "master", frozen).await;
    let promoted = frozen.elapsed();
    // Its shards take puts again, the old primary still frozen, and soon:
    // the cluster is asked every 0.5 s, while calls fail, whether their
    // slots have a new primary. (Before, a new connection was made only
    // once calls to a slot had failed for 4 s, and puts came back 8.8 s
    // after the promotion.) A put in flight at the promotion still runs
    // out of time, so the first put is made a little after it.
    tokio::time::sleep(FOLLOWED_WITHIN).await;
    let back = loop {
        let id = ids.next().expect("an id");
        let reply = c.put_id(0, 0, 60, b"after", &id).await;
        if reply.starts_with("INSERTED ") {
            break frozen.elapsed();
        }
        assert_eq!(reply, "INTERNAL_ERROR");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    busy.store(false, Ordering::Relaxed);
    traffic.await.expect("the traffic task");
    assert!(
        back < promoted + FOLLOWED_WITHIN + Duration::from_millis(1500),
        "puts on the frozen primary's shards failed until {back:.1?} after the freeze, \
         its replica promoted after {promoted:.1?}"
    );
    // (Not checked here: that the job put before the freeze reached the
    // replica. Replication is asynchronous, and in one loaded run it had
    // not; what a failover loses, with `--redis-wait` and without, is the
    // primary-killed tests' to measure.)
    blocking(&cluster, move |c| c.cont(node)).await;
    eprintln!(
        "primary frozen: its replica promoted after {promoted:.1?}, puts on its shards \
         taken again after {back:.1?} (the old primary still frozen)"
    );
}

/// `reserve-with-timeout 0` on one process, sent once another process has
/// answered a put: the job is there to take. A process learns what the
/// others made ready from the shards' announcements, which can still be on
/// their way when such a reserve comes; it catches up with them before it
/// answers `TIMED_OUT`. (Without that it missed about a quarter of these.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reserve_that_would_not_wait_takes_what_another_process_just_put() {
    const ROUNDS: usize = 150;
    let seeds = RedisCluster::shared();
    let prefix = crate::common::cluster::unique_prefix();
    let args = ["--redis-cluster", seeds, "--redis-prefix", &prefix];
    let producer_side = Daemon::start(&args).await;
    let worker_side = Daemon::start(&args).await;
    let mut producer = producer_side.client().await;
    let mut worker = worker_side.client().await;
    assert_eq!(producer.cmd("use now").await, "USING now");
    assert_eq!(worker.cmd("watch now").await, "WATCHING 2");
    assert_eq!(worker.cmd("ignore default").await, "WATCHING 1");
    let mut missed = 0;
    for n in 0..ROUNDS {
        let body = format!("job {n}");
        producer.put_ok(0, 0, 60, body.as_bytes()).await;
        let mut line = worker.cmd("reserve-with-timeout 0").await;
        if line == "TIMED_OUT" {
            missed += 1;
            // Taken all the same, so that each round begins with the tube
            // empty.
            line = worker.cmd("reserve-with-timeout 5").await;
        }
        let job = worker.job_after("RESERVED", &line).await;
        assert_eq!(job.body, body.as_bytes(), "the jobs came in the order put");
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    assert_eq!(
        missed, 0,
        "{missed} of {ROUNDS} reserve-with-timeout 0 answered TIMED_OUT with a job put \
         through the other process ready"
    );
}

/// How a primary is made to fail over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failover {
    /// Killed with SIGKILL; started again once its replica took over (it
    /// comes back as a replica).
    Killed,
    /// Frozen with SIGSTOP until its replica took over, then thawed (it
    /// finds it lost its slots, and becomes a replica).
    Frozen,
    /// Killed with SIGKILL, and not started again; delayq was given it as
    /// its only seed.
    KilledSeed,
}

/// Waits until `node`'s `ROLE` begins with `role`, at most a minute after
/// `since`.
async fn wait_for_role(
    cluster: &Shared<RedisCluster>,
    node: usize,
    role: &'static str,
    since: Instant,
) {
    loop {
        let now = blocking(cluster, move |c| c.cli(node, &["ROLE"])).await;
        if now.starts_with(role) {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "node {node} is not {role} a minute after the fault: {now}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After a primary failed over, workers blocked on one process are told of
/// jobs another process puts on that primary's former shards. The cluster
/// client's own resubscription left those shards' channels with no
/// subscriber after such a failover (the old primary, back as a replica,
/// held delayq's subscription with no channels): the jobs stayed ready,
/// unannounced, and the workers waited for ever.
async fn failed_over_shards_reach_blocked_workers(how: Failover) {
    let cluster = start_shared(|| RedisCluster::start(3, 1)).await;
    let (owners, node, replica) = blocking(&cluster, not_the_control_slots).await;
    let seeds = match how {
        // The connections made anew after the failover cannot start from
        // the seeds: they must know the cluster's other nodes by then.
        Failover::KilledSeed => blocking(&cluster, move |c| c.urls()[node].clone()).await,
        Failover::Killed | Failover::Frozen => blocking(&cluster, |c| c.seeds()).await,
    };
    let args = ["--redis-cluster", seeds.as_str()];
    let producer_side = Daemon::on_redis(&args).await;
    let worker_side = Daemon::on_redis(&args).await;
    let mut producer = producer_side.client().await;
    assert_eq!(producer.cmd("use wake").await, "USING wake");
    // Puts through the workers' side too, to tell when it has healed.
    let mut prober = worker_side.client().await;
    assert_eq!(prober.cmd("use wake").await, "USING wake");
    let mut ids = ids_on(owners, node, "wake");

    let failed = Instant::now();
    match how {
        Failover::Killed => {
            blocking(&cluster, move |c| c.kill(node)).await;
            blocking(&cluster, move |c| c.wait_for_failover(node)).await;
            blocking(&cluster, move |c| c.restart(node)).await;
        }
        Failover::Frozen => {
            blocking(&cluster, move |c| c.stop(node)).await;
            wait_for_role(&cluster, replica, "master", failed).await;
            blocking(&cluster, move |c| c.cont(node)).await;
            wait_for_role(&cluster, node, "slave", failed).await;
        }
        Failover::KilledSeed => {
            blocking(&cluster, move |c| c.kill(node)).await;
            blocking(&cluster, move |c| c.wait_for_failover(node)).await;
        }
    }
    // The failed-over shards take puts again through each side. Each
    // process learns of the failover by itself: one may still be waiting
    // for its connection to refresh the slots (and answer its calls
    // `INTERNAL_ERROR`) after the other has healed.
    let mut sides_healed = Vec::new();
    for side in [&mut producer, &mut prober] {
        loop {
            let id = ids.next().expect("an id");
            let reply = side.put_id(0, 0, 60, b"probe", &id).await;
            if reply.starts_with("INSERTED ") {
                assert_eq!(side.cmd(&format!("delete {id}")).await, "DELETED");
                break;
            }
            assert_eq!(reply, "INTERNAL_ERROR");
            assert!(
                failed.elapsed() < Duration::from_secs(60),
                "puts on the failed-over shards still failed 60 s after the fault"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        sides_healed.push(failed.elapsed());
    }
    drop(prober);
    let healed = failed.elapsed();

    let mut workers = Vec::new();
    for _ in 0..3 {
        let mut w = worker_side.client().await;
        assert_eq!(w.cmd("watch wake").await, "WATCHING 2");
        assert_eq!(w.cmd("ignore default").await, "WATCHING 1");
        w.send_line("reserve-with-timeout 30").await;
        workers.push(w);
    }
    // Parked before the jobs come.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let put = Instant::now();
    for n in 0..workers.len() {
        let id = ids.next().expect("an id");
        let reply = producer
            .put_id(0, 0, 60, format!("job {n}").as_bytes(), &id)
            .await;
        assert!(reply.starts_with("INSERTED "), "{reply}");
    }
    for (n, w) in workers.iter_mut().enumerate() {
        let line = w.line_within(Duration::from_secs(35)).await;
        assert!(
            line.starts_with("RESERVED "),
            "worker {n}, blocked on the other process, answered {line} {:.1?} after jobs \
             were put on the shards of the primary that failed over ({how:?})",
            put.elapsed()
        );
        w.job_after("RESERVED", &line).await;
    }
    let served = put.elapsed();
    assert!(
        served < Duration::from_secs(5),
        "the blocked workers got the jobs put on the failed-over shards only after \
         {served:.1?} ({how:?})"
    );
    eprintln!(
        "primary {how:?}: its shards took puts again {healed:.1?} after the fault (through \
         the producers' process after {:.1?}, the workers' after {:.1?}); workers blocked \
         on the other process served in {served:.2?}",
        sides_healed[0], sides_healed[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primarys_shards_reach_workers_blocked_on_another_process() {
    failed_over_shards_reach_blocked_workers(Failover::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_primarys_shards_reach_workers_blocked_on_another_process() {
    failed_over_shards_reach_blocked_workers(Failover::Frozen).await;
}

/// The same, when the primary killed for good was delayq's only seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_blocked_on_another_process_are_served_after_the_only_seed_died() {
    failed_over_shards_reach_blocked_workers(Failover::KilledSeed).await;
}

/// News of a busy tube does not hold up news of another. A process served
/// each tube another process announced in a pass of its own, one after
/// the other, so with workers waiting on a busy tube its announcements
/// queued up ahead of a quiet tube's: a reviewer saw a job put on a quiet
/// tube reach the worker blocked on the other process 1 to 11 s late.
///
/// How the news is gathered into one pass is checked exactly by the
/// broker's unit test (`news_queued_behind_a_busy_tubes_is_served_in_the_same_pass`):
/// on this machine the old fault, brought back, no longer lagged this far
/// (7 and 14 ms median, 203 and 725 ms at worst, 2026-12-06). This one
/// checks the whole way between two processes, by the median of 150 jobs,
/// since the worst of them is at the mercy of a loaded machine. It also
/// caught a second fault: each process looked for the busy tube's jobs in
/// every shard it had heard of, though the other had taken them, and the
/// calls saturated the machine's two cores; in half the runs the median
/// was 110 ms, and CI saw one job take 875 ms (see
/// `an_empty_look_at_a_shard_corrects_what_a_process_believed_it_held`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_tubes_news_does_not_delay_another_tubes() {
    let cluster = start_shared(|| RedisCluster::start(3, 0)).await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let args = ["--redis-cluster", seeds.as_str()];
    let sides = [
        Arc::new(Daemon::on_redis(&args).await),
        Arc::new(Daemon::on_redis(&args).await),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = Vec::new();
    for side in &sides {
        for reserve in ["reserve-with-timeout 2", "reserve-with-timeout 1"].repeat(2) {
            let (side, stop) = (Arc::clone(side), Arc::clone(&stop));
            busy.push(tokio::spawn(async move {
                let mut w = side.client().await;
                assert_eq!(w.cmd("watch busy").await, "WATCHING 2");
                assert_eq!(w.cmd("ignore default").await, "WATCHING 1");
                while !stop.load(Ordering::Relaxed) {
                    let line = w.cmd(reserve).await;
                    if line != "TIMED_OUT" {
                        let job = w.job_after("RESERVED", &line).await;
                        assert_eq!(w.cmd(&format!("delete {}", job.id)).await, "DELETED");
                    }
                }
            }));
        }
        let (side, stop) = (Arc::clone(side), Arc::clone(&stop));
        busy.push(tokio::spawn(async move {
            let mut p = side.client().await;
            assert_eq!(p.cmd("use busy").await, "USING busy");
            // Paced, so that the busy tube's workers are mostly waiting:
            // each announcement then costs the other process a pass.
            while !stop.load(Ordering::Relaxed) {
                assert!(p.put(0, 0, 60, b"busy").await.starts_with("INSERTED "));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    let mut worker = sides[1].client().await;
    assert_eq!(worker.cmd("watch quiet").await, "WATCHING 2");
    assert_eq!(worker.cmd("ignore default").await, "WATCHING 1");
    let mut producer = sides[0].client().await;
    assert_eq!(producer.cmd("use quiet").await, "USING quiet");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut took = Vec::new();
    for n in 0..150 {
        worker.send_line("reserve").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let put = Instant::now();
        let body = format!("quiet {n}");
        assert!(
            producer
                .put(0, 0, 60, body.as_bytes())
                .await
                .starts_with("INSERTED ")
        );
        let line = worker.line_within(Duration::from_secs(30)).await;
        let job = worker.job_after("RESERVED", &line).await;
        took.push(put.elapsed());
        assert_eq!(job.body, body.as_bytes());
        assert_eq!(worker.cmd(&format!("delete {}", job.id)).await, "DELETED");
    }
    took.sort();
    let (median, slowest) = (took[took.len() / 2], took[took.len() - 1]);
    eprintln!(
        "jobs on the quiet tube reached their worker in {median:.2?} (median), \
         {:.2?} (90th percentile), {slowest:.2?} at worst",
        took[took.len() * 9 / 10]
    );
    stop.store(true, Ordering::Relaxed);
    for task in busy {
        task.await.expect("a busy client");
    }
    // A debug build: 2.5 ms median, 9 ms at worst, in three runs
    // (2026-12-06).
    assert!(
        median < Duration::from_millis(250),
        "jobs on the quiet tube reached the worker blocked on the other process only \
         after {median:.2?} (median; {slowest:.2?} at worst)"
    );
}

/// While a primary is frozen and after its replica took over, a job put on
/// a healthy primary's shard reaches the worker blocked for it on another
/// process, the old primary still frozen. The hand-out for it failed while
/// the frozen node held up the calls, and nothing tried again: a reviewer
/// saw the worker wait, in three of five freezes, until the node was thawed
/// (8 to 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_gets_a_healthy_shards_job_while_another_primary_is_frozen() {
    let cluster = start_shared(|| RedisCluster::start(3, 1)).await;
    let (owners, node, replica) = blocking(&cluster, not_the_control_slots).await;
    let healthy = blocking(&cluster, move |c| {
        c.masters()
            .into_iter()
            .find(|&m| m != node)
            .expect("another primary")
    })
    .await;
    let seeds = blocking(&cluster, |c| c.seeds()).await;
    let args = ["--redis-cluster", seeds.as_str()];
    let producer_side = Daemon::on_redis(&args).await;
    let worker_side = Daemon::on_redis(&args).await;
    let mut producer = producer_side.client().await;
    assert_eq!(producer.cmd("use thawless").await, "USING thawless");
    let mut worker = worker_side.client().await;
    assert_eq!(worker.cmd("watch thawless").await, "WATCHING 2");
    assert_eq!(worker.cmd("ignore default").await, "WATCHING 1");
    worker.send_line("reserve-with-timeout 60").await;
    // Parked before the freeze: its first look is not what is tested.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ids = ids_on(owners, healthy, "thawless");

    let frozen = Instant::now();
    blocking(&cluster, move |c| c.stop(node)).await;
    wait_for_role(&cluster, replica, "master", frozen).await;
    let put = loop {
        let reply = producer
            .put_id(0, 0, 60, b"healthy", &ids.next().expect("an id"))
            .await;
        if reply.starts_with("INSERTED ") {
            break Instant::now();
        }
        assert_eq!(reply, "INTERNAL_ERROR");
        assert!(
            frozen.elapsed() < Duration::from_secs(40),
            "puts on a healthy primary's shard still failed 40 s after the freeze"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let line = worker.line_within(Duration::from_secs(62)).await;
    let served = put.elapsed();
    blocking(&cluster, move |c| c.cont(node)).await;
    assert!(line.starts_with("RESERVED "), "{line}");
    assert_eq!(worker.job_after("RESERVED", &line).await.body, b"healthy");
    eprintln!("a healthy shard's job reached the worker {served:.1?} after its put");
    assert!(
        served < Duration::from_secs(12),
        "the worker got a healthy shard's job only {served:.1?} after its put, \
         while another primary was frozen"
    );
}
