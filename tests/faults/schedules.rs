//! Periodic jobs with real processes: each moment of a schedule fires
//! exactly once across several delayq processes sharing one store (one
//! Redis, a Redis Cluster, or the durable engine's data directory), across
//! a SIGKILL of the process that registered it, and after an outage of
//! every process, when it fires once for all the moments it missed.
//!
//! A worker reserves and deletes every firing at once and notes when each
//! came. A firing's id is `<name>@<moment>`, so this ledger says which
//! moment each delivery was, and the checks hold it against the wall-clock
//! times of the kills and starts. The TTR (60 s) outlasts every test, so a
//! moment delivered a second time is a bug, unless the first delivery's
//! `delete` went unanswered because its process was killed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::common::Client;
use crate::common::cluster::{RedisCluster, unique_prefix};
use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;
use crate::conn::Io;
use crate::restarts::Keeper;

/// Where every firing goes, and nothing else.
const TUBE: &str = "beats";
/// Longer than any test: no firing comes back because its TTR ran out.
const TTR: u32 = 60;
const SECOND: u64 = 1000;
/// How long the processes run between two faults.
const UP: Duration = Duration::from_secs(3);
/// How long every process stays down: at least three moments of a 1 s
/// schedule pass with none running.
const OUTAGE: u64 = 3500;
/// How far past a moment the processes are started again after the outage,
/// so that their start-up (reading the schedules included) most likely
/// ends before the next moment and the moment to make up is a known one.
const PAST_MOMENT: u64 = 100;
/// A job put ahead as delayed until its moment must not come sooner; this
/// is slack for the millisecond rounding of the clocks, not for load.
const EARLY_SLACK: u64 = 100;

/// Milliseconds since the epoch, by the wall clock the processes use too.
fn wall_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

async fn sleep_until_wall(at: u64) {
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(wall_ms()))).await;
}

/// A moment as a firing's id or `SCHEDULED` shows it.
fn moment_of(stamp: &str) -> u64 {
    let t = chrono::DateTime::parse_from_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("not a moment: {stamp:?} ({e})"));
    u64::try_from(t.timestamp_millis()).expect("after 1970")
}

/// `ms` as a firing's id shows a moment of whole seconds.
fn stamp(ms: u64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(i64::try_from(ms).expect("fits"))
        .expect("a moment chrono knows");
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The moments of a 1 s schedule from `from` to `to`, both included.
fn seconds(from: u64, to: u64) -> impl Iterator<Item = u64> {
    (from.div_ceil(SECOND)..=to / SECOND).map(|s| s * SECOND)
}

/// Registers `name` on `c`, firing every `every` into [`TUBE`]; returns
/// its first moment.
async fn register(c: &mut Client, name: &str, every: &str) -> u64 {
    let body = format!("{name}-body");
    let line = format!(
        "schedule {name} {TUBE} 0 {TTR} {} every {every}\r\n{body}\r\n",
        body.len()
    );
    c.send(line.as_bytes()).await;
    let reply = c.line().await;
    let first = reply
        .strip_prefix("SCHEDULED ")
        .unwrap_or_else(|| panic!("schedule {name}: {reply:?}"));
    moment_of(first)
}

/// One `RESERVED` of a firing.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    /// When it came (wall clock, ms).
    at: u64,
    /// Whether its `DELETED` came back: if not, the process died first,
    /// and the job may rightly come again.
    deleted: bool,
}

/// What the worker saw, and when it is to stop.
#[derive(Default)]
struct Seen {
    deliveries: Mutex<Vec<Delivery>>,
    /// Set once the schedules are removed: the worker stops at the first
    /// reserve that finds nothing.
    stop: AtomicBool,
}

impl Seen {
    fn all(&self) -> Vec<Delivery> {
        self.deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn push(&self, d: Delivery) -> usize {
        let mut all = self
            .deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        all.push(d);
        all.len() - 1
    }

    fn deleted(&self, n: usize) {
        self.deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[n]
            .deleted = true;
    }

    /// Whether `id` came and its delete was answered.
    fn done(&self, id: &str) -> bool {
        self.all().iter().any(|d| d.id == id && d.deleted)
    }
}

/// Where the worker finds a process: `None` while every one is down.
type Endpoint = watch::Receiver<Option<SocketAddr>>;

/// Reserves and deletes every firing through whichever process `endpoint`
/// names, moving to the next one when its process dies; returns once told
/// to stop and nothing is left.
fn worker(mut endpoint: Endpoint, seen: Arc<Seen>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let addr = *endpoint.borrow_and_update();
            if let Some(addr) = addr
                && let Ok(mut c) = Client::try_connect(addr).await
                && work_on(&mut c, &seen).await.is_ok()
            {
                return;
            }
            tokio::time::timeout(Duration::from_secs(20), endpoint.changed())
                .await
                .expect("the worker's process died and none replaced it")
                .expect("the test keeps the endpoint");
        }
    })
}

async fn work_on(c: &mut Client, seen: &Seen) -> Io<()> {
    assert_eq!(c.try_cmd(&format!("watch {TUBE}")).await?, "WATCHING 2");
    assert_eq!(c.try_cmd("ignore default").await?, "WATCHING 1");
    loop {
        let line = c.try_cmd("reserve-with-timeout 1").await?;
        if line == "TIMED_OUT" {
            if seen.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            continue;
        }
        let (id, _) = c.try_job(&line).await?;
        let n = seen.push(Delivery {
            id: id.clone(),
            at: wall_ms(),
            deleted: false,
        });
        let reply = c.try_cmd(&format!("delete {id}")).await?;
        assert_eq!(reply, "DELETED", "delete {id}");
        seen.deleted(n);
    }
}

/// Tells the worker to stop and waits for it to drain the tube.
async fn finish(worker: JoinHandle<()>, seen: &Seen) {
    seen.stop.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the worker drains the tube")
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

/// When things happened, by the wall clock (ms).
#[derive(Debug, Default)]
struct Timeline {
    /// The schedule's first moment, as `SCHEDULED` said.
    first: u64,
    /// The process that registered it was killed (and replaced), while
    /// others ran on; only for the report.
    registrar_killed: Option<u64>,
    /// Just before the first process of the outage was killed.
    down: u64,
    /// Once the last one was gone.
    all_down: u64,
    /// Just before the first process after the outage was started.
    respawned: u64,
    /// When it first answered (so had read the schedules, or was about to).
    serving: u64,
    /// When the schedule was removed.
    removed: u64,
}

/// What the ledger showed around the outage.
#[derive(Debug)]
struct Outage {
    /// The moment made up for.
    made_up: u64,
    /// The moments that passed with no process running and fired not at all.
    skipped: Vec<u64>,
    /// Moments due during the outage that were already put (ahead, as
    /// delayed jobs) before it, and came after it.
    put_ahead: Vec<u64>,
    /// Deliveries that came again because their delete was cut off.
    redelivered: usize,
}

/// Checks the deliveries of the 1 s schedule `name` against `t`; returns
/// what happened around the outage, and the ledger, for the report.
fn check(name: &str, t: &Timeline, seen: &[Delivery]) -> (Outage, String) {
    let stem = format!("{name}@");
    let mut ledger: BTreeMap<u64, Vec<&Delivery>> = BTreeMap::new();
    for d in seen.iter().filter(|d| d.id.starts_with(&stem)) {
        let m = moment_of(&d.id[stem.len()..]);
        ledger.entry(m).or_default().push(d);
    }
    let shown = show(t, &ledger);
    let count = |m: u64| ledger.get(&m).map_or(0, Vec::len);
    let mut redelivered = 0;
    for (&m, ds) in &ledger {
        let (last, before) = ds.split_last().expect("a delivery");
        assert!(
            before.iter().all(|d| !d.deleted),
            "{stem}{m} delivered again after a delete of it was answered DELETED: \
             {ds:?}\n{shown}"
        );
        // A delete cut off by the outage's kills leaves the job reserved
        // (on Redis until its TTR, past the test's end).
        let cut_off = t.down.saturating_sub(SECOND) <= last.at && last.at <= t.all_down;
        assert!(
            last.deleted || cut_off,
            "{last:?} was never deleted\n{shown}"
        );
        redelivered += before.len();
        for d in ds {
            assert!(
                d.at + EARLY_SLACK >= m,
                "{} delivered {} ms before its moment\n{shown}",
                d.id,
                m - d.at
            );
        }
        assert!(
            m >= t.first,
            "{stem}{m}: a moment before the schedule's first ({})\n{shown}",
            t.first
        );
        // Only a firing already put (up to 1 s ahead) outlives its
        // schedule; the others' processes hear of the removal at once.
        assert!(
            m <= t.removed + 2 * SECOND,
            "{stem}{m} fired {} ms after the schedule was removed\n{shown}",
            m - t.removed
        );
    }

    // With some process up (the registrar's death included), every moment.
    for m in seconds(t.first, t.down - SECOND) {
        assert!(
            count(m) > 0,
            "{stem}{m} never fired before the outage\n{shown}"
        );
    }
    // A moment up to 1 s after the outage began may have been put ahead:
    // it comes late, once a process runs again. Of those after it, none
    // fires until a process is back, and that one makes up for the last.
    let made_up = *ledger
        .range(t.all_down + SECOND + 1..)
        .next()
        .unwrap_or_else(|| panic!("nothing fired after the outage\n{shown}"))
        .0;
    let skipped: Vec<u64> = seconds(t.all_down + SECOND + 1, made_up - 1).collect();
    assert!(
        made_up >= t.respawned / SECOND * SECOND,
        "{stem}{made_up} fired while no process ran (until {})\n{shown}",
        t.respawned
    );
    assert!(
        skipped.len() >= 2,
        "the outage was too short to skip moments: {skipped:?}\n{shown}"
    );
    // Without the making up, the first moment after the outage would be
    // the first one ahead of the restart (put 1 s ahead): a moment not
    // yet passed when the new process answered.
    assert!(
        made_up <= t.serving,
        "no missed moment was made up for: the first fired after the outage, \
         {made_up}, was still ahead when the restarted process answered ({})\n{shown}",
        t.serving
    );
    for m in seconds(made_up, t.removed.saturating_sub(3 * SECOND / 2)) {
        assert!(
            count(m) > 0,
            "{stem}{m} never fired after the outage\n{shown}"
        );
    }
    let put_ahead = ledger
        .range(t.down..=t.all_down + SECOND)
        .map(|(&m, _)| m)
        .collect();
    let outage = Outage {
        made_up,
        skipped,
        put_ahead,
        redelivered,
    };
    (outage, shown)
}

/// The ledger as seconds after the first moment: `+7:1(12)` is a moment
/// delivered once, 12 ms after it; `+8:-` one never delivered; then the
/// events.
fn show(t: &Timeline, ledger: &BTreeMap<u64, Vec<&Delivery>>) -> String {
    let last = ledger.keys().next_back().copied().unwrap_or(t.first);
    let rel = |at: u64| (at as f64 - t.first as f64) / 1000.0;
    let mut out = String::from("ledger (s after the first moment: deliveries (ms late)):");
    for m in seconds(t.first, last.max(t.removed)) {
        let s = (m - t.first) / SECOND;
        match ledger.get(&m) {
            None => write!(out, " +{s}:-"),
            Some(ds) => {
                let late: Vec<String> = ds
                    .iter()
                    .map(|d| (d.at as i64 - m as i64).to_string())
                    .collect();
                write!(out, " +{s}:{}({})", ds.len(), late.join(","))
            }
        }
        .expect("write to a String");
    }
    if let Some(k) = t.registrar_killed {
        write!(out, "; registrar killed {:+.1}", rel(k)).expect("write");
    }
    write!(
        out,
        "; all down {:+.1}..{:+.1}; respawned {:+.1}, answering {:+.1}; removed {:+.1}",
        rel(t.down),
        rel(t.all_down),
        rel(t.respawned),
        rel(t.serving),
        rel(t.removed)
    )
    .expect("write");
    out
}

/// The first time [`PAST_MOMENT`] after a moment that is not before `after`.
fn past_a_moment(after: u64) -> u64 {
    (after.saturating_sub(PAST_MOMENT)).div_ceil(SECOND) * SECOND + PAST_MOMENT
}

/// A store several processes share.
enum Shared {
    Redis(RedisServer),
    /// A key prefix of this test's own on the suite's shared cluster.
    Cluster {
        seeds: &'static str,
        prefix: String,
    },
}

impl Shared {
    async fn start(&self) -> Daemon {
        match self {
            Shared::Redis(redis) => Daemon::redis(&redis.url).await,
            Shared::Cluster { seeds, prefix } => {
                Daemon::start(&["--redis-cluster", seeds, "--redis-prefix", prefix]).await
            }
        }
    }
}

/// `processes` processes on `store`: the schedule is registered on the
/// first, which is killed and replaced after a while; the worker is on the
/// second; then every process is killed, and two are started again.
async fn outage_on_shared_store(store: Shared, processes: usize, what: &str) {
    let started = Instant::now();
    let mut t = Timeline::default();
    let mut daemons = Vec::new();
    for _ in 0..processes {
        daemons.push(store.start().await);
    }
    let mut admin = daemons[0].client().await;
    t.first = register(&mut admin, "beat", "1s").await;
    let registered = admin.schedules().await;
    let seen = Arc::new(Seen::default());
    let (tx, endpoint) = watch::channel(Some(daemons[1].addr));
    let work = worker(endpoint, seen.clone());

    tokio::time::sleep(UP).await;
    t.registrar_killed = Some(wall_ms());
    daemons[0].kill();
    daemons[0] = store.start().await;
    daemons[0].client().await.ping().await;

    tokio::time::sleep(UP).await;
    t.down = wall_ms();
    tx.send(None).expect("the worker listens");
    for d in &mut daemons {
        d.kill();
    }
    t.all_down = wall_ms();
    drop(daemons);

    sleep_until_wall(past_a_moment(t.all_down + OUTAGE)).await;
    t.respawned = wall_ms();
    let first = store.start().await;
    let mut admin = first.client().await;
    admin.ping().await;
    t.serving = wall_ms();
    let second = store.start().await;
    tx.send(Some(second.addr)).expect("the worker listens");
    assert_eq!(
        admin.schedules().await,
        registered,
        "the schedule after every process was killed"
    );

    tokio::time::sleep(UP).await;
    t.removed = wall_ms();
    assert_eq!(admin.cmd("unschedule beat").await, "UNSCHEDULED");
    finish(work, &seen).await;

    let (outage, ledger) = check("beat", &t, &seen.all());
    eprintln!(
        "schedule every 1s on {what}, {processes} processes, its registrar SIGKILLed, then \
         all of them for {} ms: made up for {:+} s, skipped {:?} s, put ahead of the outage \
         and delivered after it {:?} s, {} delivered again after a cut-off delete, in {:.1?}\n{ledger}",
        t.respawned - t.all_down,
        (outage.made_up - t.first) / SECOND,
        rel_seconds(&t, &outage.skipped),
        rel_seconds(&t, &outage.put_ahead),
        outage.redelivered,
        started.elapsed()
    );
}

fn rel_seconds(t: &Timeline, moments: &[u64]) -> Vec<u64> {
    moments.iter().map(|m| (m - t.first) / SECOND).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_fires_each_moment_once_across_processes_kills_and_an_outage() {
    outage_on_shared_store(Shared::Redis(RedisServer::start(&[])), 3, "one Redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_fires_each_moment_once_on_a_cluster_across_kills_and_an_outage() {
    let seeds = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .expect("start the shared cluster");
    let store = Shared::Cluster {
        seeds,
        prefix: unique_prefix(),
    };
    outage_on_shared_store(store, 2, "a Redis Cluster").await;
}

/// The durable engine, one process, fsync on: SIGKILLed, and started again
/// on its data directory after an outage. Besides the 1 s schedule, one of
/// 10 s whose moment was delivered and deleted before the kill: the restart
/// falls in the same 10 s, so the making up fires that moment again, and
/// only the id kept taken in the log stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_durable_schedule_survives_sigkill_and_makes_up_for_the_outage_once() {
    let started = Instant::now();
    let keeper = Keeper::dir(&[]);
    let mut t = Timeline::default();
    let mut daemon = keeper.start().await;
    let mut admin = daemon.client().await;
    let registered_at = wall_ms();
    t.first = register(&mut admin, "beat", "1s").await;
    let slow = register(&mut admin, "slow", "10s").await;
    let slow_id = format!("slow@{}", stamp(slow));
    let registered = admin.schedules().await;
    let seen = Arc::new(Seen::default());
    let (tx, endpoint) = watch::channel(Some(daemon.addr));
    let work = worker(endpoint, seen.clone());

    let deadline = Instant::now() + Duration::from_secs(15);
    while !seen.done(&slow_id) || wall_ms() < registered_at + 3000 {
        assert!(Instant::now() < deadline, "{slow_id} never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone_before: Vec<String> = seen
        .all()
        .into_iter()
        .filter(|d| d.deleted && d.id.starts_with("beat@"))
        .map(|d| d.id)
        .collect();
    t.down = wall_ms();
    tx.send(None).expect("the worker listens");
    daemon.kill();
    t.all_down = wall_ms();

    sleep_until_wall(past_a_moment(t.all_down + OUTAGE)).await;
    t.respawned = wall_ms();
    let daemon = keeper.start().await;
    let mut admin = daemon.client().await;
    admin.ping().await;
    t.serving = wall_ms();
    assert!(
        t.serving + 500 < slow + 10 * SECOND,
        "the restart fell after the next moment of {slow_id}'s schedule: it no longer \
         makes up for {slow_id}"
    );
    tx.send(Some(daemon.addr)).expect("the worker listens");
    assert_eq!(
        admin.schedules().await,
        registered,
        "the schedules after SIGKILL"
    );
    // The ids of firings finished before the kill are still taken.
    let old = gone_before.first().expect("a beat deleted before the kill");
    assert_eq!(
        admin.put_id(0, 0, TTR, b"again", old).await,
        format!("EXISTS {old}"),
        "{old} was deleted before the kill"
    );

    tokio::time::sleep(UP).await;
    t.removed = wall_ms();
    assert_eq!(admin.cmd("unschedule beat").await, "UNSCHEDULED");
    assert_eq!(admin.cmd("unschedule slow").await, "UNSCHEDULED");
    finish(work, &seen).await;

    let all = seen.all();
    let slows: Vec<&Delivery> = all.iter().filter(|d| d.id.starts_with("slow@")).collect();
    assert_eq!(
        slows.iter().filter(|d| d.id == slow_id).count(),
        1,
        "{slow_id}, deleted before the kill, was made up for again: {slows:?}"
    );
    let next_slow = format!("slow@{}", stamp(slow + 10 * SECOND));
    assert!(
        slows.iter().all(|d| d.id == slow_id || d.id == next_slow),
        "{slows:?}"
    );
    let (outage, ledger) = check("beat", &t, &all);
    eprintln!(
        "schedule every 1s on the durable engine, SIGKILLed for {} ms: made up for {:+} s, \
         skipped {:?} s, put ahead of the outage and delivered after it {:?} s, {} delivered \
         again after a cut-off delete; {slow_id} (deleted before the kill) not again; in {:.1?}\n{ledger}",
        t.respawned - t.all_down,
        (outage.made_up - t.first) / SECOND,
        rel_seconds(&t, &outage.skipped),
        rel_seconds(&t, &outage.put_ahead),
        outage.redelivered,
        started.elapsed()
    );
}
