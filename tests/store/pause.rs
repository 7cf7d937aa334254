//! `pause_tube`: `reserve` skips a paused tube until the pause ends (or a
//! pause of zero ends it), and the tube's pause figures.

use std::time::Duration;

use delayq::job::JobState;
use delayq::store::{Store, TubeRef};

use crate::check::{NO_JOBS, ONE_READY, ONE_RESERVED, PRI, RESERVED_ONCE, TTR, Tweak, job, tube};
use crate::env::Env;

const SECOND: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;

store_tests!(
    a_paused_tube_is_skipped_until_its_pause_ends,
    a_pause_of_zero_resumes_at_once,
    only_a_tube_that_exists_can_be_paused,
    a_tube_that_goes_away_forgets_its_pause,
);

async fn a_paused_tube_is_skipped_until_its_pause_ends(env: Env<impl Store>) {
    let urgent = env.put(job("a").pri(1)).await;
    let other = env.put(job("b")).await;
    assert!(env.pause("a", SECOND).await);
    env.check_pause("a", 1, SECOND, SECOND).await;
    // The more urgent job waits in its paused tube; peek-ready still sees it.
    assert_eq!(env.reserve(1, &["a", "b"]).await, Some(other));
    assert_eq!(env.reserve(1, &["a"]).await, None);
    let first = env.broker.peek_ready(&tube("a")).await.unwrap();
    let first = first.map(|j| j.id);
    assert_eq!(first.as_ref(), Some(&urgent), "peek-ready on a paused tube");
    let next = env.broker.tick().await.unwrap().expect("the pause's end");
    env.assert_next_due(next, SECOND, "tick: next due");
    env.advance(SECOND - env.moment()).await;
    let next = env.broker.tick().await.unwrap().expect("the pause's end");
    env.assert_next_due(next, env.moment(), "tick just before: next due");
    assert_eq!(env.reserve(1, &["a"]).await, None, "just before the end");
    env.check_pause("a", 1, SECOND, env.moment()).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    // The pause ends with its time, whether or not the timer has run.
    env.advance(env.moment()).await;
    env.check_pause("a", 1, ZERO, ZERO).await;
    assert_eq!(env.reserve(1, &["a"]).await, Some(urgent));
    let next = env.broker.tick().await.unwrap().expect("the TTRs");
    env.assert_next_due(next, TTR - SECOND, "tick: next due, b's job's TTR");
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
    env.check_tube("b", ONE_RESERVED, 1, 0).await;
    env.check_pause("b", 0, ZERO, ZERO).await;
}

async fn a_pause_of_zero_resumes_at_once(env: Env<impl Store>) {
    let id = env.put(job("a")).await;
    assert!(env.pause("a", 60 * SECOND).await);
    assert_eq!(env.reserve(1, &["a"]).await, None);
    assert!(env.pause("a", ZERO).await);
    env.check_pause("a", 2, ZERO, ZERO).await;
    assert_eq!(env.broker.tick().await.unwrap(), None, "no pause pending");
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
}

async fn only_a_tube_that_exists_can_be_paused(env: Env<impl Store>) {
    assert!(!env.pause("nowhere", 10 * SECOND).await);
    assert!(!env.tube_exists("nowhere").await, "pause creates no tube");
    assert_eq!(env.broker.tick().await.unwrap(), None, "no pause pending");
    // The default tube always exists, jobs or not.
    assert!(env.pause("default", 10 * SECOND).await);
    env.check_pause("default", 1, 10 * SECOND, 10 * SECOND)
        .await;
    env.check_server(NO_JOBS, 0, 0, 1).await;
}

async fn a_tube_that_goes_away_forgets_its_pause(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    assert!(env.pause("a", 60 * SECOND).await);
    env.detach("a", TubeRef::Watching).await;
    assert!(!env.tube_exists("a").await);
    assert_eq!(env.broker.tick().await.unwrap(), None, "no pause pending");
    let id = env.put(job("a")).await;
    env.check_pause("a", 0, ZERO, ZERO).await;
    assert_eq!(env.reserve(1, &["a"]).await, Some(id));
}
