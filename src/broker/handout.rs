//! Hand-out passes: ready jobs go to the connections blocked in `reserve`,
//! longest waiting first, and concurrent callers share passes.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::{error, warn};

use super::Broker;
use super::waiters::{Handout, Head};
use crate::job::Reserved;
use crate::metrics::StoreOp;
use crate::names::Tube;
use crate::store::Store;

/// Waiting connections the first round of a hand-out pass reserves for.
const FIRST_ROUND: usize = 8;
/// The most waiting connections one round reserves for.
const MAX_ROUND: usize = 1024;
/// How soon the timer serves again the tubes of a hand-out that failed.
/// Nothing else would: the news that a tube has ready jobs came once, and
/// the waiters it was for would sleep until the next (a reviewer saw a
/// worker wait 10 s, until a frozen Redis primary was thawed, for a job
/// put on a healthy one).
pub(super) const PASS_RETRY: Duration = Duration::from_millis(500);

/// Which tubes are due a hand-out pass, and which `serve` calls are done.
#[derive(Default)]
pub(super) struct Passes {
    /// Tubes marked since the last pass began.
    marked: Vec<Tube>,
    /// `serve` calls so far: each takes the next number as its ticket.
    requested: u64,
    /// Every ticket up to this one was served by a pass that has finished.
    covered: u64,
}

/// The tubes of a pass that has not finished: marked again if it is dropped.
struct Unfinished<'a> {
    passes: &'a Mutex<Passes>,
    tubes: Vec<Tube>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if self.tubes.is_empty() {
            return;
        }
        let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        for tube in self.tubes.drain(..) {
            if !passes.marked.contains(&tube) {
                passes.marked.push(tube);
            }
        }
    }
}

impl<S: Store> Broker<S> {
    /// Hands ready jobs of `tubes` to the connections waiting on them, longest
    /// waiting first. A job whose waiter has gone is given back, never lost.
    ///
    /// Returns once a hand-out pass that began after this call has finished,
    /// so the caller's jobs are handed out by then. Concurrent calls share
    /// passes: while one runs, the others mark their tubes and wait, and the
    /// next pass serves all they marked at once, so a burst of puts costs a
    /// few passes, not one each.
    ///
    /// `made_ready`: something may have made jobs of `tubes` ready, so that
    /// whatever was known of them having none is forgotten. Without it,
    /// the pass only checks (see [`Broker::serve_waiting`]); were a check
    /// to forget too, then under a burst of reserves each check would make
    /// the next reserves look at the store, and their checks the next.
    pub(super) async fn serve(&self, tubes: &[Tube], made_ready: bool) {
        let ticket = {
            let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
            let waited = if made_ready {
                self.waiters.served(tubes)
            } else {
                self.waiters.waited(tubes)
            };
            if waited.is_empty() {
                return;
            }
            for tube in waited {
                if !passes.marked.contains(&tube) {
                    passes.marked.push(tube);
                }
            }
            passes.requested += 1;
            passes.requested
        };
        let _serving = self.serving.lock().await;
        let (tubes, upto) = {
            let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
            if passes.covered >= ticket {
                return;
            }
            (std::mem::take(&mut passes.marked), passes.requested)
        };
        // Were this pass dropped half way, its tubes are marked again for
        // the next.
        let mut unfinished = Unfinished {
            passes: &self.passes,
            tubes,
        };
        self.pass(&unfinished.tubes).await;
        unfinished.tubes.clear();
        self.passes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .covered = upto;
    }

    /// One hand-out pass over `tubes`. Each round reserves for several
    /// waiting connections at once (on Redis, one call), twice as many as
    /// the round before while every one of them got a job.
    async fn pass(&self, tubes: &[Tube]) {
        let mut tubes = tubes.to_vec();
        let mut next = 0;
        // Whether a waiter got nothing: perhaps a rate held it back, which
        // the timer must then see to as the rate's second ends.
        let mut short = false;
        // The first failure, logged once for the pass: with the store away
        // every waiter's reserve fails at once, and a line each made a
        // burst of them (a reviewer counted 11 in a second).
        let mut failed = None;
        let mut retry: Vec<Tube> = Vec::new();
        while let Some(tube) = tubes.get(next).cloned() {
            next += 1;
            let mut round = FIRST_ROUND;
            loop {
                let heads = self.waiters.heads(&tube, round);
                if heads.is_empty() {
                    break;
                }
                let full = heads.len() == round;
                let (look, _) = self.waiters.look(&[]);
                let asked = Instant::now();
                let got =
                    join_all(heads.iter().map(|h| {
                        self.call(StoreOp::Reserve, self.store.reserve(h.conn, &h.tubes))
                    }))
                    .await;
                let (mut all, mut gave_back) = (full, false);
                for (head, got) in heads.into_iter().zip(got) {
                    match got {
                        Ok(Some(got)) => {
                            let of = got.job.tube.clone();
                            if !self.hand(head, got, asked).await {
                                // Ready again, for the others waiting on
                                // its tube, which need not be this one.
                                gave_back = true;
                                if !tubes.contains(&of) {
                                    tubes.push(of);
                                }
                            }
                        }
                        Ok(None) => {
                            self.waiters.found_empty(&head.tubes, look);
                            all = false;
                            short = true;
                        }
                        Err(e) => {
                            failed.get_or_insert((tube.clone(), e));
                            for t in head.tubes.iter() {
                                if !retry.contains(t) {
                                    retry.push(t.clone());
                                }
                            }
                            all = false;
                        }
                    }
                }
                // A job given back is ready again for the others waiting.
                if !all && !gave_back {
                    break;
                }
                if all {
                    round = (round * 2).min(MAX_ROUND);
                }
            }
        }
        if short {
            self.wake_if_held_back();
        }
        if let Some((tube, e)) = failed {
            warn!(%tube, error = %e, "cannot hand out jobs; trying again shortly");
            let mut later = self.retry.lock().unwrap_or_else(PoisonError::into_inner);
            for t in retry {
                if !later.contains(&t) {
                    later.push(t);
                }
            }
            drop(later);
            self.alarm.schedule(PASS_RETRY);
        }
    }

    /// Hands `got` to the waiter `head`; if it has gone, gives the job back.
    /// Returns whether the waiter got it.
    async fn hand(&self, head: Head, got: Reserved, asked: Instant) -> bool {
        self.alarm.schedule(got.ttr);
        let (id, tube) = (got.job.id.clone(), got.job.tube.clone());
        let handed = match self.waiters.take(head.id) {
            Some(tx) => tx.send(Handout { got, asked }).is_ok(),
            None => false,
        };
        if !handed
            && let Err(e) = self
                .call(StoreOp::GiveBack, self.store.give_back(head.conn, &id))
                .await
        {
            // The job stays reserved by a closed connection; its TTR
            // brings it back.
            error!(job = %id, error = %e, "cannot give back a job");
        }
        if !handed {
            // Whoever found its tube empty meanwhile must look again.
            self.waiters.served(std::slice::from_ref(&tube));
        }
        handed
    }
}
