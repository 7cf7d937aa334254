//! What the holder of a reserved job does with it besides finishing it:
//! `release` (ready or delayed, with a new priority) and `bury` (set aside
//! in order of burial); and that no other connection can, nor can anyone
//! with a job not reserved.

use std::time::Duration;

use delayq::job::{Counts, JobCounters, JobState};
use delayq::store::Store;

use crate::check::{
    NO_COUNTERS, NO_JOBS, ONE_RESERVED, PRI, RESERVED_ONCE, TTR, Tweak, counts, job, tube,
};
use crate::env::Env;

const ZERO: Duration = Duration::ZERO;

store_tests!(
    release_readies_the_job_with_its_new_priority,
    release_with_a_delay_delays_the_job,
    release_without_a_delay_resets_the_delay,
    bury_keeps_the_order_of_burial,
    only_the_holder_releases_buries_or_touches,
);

async fn release_readies_the_job_with_its_new_priority(env: Env<impl Store>) {
    let first = env.put(job("a").pri(10)).await;
    let second = env.put(job("a").pri(20)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&first));
    assert!(env.release(1, &first, 30).await);
    let released = JobCounters {
        reserves: 1,
        releases: 1,
        ..NO_COUNTERS
    };
    env.check_job(&first, JobState::Ready, 30, released).await;
    env.check_times(&first, ZERO, ZERO, TTR, ZERO).await;
    env.check_tube("a", counts(2, 0, 0, 0), 2, 0).await;
    // Its new priority, 30, now puts it after the other.
    assert_eq!(env.reserve(1, &["a"]).await, Some(second));
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&first));
    assert!(env.release(1, &first, 2000).await);
    let twice = JobCounters {
        reserves: 2,
        releases: 2,
        ..NO_COUNTERS
    };
    env.check_job(&first, JobState::Ready, 2000, twice).await;
    // Ready again, but no longer urgent.
    let left = Counts {
        ready: 1,
        reserved: 1,
        ..NO_JOBS
    };
    env.check_tube("a", left, 2, 0).await;
    env.check_server(left, 2, 0, 2).await;
}

async fn release_with_a_delay_delays_the_job(env: Env<impl Store>) {
    let id = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    let delay = Duration::from_secs(5);
    let released = env.broker.release(1, &id, 7, delay).await.unwrap();
    assert_eq!(released.map(|r| (r.buried, r.delay)), Some((false, delay)));
    let released = JobCounters {
        reserves: 1,
        releases: 1,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Delayed, 7, released).await;
    env.check_times(&id, ZERO, delay, TTR, delay).await;
    let first = env.broker.peek_delayed(&tube("a")).await.unwrap();
    assert_eq!(first.map(|j| j.id), Some(id.clone()), "peek-delayed");
    assert_eq!(env.reserve(2, &["a"]).await, None);
    let next = env.broker.tick().await.unwrap().expect("a due time");
    env.assert_next_due(next, delay, "tick: next due");
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    env.check_server(counts(0, 0, 1, 0), 1, 0, 2).await;
}

async fn release_without_a_delay_resets_the_delay(env: Env<impl Store>) {
    let delay = Duration::from_secs(10);
    let id = env.put(job("a").delay(delay)).await;
    assert!(env.broker.kick_job(&id).await.unwrap());
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    env.check_times(&id, ZERO, delay, TTR, TTR).await;
    assert!(env.release(1, &id, PRI).await);
    env.check_times(&id, ZERO, ZERO, TTR, ZERO).await;
    let counters = JobCounters {
        reserves: 1,
        releases: 1,
        kicks: 1,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Ready, PRI, counters).await;
}

async fn bury_keeps_the_order_of_burial(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = env.put(job("a")).await;
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        ids.push(id);
    }
    // Buried in another order than put, each with a new priority that
    // would order them otherwise again.
    let order = [(&ids[1], 50), (&ids[2], 2000), (&ids[0], 7)];
    for (id, pri) in order {
        assert!(env.broker.bury(1, id, pri).await.unwrap(), "bury {id}");
    }
    let buried = JobCounters {
        reserves: 1,
        buries: 1,
        ..NO_COUNTERS
    };
    for (id, pri) in order {
        env.check_job(id, JobState::Buried, pri, buried).await;
    }
    env.check_times(&ids[1], ZERO, ZERO, TTR, ZERO).await;
    // Buried jobs are not urgent, whatever their priority.
    env.check_tube("a", counts(0, 0, 0, 3), 3, 0).await;
    env.check_server(counts(0, 0, 0, 3), 3, 0, 2).await;
    let a = tube("a");
    let kicked = JobCounters { kicks: 1, ..buried };
    for (id, pri) in order {
        let first = env.broker.peek_buried(&a).await.unwrap();
        assert_eq!(first.map(|j| j.id).as_ref(), Some(id), "peek-buried");
        assert_eq!(env.broker.kick(&a, 1).await.unwrap(), 1);
        env.check_job(id, JobState::Ready, pri, kicked).await;
    }
    assert_eq!(env.broker.peek_buried(&a).await.unwrap(), None);
}

async fn only_the_holder_releases_buries_or_touches(env: Env<impl Store>) {
    let id = env.put(job("a")).await;
    // Not while it is ready...
    assert!(!env.release(1, &id, PRI).await);
    assert!(!env.broker.bury(1, &id, PRI).await.unwrap());
    assert_eq!(env.broker.touch(1, &id).await.unwrap(), None);
    env.check_job(&id, JobState::Ready, PRI, NO_COUNTERS).await;
    // ...nor by another connection than the one holding it.
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(!env.release(2, &id, PRI).await);
    assert!(!env.broker.bury(2, &id, PRI).await.unwrap());
    assert_eq!(env.broker.touch(2, &id).await.unwrap(), None);
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
    assert_eq!(env.broker.touch(1, &id).await.unwrap(), Some(TTR));
    assert!(env.release(1, &id, PRI).await);
}
