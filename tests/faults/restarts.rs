//! Killing delayq: a process killed and restarted, one of two processes
//! killed for good, and the tube users a killed process leaves behind.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::conn::figure;
use crate::ledger::{Fault, Ledger, Summary};
use crate::load::{job, join, produce, wait_at_most, wait_until, work};

/// Where a test's delayq processes keep their jobs, so that a new process
/// can be started on them after a kill.
pub enum Keeper {
    /// A private redis-server.
    Redis(RedisServer),
    /// A data directory of the durable embedded engine, with the flags each
    /// process gets.
    Dir(tempfile::TempDir, &'static [&'static str]),
}

impl Keeper {
    /// A durable engine's directory, syncing as `flags` say.
    pub fn dir(flags: &'static [&'static str]) -> Keeper {
        Keeper::Dir(tempfile::tempdir().expect("a data directory"), flags)
    }

    /// Starts a delayq process on the jobs kept here.
    pub async fn start(&self) -> Daemon {
        match self {
            Keeper::Redis(redis) => Daemon::redis(&redis.url).await,
            Keeper::Dir(dir, flags) => Daemon::durable(dir.path(), flags).await,
        }
    }

    /// How a SIGKILL leaves the jobs a process's workers held.
    fn fault(&self) -> Fault {
        match self {
            Keeper::Redis(_) => Fault::Killed,
            Keeper::Dir(..) => Fault::Restarted,
        }
    }
}

/// How the producers of [`killed_and_restarted`] put.
#[derive(Debug, Clone, Copy)]
pub struct Producers {
    /// Connections putting at once.
    pub count: usize,
    /// Puts each sends before reading their replies (pipelined).
    pub window: usize,
    /// The pause after each window's replies.
    pub pace: Duration,
}

impl Producers {
    /// `count` producers, each with one put in flight and a pause of 8 ms
    /// after it: a kill mostly finds them between puts.
    pub fn paced(count: usize) -> Producers {
        Producers {
            count,
            window: 1,
            pace: Duration::from_millis(8),
        }
    }

    /// `count` producers, each sending `window` puts at a time with no
    /// pause: a kill finds them awaiting replies.
    pub fn flooding(count: usize, window: usize) -> Producers {
        Producers {
            count,
            window,
            pace: Duration::ZERO,
        }
    }
}

/// SIGKILLs delayq `kills` times under load, each time while the worker
/// holds a job, and starts a new process on the same jobs, with `producers`
/// putting. Nothing acknowledged may be lost; the ledger's checks say when
/// held jobs must come back. Returns what the ledger found.
pub async fn killed_and_restarted(
    keeper: Keeper,
    what: &str,
    kills: usize,
    producers: Producers,
) -> Summary {
    let Producers {
        count: producers,
        window,
        pace,
    } = producers;
    let jobs = 60 * kills * producers;
    let started = Instant::now();
    let mut daemon = keeper.start().await;
    let (tx, endpoint) = watch::channel(Some(daemon.addr));
    let ledger = Arc::new(Ledger::default());
    let share = jobs / producers;
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let puts = (p * share..(p + 1) * share)
                .map(|n| job("restart", n, 2 + (n % 2) as u32))
                .collect();
            let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
            tokio::spawn(async move {
                produce(
                    &format!("producer-{p}"),
                    endpoint,
                    ledger,
                    puts,
                    window,
                    pace,
                )
                .await;
            })
        })
        .collect();
    let worker = tokio::spawn(work("worker".into(), endpoint.clone(), ledger.clone(), 3));

    for k in 1..=kills {
        fault_moment(&ledger, k, kills, jobs).await;
        if window > 1 {
            // Flooding producers are meant to be caught awaiting replies, so
            // the kill waits a little for a moment when some are. Left to
            // chance, no kill of one CI run on a loaded machine caught any.
            // Not longer: the worker should still hold its job, and the
            // producers may have run out of puts.
            wait_at_most(Duration::from_secs(1), || ledger.awaiting() > 0).await;
        }
        ledger.fault(keeper.fault());
        daemon.kill();
        daemon = keeper.start().await;
        tx.send(Some(daemon.addr)).expect("roles listening");
    }
    for (p, task) in tasks.into_iter().enumerate() {
        join(&format!("producer {p}"), task, &ledger).await;
    }
    ledger.done.store(true, Ordering::SeqCst);
    let stats = join("the worker", worker, &ledger)
        .await
        .expect("the worker's process is never gone for good");

    let summary = ledger.check(false);
    eprintln!(
        "delayq ({what}) SIGKILLed {kills} times under load from {producers} producers \
         ({window} puts at a time): {} jobs ledgered, {} lost, {} puts caught awaiting \
         their reply; {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        summary.in_flight,
        started.elapsed()
    );
    // Each kill leaves at most one window in doubt per producer.
    assert!(
        summary.in_doubt <= kills * producers * window,
        "{summary:?}"
    );
    assert_eq!(summary.acked + summary.in_doubt, jobs, "{summary:?}");
    assert!(
        summary.orphans > 0,
        "no kill caught the worker holding a job: {summary:?}"
    );
    if let Keeper::Redis(_) = keeper {
        // Redis counts jobs across restarts; an embedded engine counts those
        // made since it started, as beanstalkd does.
        assert_eq!(
            figure(&stats, "total-jobs"),
            (summary.acked + summary.in_doubt_stored) as u64,
            "every job stored was acknowledged or in doubt"
        );
    }
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayq_killed_and_restarted_loses_nothing() {
    let redis = Keeper::Redis(RedisServer::start(&[]));
    killed_and_restarted(redis, "Redis", crate::scale(10, 50), Producers::paced(1)).await;
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
    ledger.fault(Fault::Killed);
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
    eprintln!(
        "two processes, one SIGKILLed under load: {} jobs ledgered, {} lost; {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        started.elapsed()
    );
    assert!(summary.orphans > 0, "{summary:?}");
    assert!(summary.per_worker.get("worker-a").copied().unwrap_or(0) > 0);
    assert_eq!(
        figure(&stats, "total-jobs"),
        (summary.acked + summary.in_doubt_stored) as u64,
        "every job stored was acknowledged or in doubt"
    );
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
    // (it had no chance to clean up; its mark expires after 3 s, and must
    // be seen missing 2 s more), they must come to count only B's
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
            start.elapsed() < Duration::from_secs(9),
            "9 s after A was killed, `default` still counts A's connection \
             (current-using, current-watching = {users:?}, expected (1, 1)) \
             and list-tubes is {tubes:?}, expected [\"default\"]"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM while producers and workers run: each shutdown is graceful (exit
/// status 0), gives back the jobs its workers held at once, and loses
/// nothing; a new process carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_loses_nothing() {
    let stops = crate::scale(3, 20);
    let jobs = 100 * stops;
    let started = Instant::now();
    let redis = RedisServer::start(&[]);
    let mut daemon = Daemon::redis(&redis.url).await;
    let (tx, endpoint) = watch::channel(Some(daemon.addr));
    let ledger = Arc::new(Ledger::default());
    // A TTR far longer than the test: a job given back at shutdown must come
    // back at once, not when its TTR runs out.
    let puts = (0..jobs).map(|n| job("term", n, 120)).collect();
    let producer = tokio::spawn({
        let (endpoint, ledger) = (endpoint.clone(), ledger.clone());
        async move {
            produce(
                "producer",
                endpoint,
                ledger,
                puts,
                2,
                Duration::from_millis(8),
            )
            .await;
        }
    });
    let worker = tokio::spawn(work("worker".into(), endpoint.clone(), ledger.clone(), 3));
    for k in 1..=stops {
        fault_moment(&ledger, k, stops, jobs).await;
        ledger.fault(Fault::Terminated);
        daemon.signal(libc::SIGTERM);
        let status = daemon.wait_exit();
        assert!(status.success(), "SIGTERM {k}: delayq exited with {status}");
        daemon = Daemon::redis(&redis.url).await;
        tx.send(Some(daemon.addr)).expect("roles listening");
    }
    join("the producer", producer, &ledger).await;
    ledger.done.store(true, Ordering::SeqCst);
    let stats = join("the worker", worker, &ledger)
        .await
        .expect("the worker's process is never gone for good");
    let summary = ledger.check(false);
    eprintln!(
        "delayq stopped with SIGTERM {stops} times under load: {} jobs ledgered, {} lost; \
         {summary:?} in {:?}",
        summary.acked,
        summary.lost.len(),
        started.elapsed()
    );
    assert!(
        summary.orphans > 0,
        "no shutdown caught the worker holding a job: {summary:?}"
    );
    assert_eq!(
        figure(&stats, "total-jobs"),
        (summary.acked + summary.in_doubt_stored) as u64,
        "every job stored was acknowledged or in doubt"
    );
}

/// Waits for the `k`th of `faults` moments spread over a run of `jobs`:
/// once that share of the puts is settled (acknowledged or in doubt: with
/// windows of puts, each fault leaves many in doubt, which are never
/// acknowledged), and while the worker holds a job, so the fault catches it
/// mid-work.
async fn fault_moment(ledger: &Ledger, k: usize, faults: usize, jobs: usize) {
    let enough = k * jobs / (faults + 1);
    wait_until("puts settled", Duration::from_secs(15), || {
        ledger.settled_count() >= enough
    })
    .await;
    wait_until("the worker holds a job", Duration::from_secs(5), || {
        ledger.holding("worker") > 0
    })
    .await;
}

/// How many connections watch `tube`, as `stats-tube` through `c` says;
/// `None` if the tube does not exist.
async fn watching(c: &mut Client, tube: &str) -> Option<u64> {
    let line = c.cmd(&format!("stats-tube {tube}")).await;
    if line == "NOT_FOUND" {
        return None;
    }
    Some(c.yaml_after(&line).await.num("current-watching"))
}

/// Polls [`watching`] until it is `want`, for at most `limit`; panics with
/// `what` and the last answer otherwise.
async fn watching_becomes(
    c: &mut Client,
    tube: &str,
    want: Option<u64>,
    limit: Duration,
    what: &str,
) {
    let start = Instant::now();
    loop {
        let got = watching(c, tube).await;
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: {tube} watched by {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis frozen for longer than the processes' alive marks last (3 s):
/// every mark has expired when it wakes, and the first process to call must
/// not take the others, alive and about to call too, for dead. Each tube
/// here is watched by one process's connection only and paused: before, one
/// of them was forgotten, its pause with it, while its worker still watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_past_the_alive_marks_forgets_no_live_process() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut watchers = Vec::new();
    for (daemon, tube) in [(&a, "held-a"), (&b, "held-b")] {
        let mut w = daemon.client().await;
        assert_eq!(w.cmd(&format!("watch {tube}")).await, "WATCHING 2");
        watchers.push(w);
    }
    let mut c = a.client().await;
    for tube in ["held-a", "held-b"] {
        assert_eq!(c.cmd(&format!("pause-tube {tube} 120")).await, "PAUSED");
    }
    redis.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    redis.signal(libc::SIGCONT);
    // Long enough for a process taken for dead to be forgotten (its mark
    // missing for 2 s, seen by heartbeats every 0.5 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    for tube in ["held-a", "held-b"] {
        let s = c.stats_tube(tube).await;
        assert_eq!(s.num("current-watching"), 1, "{tube}: {s:?}");
        assert!(
            s.num("pause-time-left") > 100,
            "{tube} lost its pause: {s:?}"
        );
    }
    assert_eq!(c.cmd("use held-b").await, "USING held-b");
    c.put_ok(0, 0, 60, b"paused").await;
    assert_eq!(
        watchers[1].cmd("reserve-with-timeout 1").await,
        "TIMED_OUT",
        "the tube is paused"
    );
}

/// A process frozen for a few seconds (its alive mark expired, but it is
/// not yet taken for dead) still keeps the tubes its connections watch:
/// another process's connection letting go of one meanwhile must not make
/// it go, its pause with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_process_keeps_its_tubes_while_another_lets_go() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut on_b = b.client().await;
    assert_eq!(on_b.cmd("watch shared").await, "WATCHING 2");
    let mut on_a = a.client().await;
    assert_eq!(on_a.cmd("watch shared").await, "WATCHING 2");
    let mut c = a.client().await;
    assert_eq!(c.cmd("pause-tube shared 120").await, "PAUSED");
    b.signal(libc::SIGSTOP);
    // B's mark, renewed every 0.5 s, has expired 3 s after its last
    // renewal; it is taken for dead 2 s after that at the soonest.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    drop(on_a);
    tokio::time::sleep(Duration::from_millis(400)).await;
    b.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = c.stats_tube("shared").await;
    assert_eq!(s.num("current-watching"), 1, "{s:?}");
    assert!(s.num("pause-time-left") > 100, "the pause was lost: {s:?}");
}

/// A process frozen long enough to be taken for dead (SIGSTOP: a VM stall)
/// comes back to find the connections it counted forgotten: it counts them
/// again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_taken_for_dead_counts_its_connections_again() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    let mut on_b = b.client().await;
    assert_eq!(on_b.cmd("watch only-b").await, "WATCHING 2");
    let mut c = a.client().await;
    watching_becomes(
        &mut c,
        "only-b",
        Some(1),
        Duration::from_secs(5),
        "B's watcher",
    )
    .await;
    b.signal(libc::SIGSTOP);
    // Its mark expires after 3 s, and is missing 2 s more before A
    // forgets it: the tube, with no jobs and no other watcher, goes too.
    watching_becomes(
        &mut c,
        "only-b",
        None,
        Duration::from_secs(10),
        "B taken for dead",
    )
    .await;
    b.signal(libc::SIGCONT);
    watching_becomes(&mut c, "only-b", Some(1), Duration::from_secs(5), "B back").await;
    assert_eq!(on_b.cmd("reserve-with-timeout 0").await, "TIMED_OUT");
}

/// A `watch` or `use` answered `INTERNAL_ERROR` (Redis hung) leaves no count
/// behind, whether Redis made the change after all or not: the tube goes
/// once the connection has gone, as on beanstalkd. An `ignore` does not
/// wait for Redis: it cannot fail (it answered `INTERNAL_ERROR` and was
/// carried out all the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_watch_or_use_leaves_no_count_behind() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let mut c = a.client().await;
    let mut other = a.client().await;
    assert_eq!(c.cmd("watch left").await, "WATCHING 2");
    redis.signal(libc::SIGSTOP);
    assert_eq!(c.cmd("watch leak-w").await, "INTERNAL_ERROR");
    assert_eq!(c.cmd("use leak-u").await, "INTERNAL_ERROR");
    let asked = Instant::now();
    assert_eq!(c.cmd("ignore left").await, "WATCHING 1");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    redis.signal(libc::SIGCONT);
    assert_eq!(c.cmd("list-tube-used").await, "USING default");
    assert_eq!(c.yaml("list-tubes-watched").await.items, ["default"]);
    drop(c);
    let start = Instant::now();
    loop {
        let tubes = other.tubes().await;
        if tubes == ["default"] {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the failed commands' tubes are still counted: {tubes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
