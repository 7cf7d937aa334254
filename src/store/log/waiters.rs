//! The connections waiting for their records to be safe, woken in the
//! order of their records.
//!
//! A connection waits for the log to reach its last record. A channel
//! that wakes every waiter whenever the log moves wakes too many: under
//! the default policy the connections a sync released come back with
//! new records while the next sync runs, and each of them was woken at
//! its end only to find its record in the group after. On the cycle
//! benchmark that was half a wake-up (a poll of the whole connection) for
//! every wait. Here each waiter is kept under the record it waits for,
//! and a mark that moves wakes only those it covers.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// How far the log has got as the waiters see it, and who waits.
pub struct Waiters {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Every record up to this one is as safe as the policy asks.
    reached: u64,
    /// Why the log stopped taking changes, if it did.
    failed: Option<Arc<str>>,
    /// The log is gone (the server is stopping): nothing more will move.
    closed: bool,
    /// The waiters, under the record each waits for.
    waiting: BTreeMap<u64, Vec<Waker>>,
}

/// What a wait ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The record is safe.
    Reached,
    /// The log failed before the record was safe, and why.
    Failed(Arc<str>),
    /// The log stopped before the record was safe.
    Closed,
}

impl Waiters {
    /// Waiters on a log that has made every record up to `reached` safe.
    pub fn new(reached: u64) -> Waiters {
        Waiters {
            inner: Mutex::new(Inner {
                reached,
                failed: None,
                closed: false,
                waiting: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the mark to `reached` (it never goes back) and wakes the
    /// waiters it covers.
    pub fn reach(&self, reached: u64) {
        let woken = {
            let mut inner = self.lock();
            if reached <= inner.reached {
                return;
            }
            inner.reached = reached;
            // `split_off` keeps what is above the mark: the rest is covered.
            let above = inner.waiting.split_off(&(reached + 1));
            std::mem::replace(&mut inner.waiting, above)
        };
        // Woken outside the lock, so that a waiter run at once on another
        // thread does not find it taken.
        woken.into_values().flatten().for_each(Waker::wake);
    }

    /// The log failed: every waiter is woken to learn why.
    pub fn fail(&self, why: Arc<str>) {
        let woken = {
            let mut inner = self.lock();
            if inner.failed.is_some() {
                return;
            }
            inner.failed = Some(why);
            std::mem::take(&mut inner.waiting)
        };
        woken.into_values().flatten().for_each(Waker::wake);
    }

    /// The log is gone: every waiter is woken, and none waits again.
    pub fn close(&self) {
        let woken = {
            let mut inner = self.lock();
            inner.closed = true;
            std::mem::take(&mut inner.waiting)
        };
        woken.into_values().flatten().for_each(Waker::wake);
    }

    /// Waits until record `upto` is safe, the log fails or it is gone.
    pub fn wait(self: &Arc<Self>, upto: u64) -> Wait {
        Wait {
            waiters: Arc::clone(self),
            upto,
            registered: None,
        }
    }
}

/// A wait for one record; see [`Waiters::wait`].
pub struct Wait {
    waiters: Arc<Waiters>,
    upto: u64,
    /// The waker last left in the list, so that a second poll without a
    /// wake-up (a `select!` around the wait) does not add it again.
    registered: Option<Waker>,
}

impl Future for Wait {
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended> {
        let this = &mut *self;
        // Looked at under the lock the marks move under, so that a mark
        // moved between the look and the registration still wakes it.
        let mut inner = this.waiters.lock();
        if inner.reached >= this.upto {
            return Poll::Ready(Ended::Reached);
        }
        if let Some(why) = &inner.failed {
            return Poll::Ready(Ended::Failed(why.clone()));
        }
        if inner.closed {
            return Poll::Ready(Ended::Closed);
        }
        // A waker left here stays until the mark passes `upto` or the log
        // fails or closes, each of which ends the wait: one registered
        // before with the same waker is still in the list.
        if !this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            inner
                .waiting
                .entry(this.upto)
                .or_default()
                .push(cx.waker().clone());
            this.registered = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    fn poll(wait: &mut Wait, waker: &Waker) -> Poll<Ended> {
        Pin::new(wait).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_mark_wakes_only_the_waiters_it_covers() {
        let waiters = Arc::new(Waiters::new(10));
        let (early, early_waker) = counting();
        let (late, late_waker) = counting();
        let mut covered = waiters.wait(12);
        let mut after = waiters.wait(15);
        assert_eq!(poll(&mut covered, &early_waker), Poll::Pending);
        assert_eq!(poll(&mut after, &late_waker), Poll::Pending);
        waiters.reach(12);
        assert_eq!(early.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            late.0.load(Ordering::SeqCst),
            0,
            "its record is not safe yet"
        );
        assert_eq!(
            poll(&mut covered, &early_waker),
            Poll::Ready(Ended::Reached)
        );
        assert_eq!(poll(&mut after, &late_waker), Poll::Pending);
        waiters.reach(11);
        assert_eq!(late.0.load(Ordering::SeqCst), 0, "a mark never goes back");
        waiters.reach(20);
        assert_eq!(late.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(&mut after, &late_waker), Poll::Ready(Ended::Reached));
    }

    #[test]
    fn a_record_already_safe_needs_no_wait() {
        let waiters = Arc::new(Waiters::new(10));
        let (count, waker) = counting();
        assert_eq!(
            poll(&mut waiters.wait(10), &waker),
            Poll::Ready(Ended::Reached)
        );
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn polling_again_registers_once() {
        let waiters = Arc::new(Waiters::new(0));
        let (count, waker) = counting();
        let mut wait = waiters.wait(5);
        for _ in 0..3 {
            assert_eq!(poll(&mut wait, &waker), Poll::Pending);
        }
        waiters.reach(5);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "one wake-up, not three");
    }

    #[test]
    fn a_failure_or_a_close_wakes_everyone_with_the_reason() {
        let waiters = Arc::new(Waiters::new(0));
        let (count, waker) = counting();
        let mut a = waiters.wait(3);
        let mut b = waiters.wait(9);
        assert_eq!(poll(&mut a, &waker), Poll::Pending);
        assert_eq!(poll(&mut b, &waker), Poll::Pending);
        waiters.reach(3);
        waiters.fail(Arc::from("fdatasync failed"));
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(poll(&mut a, &waker), Poll::Ready(Ended::Reached));
        assert_eq!(
            poll(&mut b, &waker),
            Poll::Ready(Ended::Failed(Arc::from("fdatasync failed")))
        );
        let closing = Arc::new(Waiters::new(0));
        let mut c = closing.wait(1);
        assert_eq!(poll(&mut c, &waker), Poll::Pending);
        closing.close();
        assert_eq!(count.0.load(Ordering::SeqCst), 3);
        assert_eq!(poll(&mut c, &waker), Poll::Ready(Ended::Closed));
        assert_eq!(
            poll(&mut closing.wait(1), &waker),
            Poll::Ready(Ended::Closed)
        );
    }
}
