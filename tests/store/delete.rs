//! `delete` (any job but one reserved by another connection) and `finish`
//! (only a job the connection holds), with the tube's `cmd-delete`.

use std::time::Duration;

use delayq::job::JobState;
use delayq::names::JobId;
use delayq::store::Store;

use crate::check::{NO_JOBS, ONE_RESERVED, PRI, RESERVED_ONCE, Tweak, counts, job, named};
use crate::env::Env;

store_tests!(
    delete_takes_any_job_not_reserved_by_another_connection,
    delete_spares_a_job_reserved_by_another_connection,
    finish_deletes_only_for_the_holder,
    deleting_what_does_not_exist_counts_nothing,
);

async fn delete_takes_any_job_not_reserved_by_another_connection(env: Env<impl Store>) {
    // The default tube, which outlives its jobs, so its figures stay
    // readable to the end.
    let ready = env.put(job("default")).await;
    let delay = Duration::from_secs(10);
    let delayed = env.put(job("default").delay(delay)).await;
    let buried = env.put(job("default")).await;
    assert_eq!(env.reserve_job(1, &buried).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    let held = env.put(job("default")).await;
    assert_eq!(env.reserve_job(1, &held).await.as_ref(), Some(&held));
    env.check_tube("default", counts(1, 1, 1, 1), 4, 0).await;
    for id in [&ready, &delayed, &buried] {
        assert!(env.broker.delete(2, id).await.unwrap(), "delete {id}");
    }
    env.check_tube("default", ONE_RESERVED, 4, 3).await;
    let by_holder = env.broker.delete(1, &held).await.unwrap();
    assert!(by_holder, "its holder deletes it");
    for id in [&ready, &delayed, &buried, &held] {
        assert_eq!(env.broker.peek(id).await.unwrap(), None, "peek {id}");
        assert_eq!(env.broker.stats_job(id).await.unwrap(), None, "stats {id}");
        let again = env.broker.delete(1, id).await.unwrap();
        assert!(!again, "delete {id} again");
    }
    env.check_tube("default", NO_JOBS, 4, 4).await;
    env.check_server(NO_JOBS, 4, 0, 1).await;
}

async fn delete_spares_a_job_reserved_by_another_connection(env: Env<impl Store>) {
    let id = env.put(job("default")).await;
    assert_eq!(env.reserve(1, &["default"]).await.as_ref(), Some(&id));
    assert!(!env.broker.delete(2, &id).await.unwrap());
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_tube("default", ONE_RESERVED, 1, 0).await;
    assert!(env.broker.delete(1, &id).await.unwrap());
    env.check_tube("default", NO_JOBS, 1, 1).await;
}

async fn finish_deletes_only_for_the_holder(env: Env<impl Store>) {
    let id = env.put(job("default")).await;
    assert!(!env.broker.finish(1, &id).await.unwrap(), "a ready job");
    assert_eq!(env.reserve(1, &["default"]).await.as_ref(), Some(&id));
    assert!(!env.broker.finish(2, &id).await.unwrap(), "another's job");
    env.check_tube("default", ONE_RESERVED, 1, 0).await;
    assert!(env.broker.finish(1, &id).await.unwrap(), "its holder's");
    assert!(!env.broker.finish(1, &id).await.unwrap(), "a job gone");
    env.check_tube("default", NO_JOBS, 1, 1).await;
    env.check_server(NO_JOBS, 1, 0, 1).await;
}

async fn deleting_what_does_not_exist_counts_nothing(env: Env<impl Store>) {
    for id in [JobId::Server(1), JobId::Server(99), named("nothing")] {
        assert!(!env.broker.delete(1, &id).await.unwrap(), "delete {id}");
        assert!(!env.broker.finish(1, &id).await.unwrap(), "finish {id}");
    }
    env.check_tube("default", NO_JOBS, 0, 0).await;
    env.check_server(NO_JOBS, 0, 0, 1).await;
}
