//! Time: a job's age and time left, and `tick`, which moves what has fallen
//! due (a delayed job to ready, a reserved job past its TTR back to ready
//! with a timeout counted) and says how long until the next due time.
//!
//! Most of what sleeps on a real-time engine is here (the rest: a pause's
//! end, the timer serving a waiting connection); no test sleeps for more
//! than two seconds, and on a manual clock none sleeps at all.

use std::time::Duration;

use delayq::job::{JobCounters, JobState};
use delayq::store::{Store, TubeRef};

use crate::check::{
    NO_COUNTERS, NO_JOBS, ONE_READY, ONE_RESERVED, PRI, RESERVED_ONCE, TTR, Tweak, counts, job,
    tube,
};
use crate::env::Env;

const SECOND: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;

store_tests!(
    a_delayed_jobs_times,
    a_reserved_jobs_times,
    a_delayed_job_becomes_ready_at_its_due_time_and_not_before,
    a_job_past_its_ttr_comes_back_with_a_timeout_counted,
    touch_restarts_the_ttr,
    a_due_job_is_not_held_up_by_a_full_delay_bucket_opened_ahead,
    tick_says_how_long_until_the_earliest_due_time;
    [redis cluster] fails "Redis's tick may report a due time earlier than the next one, or \
                 one that has gone (its timer wakes to open delay buckets ahead, and clears \
                 due times lazily; on a cluster each shard's due time is learnt at its tick)":
    tick_says_nothing_is_due_once_due_times_are_gone;
    redis fails "Redis's timer wakes to open delay buckets ahead, so its tick may report a due \
                 time earlier than the next one":
    tick_says_exactly_when_a_later_delayed_job_is_due,
);

async fn a_delayed_jobs_times(env: Env<impl Store>) {
    let (delay, ttr) = (2 * SECOND, 5 * SECOND);
    let id = env.put(job("a").delay(delay).ttr(ttr)).await;
    let waited = Duration::from_millis(300);
    env.advance(waited).await;
    env.check_times(&id, waited, delay, ttr, delay - waited)
        .await;
    env.check_job(&id, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
}

async fn a_reserved_jobs_times(env: Env<impl Store>) {
    let ttr = 3 * SECOND;
    let id = env.put(job("a").ttr(ttr)).await;
    let (before, after) = (Duration::from_millis(100), Duration::from_millis(300));
    env.advance(before).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    env.advance(after).await;
    // Age counts from the put, time left from the reserve.
    env.check_times(&id, before + after, ZERO, ttr, ttr - after)
        .await;
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
}

async fn a_delayed_job_becomes_ready_at_its_due_time_and_not_before(env: Env<impl Store>) {
    let id = env.put(job("a").delay(SECOND)).await;
    let next = env.broker.tick().await.unwrap().expect("a due time");
    env.assert_next_due(next, SECOND, "tick: next due");
    env.advance(SECOND - env.moment()).await;
    let next = env.broker.tick().await.unwrap().expect("still a due time");
    env.assert_next_due(next, env.moment(), "tick just before: next due");
    env.check_job(&id, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    assert_eq!(env.reserve(1, &["a"]).await, None);
    env.advance(env.moment()).await;
    assert_eq!(env.broker.tick().await.unwrap(), None, "nothing pending");
    env.check_job(&id, JobState::Ready, PRI, NO_COUNTERS).await;
    env.check_times(&id, SECOND, SECOND, TTR, ZERO).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    env.check_server(ONE_READY, 1, 0, 2).await;
    assert_eq!(env.reserve(1, &["a"]).await, Some(id));
}

async fn a_job_past_its_ttr_comes_back_with_a_timeout_counted(env: Env<impl Store>) {
    let id = env.put(job("a").ttr(SECOND)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    let next = env.broker.tick().await.unwrap().expect("a deadline");
    env.assert_next_due(next, SECOND, "tick: next due");
    env.advance(SECOND - env.moment()).await;
    let next = env.broker.tick().await.unwrap().expect("still a deadline");
    env.assert_next_due(next, env.moment(), "tick just before: next due");
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    let s = env.stats_job(&id).await;
    env.assert_time(s.time_left, env.moment(), "time-left just before");
    env.check_server(ONE_RESERVED, 1, 0, 2).await;
    env.advance(env.moment()).await;
    assert_eq!(env.broker.tick().await.unwrap(), None, "nothing pending");
    let timed_out = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Ready, PRI, timed_out).await;
    env.check_times(&id, SECOND, ZERO, SECOND, ZERO).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    env.check_server(ONE_READY, 1, 1, 2).await;
    // The old holder has lost it; the next one gets it.
    assert!(!env.broker.finish(1, &id).await.unwrap());
    assert!(!env.release(1, &id, PRI).await);
    assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(&id));
    let again = JobCounters {
        reserves: 2,
        ..timed_out
    };
    env.check_job(&id, JobState::Reserved, PRI, again).await;
    assert!(env.broker.finish(2, &id).await.unwrap());
    env.check_server(NO_JOBS, 1, 1, 1).await;
}

async fn touch_restarts_the_ttr(env: Env<impl Store>) {
    let id = env.put(job("a").ttr(SECOND)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    let step = Duration::from_millis(600);
    env.advance(step).await;
    assert_eq!(env.broker.touch(1, &id).await.unwrap(), Some(SECOND));
    let s = env.stats_job(&id).await;
    env.assert_time(s.time_left, SECOND, "time-left once touched");
    // Past the deadline it had before the touch: still reserved.
    env.advance(step).await;
    let left = SECOND - step;
    let next = env.broker.tick().await.unwrap().expect("the new deadline");
    env.assert_next_due(next, left, "tick: next due");
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_server(ONE_RESERVED, 1, 0, 2).await;
    env.advance(left).await;
    assert_eq!(env.broker.tick().await.unwrap(), None, "nothing pending");
    let timed_out = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Ready, PRI, timed_out).await;
    env.check_server(ONE_READY, 1, 1, 2).await;
}

/// On Redis the jobs due in a given second wait in that second's bucket,
/// which the tick of a tube with jobs falling due opens ahead of the
/// second, a budget of jobs at a time. A job already due, in that tube or
/// another, is moved by the same tick all the same.
async fn a_due_job_is_not_held_up_by_a_full_delay_bucket_opened_ahead(env: Env<impl Store>) {
    let real = env.moment() > Duration::from_micros(1);
    if real {
        next_second().await;
    }
    // More jobs than a tick moves or opens at once (Redis's budget is 250),
    // all due in the same second, two from now.
    let full = (0..600).map(|_| env.put(job("a").delay(2 * SECOND)));
    futures_util::future::join_all(full).await;
    // From the next second on, their bucket is opened ahead; it begins a
    // second later, long after the ticks below.
    if real {
        next_second().await;
    } else {
        env.advance(SECOND).await;
    }
    let soon = Duration::from_millis(20);
    let first = env.put(job("a").delay(soon)).await;
    env.advance(soon).await;
    env.broker.tick().await.unwrap();
    env.check_job(&first, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    // The bucket is not all open yet: the next tick opens more of it.
    let other = env.put(job("b").delay(soon)).await;
    env.advance(soon).await;
    env.broker.tick().await.unwrap();
    env.check_job(&other, JobState::Ready, PRI, NO_COUNTERS)
        .await;
}

/// Sleeps until just after the wall clock's next second begins.
async fn next_second() {
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_millis();
    tokio::time::sleep(Duration::from_millis(u64::from(1005 - into))).await;
}

async fn tick_says_how_long_until_the_earliest_due_time(env: Env<impl Store>) {
    assert_eq!(env.broker.tick().await.unwrap(), None, "nothing pending");
    let next = || async { env.broker.tick().await.unwrap().expect("a due time") };
    env.put(job("a").delay(3 * SECOND)).await;
    env.assert_next_due(next().await, 3 * SECOND, "a delay");
    let watch = env.broker.attach(&tube("b"), TubeRef::Watching).await;
    watch.unwrap();
    assert!(env.broker.pause_tube(&tube("b"), 2 * SECOND).await.unwrap());
    env.assert_next_due(next().await, 2 * SECOND, "a pause, sooner");
    env.put(job("c").ttr(SECOND)).await;
    assert!(env.reserve(1, &["c"]).await.is_some());
    env.assert_next_due(next().await, SECOND, "a TTR, sooner still");
    // A later due time changes nothing.
    env.put(job("d").delay(10 * SECOND)).await;
    env.assert_next_due(next().await, SECOND, "a later delay");
}

async fn tick_says_nothing_is_due_once_due_times_are_gone(env: Env<impl Store>) {
    let delayed = env.put(job("a").delay(3 * SECOND)).await;
    let held = env.put(job("a").ttr(SECOND)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&held));
    assert!(env.broker.pause_tube(&tube("a"), 2 * SECOND).await.unwrap());
    assert!(env.broker.tick().await.unwrap().is_some());
    assert!(env.broker.finish(1, &held).await.unwrap());
    assert!(env.broker.pause_tube(&tube("a"), ZERO).await.unwrap());
    assert!(env.broker.kick_job(&delayed).await.unwrap());
    assert_eq!(env.broker.tick().await.unwrap(), None, "nothing pending");
}

async fn tick_says_exactly_when_a_later_delayed_job_is_due(env: Env<impl Store>) {
    env.put(job("a").delay(SECOND)).await;
    env.put(job("a").delay(3 * SECOND)).await;
    env.advance(SECOND).await;
    let next = env.broker.tick().await.unwrap().expect("the later job");
    env.assert_next_due(next, 2 * SECOND, "tick: next due");
}
