//! The peeks: `peek` (any job by id), `peek_ready` (what `reserve` takes
//! next), `peek_delayed` (the soonest due), `peek_buried` (what `kick`
//! takes first); none of them changes anything.

use std::time::Duration;

use bytes::Bytes;
use delayq::job::{JobBody, JobState};
use delayq::names::{JobId, Tube};
use delayq::store::Store;

use crate::check::{NO_COUNTERS, PRI, Tweak, counts, job, named, tube};
use crate::env::Env;

store_tests!(
    peek_finds_a_job_in_any_state,
    peek_ready_gives_the_job_reserve_takes_next,
    peek_delayed_gives_the_job_due_soonest,
    peek_buried_gives_the_oldest_burial,
    peeks_at_nothing_find_nothing,
    the_soonest_delayed_job_comes_first_even_once_the_timer_has_looked,
);

/// A peek's answer as (id, tube, body).
fn seen(got: Option<JobBody>) -> Option<(JobId, Tube, Bytes)> {
    got.map(|j| (j.id, j.tube, j.body))
}

async fn peek_finds_a_job_in_any_state(env: Env<impl Store>) {
    let body = |b: &'static [u8]| Bytes::from_static(b);
    let ready = env.put(job("a").body(body(b"r"))).await;
    let delayed = job("b").delay(Duration::from_secs(10)).body(body(b"d"));
    let delayed = env.put(delayed).await;
    let held = env.put(job("c").body(body(b"x"))).await;
    assert_eq!(env.reserve(1, &["c"]).await.as_ref(), Some(&held));
    let buried = env.put(job("c").id("named").body(body(b"z"))).await;
    assert_eq!(buried, named("named"));
    assert_eq!(env.reserve(1, &["c"]).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    for (id, t, b) in [
        (&ready, "a", b"r"),
        (&delayed, "b", b"d"),
        (&held, "c", b"x"),
        (&buried, "c", b"z"),
    ] {
        let got = seen(env.broker.peek(id).await.unwrap());
        assert_eq!(got, Some((id.clone(), tube(t), body(b))), "peek {id}");
    }
    env.check_job(&ready, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    env.check_job(&delayed, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
}

async fn peek_ready_gives_the_job_reserve_takes_next(env: Env<impl Store>) {
    env.put(job("a").pri(10)).await;
    let first = env.put(job("a").pri(5)).await;
    let second = env.put(job("a").pri(5)).await;
    let a = tube("a");
    for want in [&first, &second] {
        let got = env.broker.peek_ready(&a).await.unwrap().map(|j| j.id);
        assert_eq!(got.as_ref(), Some(want), "peek-ready");
        env.check_job(want, JobState::Ready, 5, NO_COUNTERS).await;
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(want));
    }
    env.check_tube("a", counts(1, 2, 0, 0), 3, 0).await;
}

async fn peek_delayed_gives_the_job_due_soonest(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for secs in [30, 10, 20] {
        let delay = Duration::from_secs(secs);
        ids.push(env.put(job("a").delay(delay)).await);
    }
    let a = tube("a");
    for i in [1, 2, 0] {
        let got = env.broker.peek_delayed(&a).await.unwrap().map(|j| j.id);
        assert_eq!(got.as_ref(), Some(&ids[i]), "peek-delayed");
        env.check_job(&ids[i], JobState::Delayed, PRI, NO_COUNTERS)
            .await;
        assert!(env.broker.kick_job(&ids[i]).await.unwrap());
    }
    assert_eq!(env.broker.peek_delayed(&a).await.unwrap(), None);
}

async fn peek_buried_gives_the_oldest_burial(env: Env<impl Store>) {
    let first = env.put(job("a")).await;
    let second = env.put(job("a")).await;
    for id in [&first, &second] {
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(id));
    }
    // The later job buried first, with the more urgent priority: burial
    // order is all that counts.
    assert!(env.broker.bury(1, &second, 2000).await.unwrap());
    assert!(env.broker.bury(1, &first, 1).await.unwrap());
    let a = tube("a");
    let got = env.broker.peek_buried(&a).await.unwrap().map(|j| j.id);
    assert_eq!(got, Some(second.clone()));
    assert!(env.broker.delete(1, &second).await.unwrap());
    let got = env.broker.peek_buried(&a).await.unwrap().map(|j| j.id);
    assert_eq!(got, Some(first));
    env.check_tube("a", counts(0, 0, 0, 1), 2, 1).await;
}

async fn peeks_at_nothing_find_nothing(env: Env<impl Store>) {
    let held = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await, Some(held));
    // A tube whose only job is reserved has nothing to peek at.
    for name in ["a", "default", "nowhere"] {
        let t = tube(name);
        assert_eq!(env.broker.peek_ready(&t).await.unwrap(), None, "{name}");
        assert_eq!(env.broker.peek_delayed(&t).await.unwrap(), None, "{name}");
        assert_eq!(env.broker.peek_buried(&t).await.unwrap(), None, "{name}");
    }
    for id in [JobId::Server(99), named("nothing")] {
        assert_eq!(env.broker.peek(&id).await.unwrap(), None, "peek {id}");
    }
    assert_eq!(
        env.tube_names().await,
        ["default", "a"],
        "peeks create no tube"
    );
}

async fn the_soonest_delayed_job_comes_first_even_once_the_timer_has_looked(env: Env<impl Store>) {
    let ms = Duration::from_millis;
    let (soon, late) = (ms(100), ms(1100));
    let first = env.put(job("a").delay(soon)).await;
    let later = env.put(job("a").delay(late)).await;
    env.advance(ms(150)).await;
    assert!(env.broker.tick().await.unwrap().is_some());
    env.check_job(&first, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    // Put after the timer looked at the tube, due before `later`.
    let sooner = env.put(job("a").delay(ms(500))).await;
    let a = tube("a");
    let got = env.broker.peek_delayed(&a).await.unwrap().map(|j| j.id);
    assert_eq!(got.as_ref(), Some(&sooner), "peek-delayed");
    assert!(env.broker.delete(1, &first).await.unwrap());
    assert_eq!(env.broker.kick(&a, 1).await.unwrap(), 1);
    env.check_job(&later, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
}
