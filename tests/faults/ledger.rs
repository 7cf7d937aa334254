//! The ledger the multi-process tests keep of every put, delivery and
//! `DELETED`, and the delivery guarantees checked against it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Clock slack when comparing our instants with times Redis's clock set
/// (Redis works in whole milliseconds).
const SLACK: Duration = Duration::from_millis(20);

/// How long after its TTR a job held by a killed process may take to reach
/// a worker again (and a job let go by a process shut down gracefully,
/// after the shutdown).
const ORPHAN_SLACK: Duration = Duration::from_secs(6);

/// How a worker's process went away under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of a process whose jobs live in Redis: the jobs it held stay
    /// reserved until their TTR runs out.
    Killed,
    /// SIGKILL of a process that keeps its jobs itself (the durable
    /// embedded engine): the jobs it held are ready again once it restarts,
    /// as their holders' connections died with it.
    Restarted,
    /// SIGTERM: a graceful shutdown gives back the jobs its connections held.
    Terminated,
}

/// A job a worker held when its process went away.
#[derive(Debug, Clone)]
pub struct Orphan {
    pub delivery: Delivery,
    /// When the process was signalled.
    pub lost: Instant,
    pub fault: Fault,
}

/// A job as put.
#[derive(Debug, Clone)]
pub struct Put {
    pub body: Vec<u8>,
    pub delay: u32,
    pub ttr: u32,
    /// Put with its body as its client-chosen id: ids then never repeat,
    /// even if Redis loses the counter server ids come from.
    pub named: bool,
}

/// One `RESERVED` a worker received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub worker: String,
    pub id: String,
    pub body: Vec<u8>,
    /// When the `reserve` was sent (before the reservation was made).
    pub asked: Instant,
    /// When the reply arrived.
    pub at: Instant,
}

/// What was sent and what came back, to be checked once the load is over.
#[derive(Default)]
pub struct Books {
    /// Every put sent, by body (bodies are unique), with when it was sent.
    pub sent: HashMap<Vec<u8>, (Put, Instant)>,
    /// Puts answered `INSERTED`: id -> body.
    pub acked: HashMap<String, Vec<u8>>,
    /// When each put was answered `INSERTED`.
    pub acked_at: HashMap<String, Instant>,
    /// Puts whose connection died before the reply: maybe stored, maybe not.
    pub in_doubt: HashSet<Vec<u8>>,
    /// The puts in doubt that were sent before the fault that cut their
    /// connection off, so the fault caught them awaiting their reply (the
    /// others were sent into a connection already dead).
    pub in_flight: HashSet<Vec<u8>>,
    pub deliveries: Vec<Delivery>,
    /// `DELETED` received: id -> when.
    pub deleted: HashMap<String, Instant>,
    /// Deletes whose connection died before the reply.
    pub delete_in_doubt: HashSet<String>,
    /// Jobs a worker held (reserved, not deleted) when its process went away.
    pub orphans: Vec<Orphan>,
}

/// What every producer and worker of a test records, shared.
#[derive(Default)]
pub struct Ledger {
    books: Mutex<Books>,
    /// Jobs workers hold right now, per worker name.
    holding: Mutex<HashMap<String, usize>>,
    /// Set once every producer has finished: workers then drain and stop.
    pub done: AtomicBool,
    /// Windows of puts sent and not yet all answered (nor cut off), over
    /// every producer: a fault dealt while this is above zero catches puts
    /// awaiting their replies.
    awaiting: AtomicUsize,
    /// The last fault a test dealt a process, and when.
    fault: Mutex<Option<(Instant, Fault)>>,
}

/// What [`Ledger::check`] found.
#[derive(Debug)]
pub struct Summary {
    pub acked: usize,
    pub in_doubt: usize,
    /// Puts in doubt that turned out stored (they were delivered).
    pub in_doubt_stored: usize,
    /// Puts in doubt that a fault caught awaiting their reply.
    pub in_flight: usize,
    pub deliveries: usize,
    /// Acknowledged jobs never delivered: (id, when acknowledged). Empty
    /// unless the check was told loss is possible.
    pub lost: Vec<(String, Instant)>,
    /// Jobs delivered more than once.
    pub redelivered: usize,
    pub orphans: usize,
    /// Deliveries per worker.
    pub per_worker: HashMap<String, usize>,
}

impl Ledger {
    /// The books, locked (a panicking task poisons nothing that matters
    /// here: its entries are whole).
    pub fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many puts were answered `INSERTED` so far.
    pub fn acked_count(&self) -> usize {
        self.books().acked.len()
    }

    /// Puts settled so far: acknowledged, or in doubt (their connection
    /// died first, or they met `INTERNAL_ERROR`).
    pub fn settled_count(&self) -> usize {
        let b = self.books();
        b.acked.len() + b.in_doubt.len()
    }

    /// Puts sent so far, whatever became of them.
    pub fn sent_count(&self) -> usize {
        self.books().sent.len()
    }

    /// The TTR of a delivered job, as it was put.
    pub fn ttr(&self, d: &Delivery) -> Duration {
        Duration::from_secs(self.books().sent[&d.body].0.ttr.into())
    }

    /// What the books say of job `id`, for a failure message.
    pub fn history(&self, id: &str) -> String {
        let b = self.books();
        let now = Instant::now();
        let ago = |t: Instant| now - t;
        let deliveries: Vec<String> = b
            .deliveries
            .iter()
            .filter(|d| d.id == id)
            .map(|d| format!("{} {:?} ago", d.worker, ago(d.at)))
            .collect();
        format!(
            "acknowledged {:?} ago, deliveries [{}], deleted {:?} ago, delete in doubt: {}",
            b.acked_at.get(id).map(|&t| ago(t)),
            deliveries.join(", "),
            b.deleted.get(id).map(|&t| ago(t)),
            b.delete_in_doubt.contains(id)
        )
    }

    /// Records that the test is about to deal `fault` to a process: the
    /// jobs its workers then find themselves cut off from are orphans of it.
    pub fn fault(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), fault));
    }

    /// When the last fault was dealt, if any.
    pub fn fault_at(&self) -> Option<Instant> {
        let fault = self.fault.lock().unwrap_or_else(PoisonError::into_inner);
        fault.map(|(at, _)| at)
    }

    /// The jobs a worker held when its connection died become orphans of
    /// the last fault dealt.
    pub fn orphan(&self, held: impl IntoIterator<Item = Delivery>) {
        let fault = *self.fault.lock().unwrap_or_else(PoisonError::into_inner);
        let (lost, fault) = fault.expect("a connection died without a fault dealt");
        self.books()
            .orphans
            .extend(held.into_iter().map(|delivery| Orphan {
                delivery,
                lost,
                fault,
            }));
    }

    /// How many windows of puts await their replies now.
    pub fn awaiting(&self) -> usize {
        self.awaiting.load(Ordering::SeqCst)
    }

    /// A producer sent a window of puts (and took the time it was sent).
    pub fn window_sent(&self) {
        self.awaiting.fetch_add(1, Ordering::SeqCst);
    }

    /// A window [`Ledger::window_sent`] counted is answered or cut off.
    pub fn window_settled(&self) {
        self.awaiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many jobs `worker` has reserved and not yet settled.
    pub fn holding(&self, worker: &str) -> usize {
        let holding = self.holding.lock().unwrap_or_else(PoisonError::into_inner);
        holding.get(worker).copied().unwrap_or(0)
    }

    /// Records how many jobs `worker` holds now.
    pub fn set_holding(&self, worker: &str, n: usize) {
        let mut holding = self.holding.lock().unwrap_or_else(PoisonError::into_inner);
        holding.insert(worker.to_string(), n);
    }

    /// Checks the guarantees: every acknowledged job delivered, nothing
    /// delivered that was not put, bodies intact, nothing delivered after
    /// its `DELETED`, delays and TTRs respected, no job held by two workers
    /// at once within its TTR, and (if `exactly_once`) no job delivered
    /// twice.
    pub fn check(&self, exactly_once: bool) -> Summary {
        self.check_with(exactly_once, false)
    }

    /// [`Ledger::check`], but if `loss_possible`, acknowledged jobs never
    /// delivered are listed in the summary instead of failing the check
    /// (for a Redis that does not fsync every write).
    pub fn check_with(&self, exactly_once: bool, loss_possible: bool) -> Summary {
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
            loss_possible || missing.is_empty(),
            "{} of {} acknowledged jobs never delivered: {missing:?}",
            missing.len(),
            b.acked.len()
        );
        let lost = missing
            .iter()
            .map(|id| ((*id).clone(), b.acked_at[*id]))
            .collect();
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
        // A job held by a killed process comes back once its TTR has run
        // out; one held by a process shut down gracefully, or by a durable
        // one killed and restarted, at once.
        for orphan in &b.orphans {
            let o = &orphan.delivery;
            if b.delete_in_doubt.contains(&o.id) {
                continue;
            }
            let ttr = Duration::from_secs(b.sent[&o.body].0.ttr.into());
            let again = by_id[o.id.as_str()]
                .iter()
                .find(|d| d.at > o.at)
                .unwrap_or_else(|| {
                    panic!(
                        "job {} held by {} when its process went away ({:?}) never came back",
                        o.id, o.worker, orphan.fault
                    )
                });
            let after = again.at - o.asked;
            let back_by = match orphan.fault {
                Fault::Killed => {
                    assert!(
                        again.at + SLACK >= o.asked + ttr,
                        "job {} came back {after:?} after it was reserved, before its TTR of {ttr:?}",
                        o.id,
                    );
                    o.asked + ttr
                }
                Fault::Terminated | Fault::Restarted => orphan.lost,
            };
            // The timer wakes at least once a second; the rest is slack for
            // a loaded machine and a worker reconnecting.
            assert!(
                again.at <= back_by + ORPHAN_SLACK,
                "job {} came back only {after:?} after it was reserved, with a TTR of {ttr:?} \
                 ({:?})",
                o.id,
                orphan.fault
            );
        }
        // No job is held by two workers at once: a job comes to another
        // worker only once its holder's TTR has run out, or once a graceful
        // shutdown (or a restart that its holder did not live through) took
        // it from its holder.
        let released: HashMap<(&str, &str, Instant), Instant> = b
            .orphans
            .iter()
            .filter(|o| o.fault != Fault::Killed)
            .map(|o| {
                let d = &o.delivery;
                ((d.worker.as_str(), d.id.as_str(), d.at), o.lost)
            })
            .collect();
        for (id, ds) in &by_id {
            let mut ds = ds.clone();
            ds.sort_by_key(|d| d.at);
            for pair in ds.windows(2) {
                let (first, next) = (pair[0], pair[1]);
                let ttr = Duration::from_secs(b.sent[&first.body].0.ttr.into());
                let held_until = released
                    .get(&(first.worker.as_str(), *id, first.at))
                    .copied()
                    .unwrap_or(first.asked + ttr);
                assert!(
                    next.at + SLACK >= held_until,
                    "job {id} went to {} {:?} before {}'s hold of it ended",
                    next.worker,
                    held_until - next.at,
                    first.worker
                );
            }
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
            in_flight: b.in_flight.len(),
            deliveries: b.deliveries.len(),
            lost,
            redelivered,
            orphans: b.orphans.len(),
            per_worker,
        }
    }
}
