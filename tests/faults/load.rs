//! Producers and workers: the roles the multi-process tests run against
//! delayq processes that may be killed under them, and the helpers that
//! wait for them.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::common::Client;
use crate::conn::{CURRENT, Gone, Io, figure};
use crate::ledger::{Delivery, Ledger, Put};

/// Longest a test waits for its workers to drain everything.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// How long a role waits before trying again after `INTERNAL_ERROR`.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(50);

/// Where a role finds its delayq process: the address changes when the
/// process is killed and restarted, and becomes `None` when it is killed for
/// good.
pub type Endpoint = watch::Receiver<Option<SocketAddr>>;

/// Waits until the endpoint changes (the process was restarted or is gone).
async fn next_endpoint(endpoint: &mut Endpoint, who: &str) {
    match tokio::time::timeout(Duration::from_secs(15), endpoint.changed()).await {
        Ok(_) => {}
        Err(_) => panic!("{who}: lost its connection but no process replaced it"),
    }
}

/// The `n`th job of a test: a unique body, a delay of 0–2 s, the TTR given.
pub fn job(test: &str, n: usize, ttr: u32) -> Put {
    Put {
        body: format!("{test}-{n}").into_bytes(),
        delay: u32::try_from(n % 3).expect("small"),
        ttr,
        named: false,
    }
}

/// [`job`], put with its body as its client-chosen id.
pub fn named_job(test: &str, n: usize, ttr: u32) -> Put {
    Put {
        named: true,
        ..job(test, n, ttr)
    }
}

/// Puts `jobs` through `endpoint`, `window` at a time (pipelined), pausing
/// `pace` between windows. When the process is killed, the puts awaiting a
/// reply are in doubt, and the rest go to its replacement; when it is gone
/// for good, the rest are not put.
pub async fn produce(
    name: &str,
    mut endpoint: Endpoint,
    ledger: Arc<Ledger>,
    jobs: Vec<Put>,
    window: usize,
    pace: Duration,
) {
    let mut conn: Option<Client> = None;
    for chunk in jobs.chunks(window) {
        let c = loop {
            if let Some(c) = conn.as_mut() {
                break c;
            }
            let Some(addr) = *endpoint.borrow_and_update() else {
                return;
            };
            match Client::try_connect(addr).await {
                Ok(c) => conn = Some(c),
                Err(Gone) => next_endpoint(&mut endpoint, name).await,
            }
        };
        let mut msg = Vec::new();
        for put in chunk {
            let name = if put.named {
                format!(" {}", String::from_utf8_lossy(&put.body))
            } else {
                String::new()
            };
            msg.extend_from_slice(
                format!(
                    "put 100 {} {} {}{name}\r\n",
                    put.delay,
                    put.ttr,
                    put.body.len()
                )
                .as_bytes(),
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
        let mut died = c.try_send(&msg).await.is_err();
        let sent = Instant::now();
        // Counted only once `sent` is taken, so that a fault dealt while
        // the count shows it finds the window sent before it.
        let counted = !died;
        if counted {
            ledger.window_sent();
        }
        let mut refused = false;
        while !died && answered < chunk.len() {
            match c.try_line().await {
                Ok(reply) if reply == "INTERNAL_ERROR" => {
                    // Redis went away during the put: it may have been
                    // stored (and its reply lost), or not.
                    ledger.books().in_doubt.insert(chunk[answered].body.clone());
                    answered += 1;
                    refused = true;
                }
                Ok(reply) => {
                    let id = reply
                        .strip_prefix("INSERTED ")
                        .unwrap_or_else(|| panic!("{name}: expected INSERTED <id>, got {reply:?}"));
                    let body = chunk[answered].body.clone();
                    let mut b = ledger.books();
                    let before = b.acked.insert(id.to_string(), body);
                    assert!(before.is_none(), "{name}: id {id} acknowledged twice");
                    b.acked_at.insert(id.to_string(), Instant::now());
                    answered += 1;
                }
                Err(Gone) => died = true,
            }
        }
        if counted {
            ledger.window_settled();
        }
        if refused && !died {
            // Wait for Redis to come back rather than spend every job on it.
            died = wait_for_storage(c).await.is_err();
        }
        if died {
            // The connection died under the last fault dealt: if the chunk
            // was sent before it, its puts were awaiting replies when it came.
            let caught = ledger.fault_at().is_some_and(|at| sent < at);
            {
                let mut b = ledger.books();
                for put in &chunk[answered..] {
                    if caught {
                        b.in_flight.insert(put.body.clone());
                    }
                    b.in_doubt.insert(put.body.clone());
                }
            }
            conn = None;
            next_endpoint(&mut endpoint, name).await;
        }
        tokio::time::sleep(pace).await;
    }
}

/// Polls until the server's storage answers again.
async fn wait_for_storage(c: &mut Client) -> Io<()> {
    let start = Instant::now();
    while !c.storage_answers().await? {
        assert!(start.elapsed() < DRAIN_LIMIT, "the storage never came back");
        tokio::time::sleep(UNAVAILABLE_PAUSE).await;
    }
    Ok(())
}

/// Reserves and deletes through `endpoint`, keeping up to `hold` jobs
/// reserved at a time (deleting the oldest when it has more, and all of them
/// when nothing is ready). Once the ledger is done and `stats` shows no job
/// left anywhere, returns those stats; returns `None` if its process is
/// killed for good.
pub async fn work(
    name: String,
    mut endpoint: Endpoint,
    ledger: Arc<Ledger>,
    hold: usize,
) -> Option<HashMap<String, u64>> {
    loop {
        let addr = (*endpoint.borrow_and_update())?;
        let mut held = VecDeque::new();
        let outcome = match Client::try_connect(addr).await {
            Ok(mut conn) => work_on(&name, &mut conn, &ledger, hold, &mut held).await,
            Err(Gone) => Err(Gone),
        };
        match outcome {
            Ok(stats) => return Some(stats),
            Err(Gone) => {
                ledger.orphan(held);
                ledger.set_holding(&name, 0);
                next_endpoint(&mut endpoint, &name).await;
            }
        }
    }
}

async fn work_on(
    name: &str,
    conn: &mut Client,
    ledger: &Ledger,
    hold: usize,
    held: &mut VecDeque<Delivery>,
) -> Io<HashMap<String, u64>> {
    loop {
        let asked = Instant::now();
        let reply = conn.try_cmd("reserve-with-timeout 1").await?;
        if reply.starts_with("RESERVED ") {
            let (id, body) = conn.try_job(&reply).await?;
            let d = Delivery {
                worker: name.to_string(),
                id,
                body,
                asked,
                at: Instant::now(),
            };
            ledger.books().deliveries.push(d.clone());
            // A job held past its TTR (Redis was away longer) can come back
            // to the same worker: the old hold is over, the new one counts.
            held.retain(|h| h.id != d.id);
            held.push_back(d);
            ledger.set_holding(name, held.len());
            while held.len() > hold {
                delete_oldest(name, conn, ledger, held).await?;
            }
        } else if reply == "INTERNAL_ERROR" {
            // Redis is away; the reserve may have taken a job whose reply
            // was lost, which comes back when its TTR runs out.
            tokio::time::sleep(UNAVAILABLE_PAUSE).await;
        } else if reply == "TIMED_OUT" || reply == "DEADLINE_SOON" {
            while !held.is_empty() {
                delete_oldest(name, conn, ledger, held).await?;
            }
            if reply == "TIMED_OUT" && ledger.done.load(Ordering::SeqCst) {
                let stats = conn.try_stats().await?;
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
    conn: &mut Client,
    ledger: &Ledger,
    held: &mut VecDeque<Delivery>,
) -> Io<()> {
    let d = held.pop_front().expect("a held job");
    ledger.set_holding(name, held.len());
    // After an INTERNAL_ERROR the delete may have happened, its reply lost.
    let mut maybe_done = false;
    loop {
        match conn.try_cmd(&format!("delete {}", d.id)).await {
            Ok(reply) if reply == "DELETED" => {
                ledger.books().deleted.insert(d.id, Instant::now());
                return Ok(());
            }
            Ok(reply) if reply == "INTERNAL_ERROR" => {
                maybe_done = true;
                tokio::time::sleep(UNAVAILABLE_PAUSE).await;
            }
            Ok(reply) if reply == "NOT_FOUND" && maybe_done => {
                ledger.books().delete_in_doubt.insert(d.id);
                return Ok(());
            }
            // Held past its TTR (Redis was away longer than that): the job
            // went back to be done again, as it should.
            Ok(reply) if reply == "NOT_FOUND" && d.asked.elapsed() >= ledger.ttr(&d) => {
                return Ok(());
            }
            Ok(reply) => panic!(
                "{name}: delete {} answered {reply:?}, {:?} after its reserve; {}",
                d.id,
                d.asked.elapsed(),
                ledger.history(&d.id)
            ),
            Err(Gone) => {
                // Still held as far as anyone knows: whatever became of the
                // connection's jobs became of this one.
                ledger.books().delete_in_doubt.insert(d.id.clone());
                held.push_front(d);
                return Err(Gone);
            }
        }
    }
}

/// Waits until `ok` holds, polling; panics after `limit`.
pub async fn wait_until(what: &str, limit: Duration, ok: impl Fn() -> bool) {
    assert!(
        wait_at_most(limit, ok).await,
        "{what}: not within {limit:?}"
    );
}

/// Polls `ok` until it holds, for at most `limit`; says whether it held.
pub async fn wait_at_most(limit: Duration, ok: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

/// Awaits a role's task, failing the test if it panicked or overran. An
/// overrun is first checked against the ledger, which names what is missing.
pub async fn join<T>(what: &str, task: JoinHandle<T>, ledger: &Ledger) -> T {
    join_within(what, task, ledger, DRAIN_LIMIT).await
}

/// [`join`], for a task with up to `limit` of work still to do.
pub async fn join_within<T>(
    what: &str,
    task: JoinHandle<T>,
    ledger: &Ledger,
    limit: Duration,
) -> T {
    match tokio::time::timeout(limit, task).await {
        Ok(done) => done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        Err(_) => {
            ledger.check(false);
            panic!("{what} did not finish within {limit:?}")
        }
    }
}
