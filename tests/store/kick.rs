//! `kick` (a tube's buried jobs, oldest burial first, or only if it has
//! none its delayed ones, soonest first; never more than the bound) and
//! `kick_job` (one buried or delayed job).

use std::time::Duration;

use delayq::job::{Counts, JobCounters, JobState};
use delayq::names::JobId;
use delayq::store::Store;

use crate::check::{NO_COUNTERS, NO_JOBS, PRI, TTR, Tweak, counts, job, tube};
use crate::env::Env;

const ZERO: Duration = Duration::ZERO;

/// The counters of a job put and then kicked, nothing else.
const KICKED: JobCounters = JobCounters {
    kicks: 1,
    ..NO_COUNTERS
};

/// The counters of a job reserved and buried, nothing else.
const BURIED: JobCounters = JobCounters {
    reserves: 1,
    buries: 1,
    ..NO_COUNTERS
};

store_tests!(
    kick_takes_buried_jobs_oldest_burial_first,
    kick_takes_delayed_jobs_soonest_first_when_none_is_buried,
    kick_of_nothing_kicks_nothing,
    kick_job_kicks_one_buried_or_delayed_job,
);

async fn kick_takes_buried_jobs_oldest_burial_first(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = env.put(job("a")).await;
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        ids.push(id);
    }
    let delayed = env.put(job("a").delay(Duration::from_secs(10))).await;
    for i in [2, 0, 3, 1] {
        assert!(env.broker.bury(1, &ids[i], PRI).await.unwrap());
    }
    let a = tube("a");
    assert_eq!(env.broker.kick(&a, 2).await.unwrap(), 2, "the bound");
    let kicked = JobCounters { kicks: 1, ..BURIED };
    for (i, state, counters) in [
        (2, JobState::Ready, kicked),
        (0, JobState::Ready, kicked),
        (3, JobState::Buried, BURIED),
        (1, JobState::Buried, BURIED),
    ] {
        env.check_job(&ids[i], state, PRI, counters).await;
    }
    env.check_tube("a", counts(2, 0, 1, 2), 5, 0).await;
    // Only buried jobs while there are any, however high the bound.
    assert_eq!(env.broker.kick(&a, 10).await.unwrap(), 2);
    env.check_job(&ids[1], JobState::Ready, PRI, kicked).await;
    env.check_job(&delayed, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_tube("a", counts(4, 0, 1, 0), 5, 0).await;
    assert_eq!(env.broker.kick(&a, 10).await.unwrap(), 1);
    env.check_job(&delayed, JobState::Ready, PRI, KICKED).await;
    env.check_tube("a", counts(5, 0, 0, 0), 5, 0).await;
    env.check_server(counts(5, 0, 0, 0), 5, 0, 2).await;
}

async fn kick_takes_delayed_jobs_soonest_first_when_none_is_buried(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for secs in [30, 10, 20] {
        let delay = Duration::from_secs(secs);
        ids.push((env.put(job("a").delay(delay)).await, delay));
    }
    assert_eq!(env.broker.kick(&tube("a"), 2).await.unwrap(), 2);
    for (id, delay) in [&ids[1], &ids[2]] {
        env.check_job(id, JobState::Ready, PRI, KICKED).await;
        // A kicked job keeps its delay, and has no time left to wait.
        env.check_times(id, ZERO, *delay, TTR, ZERO).await;
    }
    let (late, delay) = &ids[0];
    env.check_job(late, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_times(late, ZERO, *delay, TTR, *delay).await;
    env.check_tube("a", counts(2, 0, 1, 0), 3, 0).await;
    env.check_server(counts(2, 0, 1, 0), 3, 0, 2).await;
}

async fn kick_of_nothing_kicks_nothing(env: Env<impl Store>) {
    let id = env.put(job("a").delay(Duration::from_secs(10))).await;
    assert_eq!(env.broker.kick(&tube("a"), 0).await.unwrap(), 0, "bound 0");
    env.check_job(&id, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    assert_eq!(env.broker.kick(&tube("default"), 5).await.unwrap(), 0);
    assert_eq!(env.broker.kick(&tube("nowhere"), 5).await.unwrap(), 0);
    assert!(!env.tube_exists("nowhere").await, "kick creates no tube");
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    env.check_server(counts(0, 0, 1, 0), 1, 0, 2).await;
}

async fn kick_job_kicks_one_buried_or_delayed_job(env: Env<impl Store>) {
    let buried = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, 2000).await.unwrap());
    let delayed = env.put(job("a").delay(Duration::from_secs(10))).await;
    let ready = env.put(job("a")).await;
    let held = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&ready));
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&held));
    assert!(env.release(1, &ready, PRI).await);
    for id in [&ready, &held, &JobId::Server(99)] {
        assert!(!env.broker.kick_job(id).await.unwrap(), "kick-job {id}");
    }
    assert!(env.broker.kick_job(&buried).await.unwrap());
    assert!(env.broker.kick_job(&delayed).await.unwrap());
    let kicked = JobCounters { kicks: 1, ..BURIED };
    env.check_job(&buried, JobState::Ready, 2000, kicked).await;
    env.check_job(&delayed, JobState::Ready, PRI, KICKED).await;
    let released = JobCounters {
        reserves: 1,
        releases: 1,
        ..NO_COUNTERS
    };
    env.check_job(&ready, JobState::Ready, PRI, released).await;
    let again = env.broker.kick_job(&buried).await.unwrap();
    assert!(!again, "kicked already");
    // Three ready, two of them urgent (the once buried job's 2000 is not).
    let left = Counts {
        urgent: 2,
        ready: 3,
        reserved: 1,
        ..NO_JOBS
    };
    env.check_tube("a", left, 4, 0).await;
    env.check_server(left, 4, 0, 2).await;
}
