//! Why delayq writes its own log rather than keep jobs in a storage crate:
//! the same work, every change durable before it returns, on each.
//!
//! ```text
//! cargo bench --bench log_choice                  # 50 clients, then 1
//! cargo bench --bench log_choice -- 10 8          # seconds, clients
//! ```
//!
//! The work is the cycle benchmark's without the network: each client puts
//! a 100-byte job and deletes it, again and again, each change acknowledged
//! only once synced.
//!
//! * `delayq log`: the durable engine itself (`delayq::store::log`), state
//!   in memory, changes appended to its log and synced by group commit.
//! * `redb`: the jobs in a redb table (key: the id; value: the job's
//!   fields and body), with the same group commit in front of it: one
//!   thread takes every change waiting, applies them in one write
//!   transaction, commits it (redb's default, `Durability::Immediate`:
//!   synced), then answers them all. Without that, redb's one writer at a
//!   time would sync once per change.
//!
//! fjall is not measured: its journal is synced by a call that holds the
//! journal's lock (no group commit of its own), and as an LSM tree it keeps
//! a second, sorted copy of what delayq already holds in memory.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use delayq::clock::Clock;
use delayq::job::{NewJob, Put, PutOutcome};
use delayq::names::Tube;
use delayq::store::Store;
use delayq::store::log::{Options, open};
use redb::{Database, TableDefinition};
use tokio::sync::oneshot;

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let secs: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(5.0);
    let clients: Vec<usize> = match args.get(1).and_then(|a| a.parse().ok()) {
        Some(n) => vec![n],
        None => vec![50, 1],
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    println!("| engine | clients | cycles/s | syncs/s (redb: commits/s) |");
    println!("| --- | ---: | ---: | ---: |");
    for &c in &clients {
        // Alternated, twice each, so that a slow moment of the machine
        // does not fall on one of them only.
        for _ in 0..2 {
            let dir = tempfile::tempdir().expect("a directory");
            let got = runtime.block_on(delayq_log(dir.path(), c, secs));
            print_row("delayq log", c, got);
            let dir = tempfile::tempdir().expect("a directory");
            let got = runtime.block_on(redb_table(dir.path(), c, secs));
            print_row("redb", c, got);
        }
    }
}

/// Cycles and syncs (or commits), over `secs`.
struct Got {
    cycles: u64,
    syncs: u64,
    secs: f64,
}

fn print_row(engine: &str, clients: usize, g: Got) {
    println!(
        "| {engine} | {clients} | {:.0} | {:.0} |",
        g.cycles as f64 / g.secs,
        g.syncs as f64 / g.secs,
    );
}

fn job(body: &Bytes) -> NewJob {
    NewJob {
        tube: Tube::default_tube(),
        id: None,
        pri: 1024,
        delay: Duration::from_secs(3600),
        ttr: Duration::from_secs(60),
        body: body.clone(),
        life: Default::default(),
    }
}

async fn delayq_log(dir: &std::path::Path, clients: usize, secs: f64) -> Got {
    let store = Arc::new(open(Options::new(dir), Clock::system()).expect("open the log"));
    let body = Bytes::from(vec![b'x'; 100]);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let before = store.stats().await.expect("stats").log.unwrap_or_default();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (store, body) = (store.clone(), body.clone());
        tasks.spawn(async move {
            let mut cycles = 0u64;
            while Instant::now() < until {
                let Ok(Put {
                    outcome: PutOutcome::Inserted(id),
                    ..
                }) = store.put(job(&body)).await
                else {
                    panic!("a put failed");
                };
                assert!(store.delete(0, &id).await.expect("a delete"));
                cycles += 1;
            }
            cycles
        });
    }
    let cycles = tasks.join_all().await.into_iter().sum();
    let after = store.stats().await.expect("stats").log.unwrap_or_default();
    Got {
        cycles,
        syncs: after.syncs - before.syncs,
        secs,
    }
}

/// A change for redb's committing thread, and where to answer it.
enum Change {
    Put(u64, Vec<u8>, oneshot::Sender<()>),
    Delete(u64, oneshot::Sender<()>),
}

async fn redb_table(dir: &std::path::Path, clients: usize, secs: f64) -> Got {
    let db = Database::create(dir.join("jobs.redb")).expect("a redb database");
    let (tx, rx) = mpsc::channel::<Change>();
    let committer = std::thread::spawn(move || {
        let mut commits = 0u64;
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            group.extend(rx.try_iter());
            let txn = db.begin_write().expect("a write transaction");
            {
                let mut table = txn.open_table(JOBS).expect("the table");
                for change in &group {
                    match change {
                        Change::Put(key, value, _) => {
                            table.insert(key, value.as_slice()).expect("insert");
                        }
                        Change::Delete(key, _) => {
                            table.remove(key).expect("remove");
                        }
                    }
                }
            }
            txn.commit().expect("a commit");
            commits += 1;
            for change in group {
                let (Change::Put(_, _, done) | Change::Delete(_, done)) = change;
                let _ = done.send(());
            }
        }
        commits
    });
    // What delayq's put record holds: the job's fields and its body.
    let value = [vec![0u8; 60], vec![b'x'; 100]].concat();
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (tx, value) = (tx.clone(), value.clone());
        tasks.spawn(async move {
            let mut cycles = 0u64;
            while Instant::now() < until {
                let key = (c as u64) << 40 | cycles;
                let (done, wait) = oneshot::channel();
                tx.send(Change::Put(key, value.clone(), done))
                    .expect("send");
                wait.await.expect("committed");
                let (done, wait) = oneshot::channel();
                tx.send(Change::Delete(key, done)).expect("send");
                wait.await.expect("committed");
                cycles += 1;
            }
            cycles
        });
    }
    let cycles = tasks.join_all().await.into_iter().sum();
    drop(tx);
    let commits = committer.join().expect("the committing thread");
    Got {
        cycles,
        // redb syncs at least once per durable commit.
        syncs: commits,
        secs,
    }
}
