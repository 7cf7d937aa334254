//! `reserve` (the most urgent ready job of the unpaused tubes given: lowest
//! priority, then oldest) and `reserve_job` (one job by id, in any state
//! but reserved).

use std::time::Duration;

use delayq::job::{Counts, JobCounters, JobState};
use delayq::names::JobId;
use delayq::store::Store;

use crate::check::{
    NO_COUNTERS, NO_JOBS, ONE_READY, ONE_RESERVED, PRI, RESERVED_ONCE, TTR, Tweak, counts, job,
    tube,
};
use crate::env::Env;

const ZERO: Duration = Duration::ZERO;

store_tests!(
    reserve_takes_the_lowest_priority_first,
    reserve_is_first_in_first_out_within_a_priority,
    reserve_looks_across_all_the_tubes_given,
    reserve_with_nothing_ready_gets_nothing,
    reserve_job_takes_a_ready_delayed_or_buried_job,
    reserve_job_refuses_a_reserved_job,
);

async fn reserve_takes_the_lowest_priority_first(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for pri in [10, 5, 20, u32::MAX] {
        ids.push(env.put(job("a").pri(pri)).await);
    }
    let got = env.broker.reserve(1, &[tube("a")]).await.unwrap();
    let got = got.expect("a ready job");
    let want = (&ids[1], tube("a"), TTR);
    assert_eq!((&got.job.id, got.job.tube, got.ttr), want);
    env.check_job(&ids[1], JobState::Reserved, 5, RESERVED_ONCE)
        .await;
    env.check_times(&ids[1], ZERO, ZERO, TTR, TTR).await;
    // Of the three left, two are urgent.
    let left = Counts {
        urgent: 2,
        ready: 3,
        reserved: 1,
        ..NO_JOBS
    };
    env.check_tube("a", left, 4, 0).await;
    for want in [&ids[0], &ids[2], &ids[3]] {
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(want));
    }
    assert_eq!(env.reserve(1, &["a"]).await, None, "all four are reserved");
    env.check_job(&ids[3], JobState::Reserved, u32::MAX, RESERVED_ONCE)
        .await;
    env.check_tube("a", counts(0, 4, 0, 0), 4, 0).await;
    env.check_server(counts(0, 4, 0, 0), 4, 0, 2).await;
}

async fn reserve_is_first_in_first_out_within_a_priority(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(env.put(job("a").pri(7)).await);
    }
    for want in &ids {
        assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(want));
    }
    assert_eq!(env.reserve(2, &["a"]).await, None);
    env.check_tube("a", counts(0, 3, 0, 0), 3, 0).await;
}

async fn reserve_looks_across_all_the_tubes_given(env: Env<impl Store>) {
    let older = env.put(job("a").pri(10)).await;
    let urgent = env.put(job("b").pri(5)).await;
    let newer = env.put(job("b").pri(10)).await;
    let elsewhere = env.put(job("c").pri(1)).await;
    // The most urgent, then of equal priority the oldest, whatever its
    // tube; never one of a tube not given.
    for want in [&urgent, &older, &newer] {
        assert_eq!(env.reserve(1, &["a", "b"]).await.as_ref(), Some(want));
    }
    assert_eq!(env.reserve(1, &["a", "b"]).await, None);
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
    env.check_tube("b", counts(0, 2, 0, 0), 2, 0).await;
    env.check_tube("c", ONE_READY, 1, 0).await;
    assert_eq!(env.reserve(1, &["b", "c"]).await, Some(elsewhere));
    env.check_server(counts(0, 4, 0, 0), 4, 0, 4).await;
}

async fn reserve_with_nothing_ready_gets_nothing(env: Env<impl Store>) {
    env.put(job("a").delay(Duration::from_secs(10))).await;
    let buried = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    let held = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await, Some(held));
    // Delayed, buried and reserved jobs are not for reserving.
    assert_eq!(env.reserve(2, &["a"]).await, None);
    assert_eq!(env.reserve(2, &["default"]).await, None);
    assert_eq!(env.reserve(2, &["nowhere"]).await, None);
    assert!(!env.tube_exists("nowhere").await, "reserve creates no tube");
    env.check_tube("a", counts(0, 1, 1, 1), 3, 0).await;
    env.check_server(counts(0, 1, 1, 1), 3, 0, 2).await;
}

async fn reserve_job_takes_a_ready_delayed_or_buried_job(env: Env<impl Store>) {
    let ready = env.put(job("a")).await;
    let delay = Duration::from_secs(10);
    let delayed = env.put(job("a").delay(delay)).await;
    let buried = env.put(job("a")).await;
    assert_eq!(env.reserve_job(1, &buried).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    env.check_tube("a", counts(1, 0, 1, 1), 3, 0).await;
    for id in [&ready, &delayed, &buried] {
        let got = env.broker.reserve_job(2, id).await.unwrap();
        let got = got.unwrap_or_else(|| panic!("reserve-job {id}"));
        assert_eq!((&got.job.id, got.ttr), (id, TTR));
    }
    env.check_job(&ready, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_job(&delayed, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    let twice = JobCounters {
        reserves: 2,
        buries: 1,
        ..NO_COUNTERS
    };
    env.check_job(&buried, JobState::Reserved, PRI, twice).await;
    // A delayed job reserved runs on its TTR; its delay is still its delay.
    env.check_times(&delayed, ZERO, delay, TTR, TTR).await;
    // The reserver holds them, not the connection that buried one.
    assert!(!env.broker.finish(1, &buried).await.unwrap());
    assert!(env.broker.finish(2, &buried).await.unwrap());
    env.check_tube("a", counts(0, 2, 0, 0), 3, 1).await;
    env.check_server(counts(0, 2, 0, 0), 3, 0, 2).await;
}

async fn reserve_job_refuses_a_reserved_job(env: Env<impl Store>) {
    let id = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    for conn in [2, 1] {
        let got = env.reserve_job(conn, &id).await;
        assert_eq!(got, None, "reserve-job by connection {conn}");
    }
    let unknown = env.reserve_job(1, &JobId::Server(99)).await;
    assert_eq!(unknown, None, "reserve-job of no job");
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
    assert!(env.broker.finish(1, &id).await.unwrap(), "still 1's");
}
