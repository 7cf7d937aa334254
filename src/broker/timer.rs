//! The timer's alarm clock: when the timer must next wake, kept by everyone
//! who creates due times, and a sleep that ends on time to the microsecond.
//!
//! tokio's timers round every deadline up to the next millisecond, so a job
//! due 0.1 ms into a millisecond would be handed out up to 0.9 ms late. The
//! timer therefore sleeps on a kernel timer (a timerfd, which the runtime
//! waits on like a socket); connection timeouts, where a millisecond does not
//! matter, keep using tokio's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// When the timer should next wake.
pub struct Alarm {
    epoch: Instant,
    /// Microseconds since `epoch`; `u64::MAX` while unknown (mid-tick).
    next: AtomicU64,
    notify: Notify,
}

impl Default for Alarm {
    fn default() -> Self {
        Alarm::new()
    }
}

impl Alarm {
    /// An alarm with nothing scheduled.
    pub fn new() -> Alarm {
        Alarm {
            epoch: Instant::now(),
            next: AtomicU64::new(u64::MAX),
            notify: Notify::new(),
        }
    }

    fn at(&self, after: Duration) -> u64 {
        u64::try_from((Instant::now() + after - self.epoch).as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// Something falls due `after` from now: wakes the timer if that is
    /// earlier than what it sleeps towards.
    pub fn schedule(&self, after: Duration) {
        let at = self.at(after);
        if self.next.fetch_min(at, Ordering::AcqRel) > at {
            self.notify.notify_one();
        }
    }

    /// The timer is about to look at the store: until it has, any due time
    /// created must wake it again, since it may not see that one.
    pub fn forget(&self) {
        self.next.store(u64::MAX, Ordering::Release);
    }

    /// The timer found that the next thing falls due `after` from now;
    /// returns that moment as [`Alarm::sleep`] would name it.
    pub fn expect(&self, after: Duration) -> Instant {
        let at = self.at(after);
        self.next.fetch_min(at, Ordering::AcqRel);
        self.instant(at)
    }

    /// Whether the next due time the timer knows of has passed (the timer
    /// is behind: a busy server, or it has not looked yet since a restart).
    pub fn overdue(&self) -> bool {
        let at = self.next.load(Ordering::Acquire);
        at != u64::MAX && self.instant(at) <= Instant::now()
    }

    fn instant(&self, at: u64) -> Instant {
        self.epoch + Duration::from_micros(at)
    }

    /// Sleeps until the earliest due time known, or until an earlier one is
    /// scheduled. Returns the due time if it was reached.
    pub async fn sleep(&self, clock: &mut PreciseSleep) -> Option<Instant> {
        let at = self.next.load(Ordering::Acquire);
        let due = (at != u64::MAX).then(|| self.instant(at));
        let until = async {
            match due {
                None => std::future::pending::<()>().await,
                Some(due) => clock.until(due).await,
            }
        };
        tokio::select! {
            () = until => {}
            () = self.notify.notified() => {}
        }
        // Woken for an earlier due time at the moment this one passed, the
        // timer has reached this one all the same.
        due.filter(|&due| Instant::now() >= due)
    }
}

/// A sleep that ends within microseconds of its deadline.
pub struct PreciseSleep {
    #[cfg(target_os = "linux")]
    fd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Default for PreciseSleep {
    fn default() -> Self {
        PreciseSleep::new()
    }
}

#[cfg(target_os = "linux")]
mod timerfd {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    /// A non-blocking `timerfd` on the monotonic clock.
    pub fn create() -> io::Result<OwnedFd> {
        // SAFETY: timerfd_create takes no pointers; a non-negative result is
        // a new descriptor that we alone own.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Arms the timer to fire once, `after` from now.
    pub fn arm(fd: &OwnedFd, after: Duration) -> io::Result<()> {
        // A zero value would disarm the timer instead.
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec for the call's duration, and
        // the old value is not asked for.
        let rc = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads the expiration count, which resets it; `WouldBlock` if the
    /// timer has not fired.
    pub fn read(fd: &OwnedFd) -> io::Result<u64> {
        let mut count = [0u8; 8];
        // SAFETY: the buffer is 8 writable bytes, as a timerfd read needs.
        let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::from_ne_bytes(count))
    }
}

#[cfg(target_os = "linux")]
impl PreciseSleep {
    /// A precise sleep; if the kernel timer cannot be had, tokio's timer
    /// stands in, a millisecond coarser.
    pub fn new() -> PreciseSleep {
        let fd = timerfd::create().and_then(|fd| {
            // SAFETY: an OwnedFd stays open, and the same descriptor, for as
            // long as the AsyncFd owns it.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .map_err(|e| e.into_parts().1)
        });
        if let Err(e) = &fd {
            tracing::warn!(error = %e, "no timerfd; the timer will be up to 1 ms late");
        }
        PreciseSleep { fd: fd.ok() }
    }

    /// Sleeps until `at`.
    pub async fn until(&mut self, at: Instant) {
        let Some(fd) = &self.fd else {
            return tokio::time::sleep_until(at).await;
        };
        let Some(after) = at
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return;
        };
        // An expiry left over from a sleep that was cut short would end this
        // one early; clear it first. (Should the old timer fire between this
        // read and the new arming, the sleep ends early: a spare tick, never
        // a missed one.)
        let _ = timerfd::read(fd.get_ref());
        if timerfd::arm(fd.get_ref(), after).is_err() {
            return tokio::time::sleep_until(at).await;
        }
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return tokio::time::sleep_until(at).await;
            };
            match ready.try_io(|fd| timerfd::read(fd.get_ref())) {
                Ok(_) => return,
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl PreciseSleep {
    /// tokio's timer: elsewhere than Linux there is no timerfd.
    pub fn new() -> PreciseSleep {
        PreciseSleep {}
    }

    /// Sleeps until `at`, to the millisecond.
    pub async fn until(&mut self, at: Instant) {
        tokio::time::sleep_until(at).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overdue_once_the_next_due_time_has_passed_and_not_while_unknown() {
        let alarm = Alarm::new();
        assert!(!alarm.overdue(), "nothing scheduled");
        alarm.schedule(Duration::from_millis(20));
        assert!(!alarm.overdue(), "due in the future");
        std::thread::sleep(Duration::from_millis(25));
        assert!(alarm.overdue(), "due time passed, the timer has not looked");
        alarm.forget();
        assert!(!alarm.overdue(), "mid-tick: the timer is looking");
        alarm.expect(Duration::from_secs(60));
        assert!(!alarm.overdue());
    }
}
