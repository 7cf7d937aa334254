//! `put`: ready and delayed jobs, server and client ids, the TTR floor, and
//! which priorities count as urgent.

use std::time::Duration;

use bytes::Bytes;
use delayq::job::{Counts, JobState, NewJob, PutOutcome};
use delayq::names::JobId;
use delayq::store::Store;

use crate::check::{NO_COUNTERS, NO_JOBS, ONE_READY, PRI, TTR, Tweak, counts, job, named, tube};
use crate::env::Env;

const ZERO: Duration = Duration::ZERO;

store_tests!(
    put_without_delay_is_ready,
    put_with_delay_is_delayed,
    server_ids_count_up_from_one_and_are_never_reused,
    a_client_id_names_the_job,
    a_repeated_client_id_is_refused_and_changes_nothing,
    a_ttr_below_the_floor_is_raised_to_one_second,
    urgent_means_ready_with_priority_below_1024,
);

async fn put_without_delay_is_ready(env: Env<impl Store>) {
    let hello = Bytes::from_static(b"hello");
    let id = env.put(job("a").pri(5).body(hello.clone())).await;
    assert_eq!(id, JobId::Server(1));
    env.check_job(&id, JobState::Ready, 5, NO_COUNTERS).await;
    env.check_times(&id, ZERO, ZERO, TTR, ZERO).await;
    let got = env.broker.peek(&id).await.unwrap().expect("peek finds it");
    assert_eq!((got.id, got.tube, got.body), (id, tube("a"), hello));
    env.check_tube("a", ONE_READY, 1, 0).await;
    env.check_server(ONE_READY, 1, 0, 2).await;
}

async fn put_with_delay_is_delayed(env: Env<impl Store>) {
    let delay = Duration::from_secs(10);
    let id = env.put(job("a").delay(delay)).await;
    env.check_job(&id, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_times(&id, ZERO, delay, TTR, delay).await;
    let a = tube("a");
    let delayed = env.broker.peek_delayed(&a).await.unwrap();
    assert_eq!(delayed.map(|j| j.id), Some(id), "peek-delayed");
    assert_eq!(env.broker.peek_ready(&a).await.unwrap(), None, "peek-ready");
    // Urgent counts ready jobs only, however urgent a delayed one is.
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    env.check_server(counts(0, 0, 1, 0), 1, 0, 2).await;
}

async fn server_ids_count_up_from_one_and_are_never_reused(env: Env<impl Store>) {
    for want in 1..=3 {
        assert_eq!(env.put(job("a")).await, JobId::Server(want));
    }
    assert!(env.broker.delete(1, &JobId::Server(3)).await.unwrap());
    assert_eq!(env.put(job("a")).await, JobId::Server(4));
    env.check_tube("a", counts(3, 0, 0, 0), 4, 1).await;
    env.check_server(counts(3, 0, 0, 0), 4, 0, 2).await;
}

async fn a_client_id_names_the_job(env: Env<impl Store>) {
    let name = named("order-close:4711");
    let put = env.broker.put(job("a").id("order-close:4711")).await;
    assert_eq!(put.unwrap(), PutOutcome::Inserted(name.clone()));
    let server = env.put(job("a")).await;
    let JobId::Server(last) = server else {
        panic!("a job put without an id gets a server id, not {server}");
    };
    assert_eq!(env.stats_job(&name).await.id, name);
    let got = env.broker.peek(&name).await.unwrap().expect("peek by name");
    assert_eq!(got.id, name);
    // A server id never names a job that has a name of its own.
    for n in 1..=last {
        let found = env.broker.peek(&JobId::Server(n)).await.unwrap();
        let want = (n == last).then(|| server.clone());
        assert_eq!(found.map(|j| j.id), want, "peek {n}");
    }
    env.check_tube("a", counts(2, 0, 0, 0), 2, 0).await;
}

async fn a_repeated_client_id_is_refused_and_changes_nothing(env: Env<impl Store>) {
    let name = named("x");
    let first = job("a").id("x").pri(5).body(&b"one"[..]);
    env.put(first.clone()).await;
    let again = NewJob {
        tube: tube("b"),
        ..first.clone()
    };
    let again = again.pri(1).delay(Duration::from_secs(5)).body(&b"two"[..]);
    let put = env.broker.put(again).await.unwrap();
    assert_eq!(put, PutOutcome::Exists(name.clone()));
    let got = env.broker.peek(&name).await.unwrap().expect("peek by name");
    assert_eq!((got.tube, &got.body[..]), (tube("a"), &b"one"[..]));
    env.check_job(&name, JobState::Ready, 5, NO_COUNTERS).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    env.check_server(ONE_READY, 1, 0, 2).await;
    assert_eq!(env.tube_names().await, ["default", "a"], "no tube b");
    // Once the job is gone, its name is free again.
    assert!(env.broker.delete(1, &name).await.unwrap());
    assert_eq!(env.put(first).await, name);
    env.check_server(ONE_READY, 2, 0, 2).await;
}

async fn a_ttr_below_the_floor_is_raised_to_one_second(env: Env<impl Store>) {
    let second = Duration::from_secs(1);
    let zero = env.put(job("a").ttr(ZERO)).await;
    let above = Duration::from_millis(1500);
    let kept = env.put(job("a").ttr(above)).await;
    env.check_times(&zero, ZERO, ZERO, second, ZERO).await;
    env.check_times(&kept, ZERO, ZERO, above, ZERO).await;
    let got = env.broker.reserve(1, &[tube("a")]).await.unwrap();
    let got = got.expect("a ready job");
    assert_eq!((&got.job.id, got.ttr), (&zero, second));
    env.check_times(&zero, ZERO, ZERO, second, second).await;
}

async fn urgent_means_ready_with_priority_below_1024(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for pri in [0, 1023, 1024, u32::MAX] {
        ids.push(env.put(job("a").pri(pri)).await);
    }
    let tally = |urgent, ready, reserved| Counts {
        urgent,
        ready,
        reserved,
        ..NO_JOBS
    };
    env.check_tube("a", tally(2, 4, 0), 4, 0).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&ids[0]));
    env.check_tube("a", tally(1, 3, 1), 4, 0).await;
    // Back with a priority that is not urgent, then one that is.
    let release = async |id, pri| {
        env.broker
            .release(1, id, pri, ZERO)
            .await
            .map(|r| r.is_some())
    };
    assert!(release(&ids[0], 1024).await.unwrap());
    env.check_tube("a", tally(1, 4, 0), 4, 0).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&ids[1]));
    env.check_tube("a", tally(0, 3, 1), 4, 0).await;
    assert!(release(&ids[1], 1023).await.unwrap());
    env.check_tube("a", tally(1, 4, 0), 4, 0).await;
    env.check_server(tally(1, 4, 0), 4, 0, 2).await;
}
