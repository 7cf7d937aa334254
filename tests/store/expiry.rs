//! A job's time to live (EXTENSION): at the tick after it runs out a job is
//! removed in whatever state it is in (ready, delayed, buried) and counted
//! in its tube's and the server's `expired`; a reserved job stays with its
//! worker, who may still touch, delete or finish it (a plain delete, not
//! counted), and goes, counted, when the worker lets go of it (release,
//! bury, its TTR running out, its connection closing). A tube's `ttl`
//! setting fills in a job's, and the tick's next due time includes the
//! expiries.
//!
//! Real-time engines sleep here for a time to live of one second, or a TTR
//! of two; no test sleeps for more than two seconds.

use std::time::Duration;

use delayq::job::{Backoff, JobCounters, JobState, Lifecycle, NewJob, PutOutcome};
use delayq::names::JobId;
use delayq::store::{Store, TubeRef};

use crate::check::{
    NO_COUNTERS, NO_JOBS, ONE_READY, PRI, RESERVED_ONCE, TTR, Tweak, counts, job, tube,
};
use crate::env::Env;

const SECOND: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;

store_tests!(
    a_ready_job_is_removed_at_the_tick_after_its_ttl,
    a_delayed_job_expires_whether_or_not_its_delay_has_ended,
    a_buried_job_expires,
    a_reserved_job_past_its_ttl_stays_until_its_worker_lets_go,
    a_reserved_job_past_its_ttl_goes_when_its_ttr_runs_out,
    finish_or_delete_of_a_held_job_past_its_ttl_is_a_plain_delete,
    a_job_before_its_ttl_is_kept,
    a_tubes_ttl_is_given_to_the_jobs_put_without_one,
    tick_says_when_the_next_expiry_is_due,
    tick_comes_back_for_the_ids_of_ended_unique_windows,
    an_expired_jobs_unique_window_counts_from_its_ttl_not_the_tick,
);

/// Only a time to live.
fn ttl(d: Duration) -> Lifecycle {
    Lifecycle {
        ttl: Some(d),
        ..Lifecycle::default()
    }
}

/// A job of tube `name` that lives for `d`.
fn living(name: &str, d: Duration) -> NewJob {
    job(name).life(ttl(d))
}

/// Whether a job exists, by `stats-job` and `peek`, which must agree.
async fn exists(env: &Env<impl Store>, id: &JobId) -> bool {
    let stats = env.broker.stats_job(id).await.expect("stats-job");
    let peeked = env.broker.peek(id).await.expect("peek");
    assert_eq!(
        stats.is_some(),
        peeked.is_some(),
        "stats-job and peek on {id}"
    );
    stats.is_some()
}

/// Checks the jobs that expired: in tube `name`, and in all.
async fn check_expired(env: &Env<impl Store>, name: &str, in_tube: u64, in_all: u64) {
    let tube_count = env.stats_tube(name).await.expired;
    let (s, _) = env.broker.stats().await.expect("stats");
    assert_eq!(
        (tube_count, s.expired),
        (in_tube, in_all),
        "expired (in tube {name}, in all)"
    );
}

/// Lets `by` pass and moves what fell due.
async fn pass(env: &Env<impl Store>, by: Duration) {
    env.advance(by).await;
    env.broker.tick().await.expect("tick");
}

/// Whether the engine under test runs on a manual clock, whose times are
/// exact.
fn manual(env: &Env<impl Store>) -> bool {
    env.moment() == Duration::from_micros(1)
}

async fn a_ready_job_is_removed_at_the_tick_after_its_ttl(env: Env<impl Store>) {
    // Used, so that the tube outlives its last job.
    env.attach("a", TubeRef::Using).await;
    let id = env.put(living("a", SECOND)).await;
    let other = env.put(job("b")).await;
    let s = env.stats_job(&id).await;
    assert_eq!(s.life.map(|l| l.options), Some(ttl(SECOND)), "its options");
    check_expired(&env, "a", 0, 0).await;
    // Not before its time...
    pass(&env, SECOND - env.moment()).await;
    env.check_job(&id, JobState::Ready, PRI, NO_COUNTERS).await;
    env.check_times(&id, SECOND - env.moment(), ZERO, TTR, ZERO)
        .await;
    check_expired(&env, "a", 0, 0).await;
    // ...and gone at the tick after it.
    pass(&env, env.moment()).await;
    assert!(!exists(&env, &id).await, "expired");
    check_expired(&env, "a", 1, 1).await;
    env.check_tube("a", NO_JOBS, 1, 0).await;
    env.check_server(ONE_READY, 2, 0, 3).await;
    assert_eq!(env.broker.peek_ready(&tube("a")).await.unwrap(), None);
    assert_eq!(env.reserve(1, &["a"]).await, None);
    assert!(!env.broker.delete(1, &id).await.unwrap(), "already gone");
    // The other tube's job is untouched, and its tube counts none.
    env.check_job(&other, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    check_expired(&env, "b", 0, 1).await;
}

async fn a_delayed_job_expires_whether_or_not_its_delay_has_ended(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    // Delayed past its time to live: never ready.
    let long = env.put(living("a", SECOND).delay(10 * SECOND)).await;
    // Ready half-way through it.
    let half = SECOND / 2;
    let short = env.put(living("a", SECOND).delay(half)).await;
    env.check_tube("a", counts(0, 0, 2, 0), 2, 0).await;
    pass(&env, half).await;
    env.check_job(&long, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_job(&short, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    check_expired(&env, "a", 0, 0).await;
    pass(&env, half).await;
    assert!(!exists(&env, &long).await, "expired while delayed");
    assert!(!exists(&env, &short).await, "expired after its delay");
    check_expired(&env, "a", 2, 2).await;
    env.check_tube("a", NO_JOBS, 2, 0).await;
    assert_eq!(env.broker.peek_delayed(&tube("a")).await.unwrap(), None);
    if manual(&env) {
        // Its due time is gone with it: nothing becomes ready later.
        pass(&env, 10 * SECOND - 2 * half).await;
        env.check_tube("a", NO_JOBS, 2, 0).await;
        assert_eq!(env.reserve(1, &["a"]).await, None);
    }
}

async fn a_buried_job_expires(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    let id = env.put(living("a", SECOND)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(env.broker.bury(1, &id, PRI).await.unwrap());
    let buried = JobCounters {
        buries: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Buried, PRI, buried).await;
    pass(&env, SECOND).await;
    assert!(!exists(&env, &id).await, "expired while buried");
    check_expired(&env, "a", 1, 1).await;
    env.check_tube("a", NO_JOBS, 1, 0).await;
    assert_eq!(env.broker.peek_buried(&tube("a")).await.unwrap(), None);
    assert_eq!(env.broker.kick(&tube("a"), 10).await.unwrap(), 0);
    assert!(!env.broker.kick_job(&id).await.unwrap());
}

async fn a_reserved_job_past_its_ttl_stays_until_its_worker_lets_go(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = env.put(living("a", SECOND)).await;
        assert_eq!(env.reserve_job(1, &id).await.as_ref(), Some(&id));
        ids.push(id);
    }
    pass(&env, SECOND).await;
    // Still its worker's: reserved, and touched as ever.
    for id in &ids {
        env.check_job(id, JobState::Reserved, PRI, RESERVED_ONCE)
            .await;
        let ttr = env.broker.touch(1, id).await.unwrap();
        assert_eq!(ttr, Some(TTR), "touch of job {id}");
    }
    env.check_tube("a", counts(0, 4, 0, 0), 4, 0).await;
    check_expired(&env, "a", 0, 0).await;
    // Another connection cannot take it.
    assert_eq!(env.reserve_job(2, &ids[0]).await, None);
    assert!(!env.broker.delete(2, &ids[0]).await.unwrap());
    // Released: gone, counted; the release still answers as a release.
    let got = env.broker.release(1, &ids[0], PRI, ZERO).await.unwrap();
    let got = got.expect("held");
    assert!(!got.buried, "a release, not a bury: {got:?}");
    assert_eq!(got.tube, tube("a"));
    assert!(!exists(&env, &ids[0]).await, "released past its ttl");
    check_expired(&env, "a", 1, 1).await;
    // Released with a delay: the same.
    let got = env.broker.release(1, &ids[1], PRI, 5 * SECOND).await;
    assert!(!got.unwrap().expect("held").buried);
    assert!(!exists(&env, &ids[1]).await, "released with a delay");
    check_expired(&env, "a", 2, 2).await;
    // Buried: gone, counted.
    assert!(env.broker.bury(1, &ids[2], PRI).await.unwrap(), "held");
    assert!(!exists(&env, &ids[2]).await, "buried past its ttl");
    check_expired(&env, "a", 3, 3).await;
    // Its connection closed: gone, counted.
    env.broker
        .release_all(1, std::slice::from_ref(&ids[3]), true)
        .await
        .unwrap();
    assert!(
        !exists(&env, &ids[3]).await,
        "let go by a closed connection"
    );
    check_expired(&env, "a", 4, 4).await;
    env.check_tube("a", NO_JOBS, 4, 0).await;
    env.check_server(NO_JOBS, 4, 0, 2).await;
    assert_eq!(env.reserve(2, &["a"]).await, None, "none came back");
    if manual(&env) {
        // Nothing is left due for them.
        pass(&env, 10 * SECOND).await;
        env.check_tube("a", NO_JOBS, 4, 0).await;
    }
}

async fn a_reserved_job_past_its_ttl_goes_when_its_ttr_runs_out(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    let ttr = 2 * SECOND;
    let id = env.put(living("a", SECOND).ttr(ttr)).await;
    // With tries: its TTR running out is its last try, which would bury it
    // as a dead letter; with tries left and a backoff, which would delay it.
    let last_try = Lifecycle {
        tries: Some(1),
        ttl: Some(SECOND),
        ..Lifecycle::default()
    };
    let dead = env.put(job("a").ttr(ttr).life(last_try)).await;
    let backs_off = Lifecycle {
        tries: Some(3),
        backoff: Some(Backoff::Fixed(SECOND)),
        ttl: Some(SECOND),
        ..Lifecycle::default()
    };
    let backing = env.put(job("a").ttr(ttr).life(backs_off)).await;
    let all = [&id, &dead, &backing];
    for id in all {
        assert_eq!(env.reserve_job(1, id).await.as_ref(), Some(id));
    }
    pass(&env, SECOND).await;
    for id in all {
        env.check_job(id, JobState::Reserved, PRI, RESERVED_ONCE)
            .await;
    }
    env.check_tube("a", counts(0, 3, 0, 0), 3, 0).await;
    check_expired(&env, "a", 0, 0).await;
    pass(&env, SECOND).await;
    assert!(!exists(&env, &id).await, "its TTR ran out past its ttl");
    assert!(!exists(&env, &dead).await, "not buried as a dead letter");
    assert!(!exists(&env, &backing).await, "not delayed by its backoff");
    check_expired(&env, "a", 3, 3).await;
    env.check_tube("a", NO_JOBS, 3, 0).await;
    assert_eq!(env.reserve(2, &["a"]).await, None, "not back to ready");
    assert!(!env.release(1, &id, PRI).await, "its worker lost it");
}

async fn finish_or_delete_of_a_held_job_past_its_ttl_is_a_plain_delete(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    let finished = env.put(living("a", SECOND)).await;
    let deleted = env.put(living("a", SECOND)).await;
    for id in [&finished, &deleted] {
        assert_eq!(env.reserve_job(1, id).await.as_ref(), Some(id));
    }
    pass(&env, SECOND).await;
    assert!(
        !env.broker.finish(2, &finished).await.unwrap(),
        "not its job"
    );
    assert!(env.broker.finish(1, &finished).await.unwrap(), "finish");
    assert!(env.broker.delete(1, &deleted).await.unwrap(), "delete");
    for id in [&finished, &deleted] {
        assert!(!exists(&env, id).await, "job {id}");
    }
    check_expired(&env, "a", 0, 0).await;
    env.check_tube("a", NO_JOBS, 2, 2).await;
    // Nothing is counted later either.
    pass(&env, SECOND).await;
    check_expired(&env, "a", 0, 0).await;
}

async fn a_job_before_its_ttl_is_kept(env: Env<impl Store>) {
    let soon = env.put(living("a", 2 * SECOND)).await;
    let hour = env.put(living("a", 3600 * SECOND)).await;
    let year = env
        .put(living("a", 365 * 86_400 * SECOND).delay(SECOND))
        .await;
    let plain = env.put(job("a")).await;
    pass(&env, SECOND).await;
    for id in [&soon, &hour, &year, &plain] {
        env.check_job(id, JobState::Ready, PRI, NO_COUNTERS).await;
    }
    let s = env.stats_job(&year).await;
    assert_eq!(
        s.life.map(|l| l.options),
        Some(ttl(365 * 86_400 * SECOND)),
        "a year's ttl"
    );
    assert_eq!(env.stats_job(&plain).await.life, None, "no options");
    env.check_tube("a", counts(4, 0, 0, 0), 4, 0).await;
    check_expired(&env, "a", 0, 0).await;
    // Reserved and released before its time: it goes on as ever.
    assert_eq!(env.reserve_job(1, &soon).await.as_ref(), Some(&soon));
    assert!(env.release(1, &soon, PRI).await);
    let released = JobCounters {
        releases: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&soon, JobState::Ready, PRI, released).await;
    check_expired(&env, "a", 0, 0).await;
    if manual(&env) {
        // Up to its last microsecond, and gone after it; the others stay.
        pass(&env, SECOND - env.moment()).await;
        env.check_job(&soon, JobState::Ready, PRI, released).await;
        pass(&env, env.moment()).await;
        assert!(!exists(&env, &soon).await, "at its ttl");
        for id in [&hour, &year, &plain] {
            env.check_job(id, JobState::Ready, PRI, NO_COUNTERS).await;
        }
        check_expired(&env, "a", 1, 1).await;
    }
}

async fn a_tubes_ttl_is_given_to_the_jobs_put_without_one(env: Env<impl Store>) {
    let a = tube("a");
    env.attach("a", TubeRef::Using).await;
    let before = env.put(job("a")).await;
    env.broker.set_tube(&a, ttl(SECOND)).await.unwrap();
    assert_eq!(env.broker.tube_settings(&a).await.unwrap(), ttl(SECOND));
    let plain = env.put(job("a")).await;
    let delayed = env.put(job("a").delay(5 * SECOND)).await;
    let own = env.put(living("a", 3600 * SECOND)).await;
    let tries = Lifecycle {
        tries: Some(2),
        ..Lifecycle::default()
    };
    let merged = env.put(job("a").life(tries)).await;
    let elsewhere = env.put(job("b")).await;
    assert_eq!(
        env.stats_job(&plain).await.life.map(|l| l.options),
        Some(ttl(SECOND)),
        "the tube's ttl"
    );
    assert_eq!(
        env.stats_job(&merged).await.life.map(|l| l.options),
        Some(Lifecycle {
            ttl: Some(SECOND),
            ..tries
        }),
        "its tries, the tube's ttl"
    );
    assert_eq!(
        env.stats_job(&own).await.life.map(|l| l.options),
        Some(ttl(3600 * SECOND)),
        "its own ttl wins"
    );
    pass(&env, SECOND).await;
    for id in [&plain, &delayed, &merged] {
        assert!(!exists(&env, id).await, "job {id} took the tube's ttl");
    }
    env.check_job(&before, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    env.check_job(&own, JobState::Ready, PRI, NO_COUNTERS).await;
    env.check_job(&elsewhere, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    check_expired(&env, "a", 3, 3).await;
    check_expired(&env, "b", 0, 3).await;
    env.check_tube("a", counts(2, 0, 0, 0), 5, 0).await;
}

async fn tick_says_when_the_next_expiry_is_due(env: Env<impl Store>) {
    // A lone ready job: nothing is due but its expiry.
    let id = env.put(living("a", 2 * SECOND)).await;
    let next = env.broker.tick().await.unwrap().expect("its expiry is due");
    assert!(
        next <= 2 * SECOND + Duration::from_millis(5),
        "tick: next due {next:?}, its expiry is in 2 s"
    );
    if manual(&env) {
        env.assert_next_due(next, 2 * SECOND, "tick: next due is its expiry");
    }
    // A job delayed for longer: its expiry is still the next due time.
    let late = env.put(living("b", SECOND).delay(10 * SECOND)).await;
    let next = env.broker.tick().await.unwrap().expect("due times");
    assert!(
        next <= SECOND + Duration::from_millis(5),
        "tick: next due {next:?}, an expiry is in 1 s"
    );
    if manual(&env) {
        env.assert_next_due(next, SECOND, "tick: next due is the sooner expiry");
        // A reserved job with a long TTR: its expiry is still due sooner.
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        let next = env.broker.tick().await.unwrap().expect("due times");
        env.assert_next_due(next, SECOND, "tick with a job reserved");
        pass(&env, SECOND).await;
        assert!(!exists(&env, &late).await, "expired");
        let next = env.broker.tick().await.unwrap().expect("due times");
        env.assert_next_due(next, SECOND, "tick: the reserved job's expiry");
        pass(&env, SECOND).await;
        // Held past its ttl: its TTR is what is due now.
        env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
            .await;
        let next = env.broker.tick().await.unwrap().expect("its TTR");
        env.assert_next_due(next, TTR - 2 * SECOND, "tick: the TTR of the held job");
        assert!(env.broker.delete(1, &id).await.unwrap());
        assert_eq!(env.broker.tick().await.unwrap(), None, "nothing due");
    }
}

/// A deleted job's client id stays taken for its unique window; the tick
/// says when to come back to free it (within a second of the window's
/// end), so that ids whose windows ended do not pile up while nothing else
/// is due (on the embedded engines the timer never came back for them).
async fn tick_comes_back_for_the_ids_of_ended_unique_windows(env: Env<impl Store>) {
    let unique = Lifecycle {
        unique: Some(SECOND),
        ..Lifecycle::default()
    };
    let id = env.put(job("u").id("once:1").life(unique)).await;
    assert!(env.broker.delete(1, &id).await.expect("delete"), "deleted");
    // On a cluster the shard's news of it comes by its announcement.
    let mut next = None;
    for _ in 0..20 {
        next = env.broker.tick().await.unwrap();
        if next.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = next.expect("the tick comes back at the window's end");
    assert!(
        next <= 2 * SECOND + Duration::from_millis(5),
        "tick: next due {next:?}, the window ends in 1 s"
    );
    if manual(&env) {
        env.assert_next_due(next, 2 * SECOND, "tick: the window's end and a second");
        pass(&env, 2 * SECOND).await;
        assert_eq!(
            env.broker.tick().await.unwrap(),
            None,
            "the id freed, nothing is due"
        );
    }
}

/// A job whose time to live ran out while nothing ticked (delayq was down)
/// went when its time ran out: its unique window counts from then, not from
/// the tick that found it, which after an outage is much later.
async fn an_expired_jobs_unique_window_counts_from_its_ttl_not_the_tick(env: Env<impl Store>) {
    let life = Lifecycle {
        ttl: Some(SECOND),
        unique: Some(SECOND),
        ..Lifecycle::default()
    };
    // Used, so that the tube outlives its job.
    env.attach("u", TubeRef::Using).await;
    let first = job("u").id("late:1").life(life);
    env.put(first.clone()).await;
    // Its time runs out at 1 s and its window at 2 s; the tick comes after.
    pass(&env, 2 * SECOND).await;
    check_expired(&env, "u", 1, 1).await;
    let again = env.broker.put(first).await.expect("put");
    assert!(
        matches!(again, PutOutcome::Inserted(_)),
        "the id is free once the window that began at the ttl's end is over: {again:?}"
    );
}

/// A delete that begins a unique window wakes the embedded engines' timer
/// at the window's end (and a second, to free ids in batches): nothing else
/// would, and an idle server kept every id it should have freed, in memory
/// and in every snapshot. (Redis's timer ticks by itself every second.)
async fn a_unique_window_begun_wakes_the_timer_at_its_end(env: Env<impl Store>) {
    assert_eq!(env.broker.tick().await.expect("tick"), None, "nothing due");
    let life = Lifecycle {
        unique: Some(Duration::from_millis(1)),
        ..Lifecycle::default()
    };
    let id = env.put(job("u").id("window:1").life(life)).await;
    assert!(env.broker.delete(1, &id).await.expect("delete"), "deleted");
    assert!(!env.broker.timer_behind(), "the window has not ended");
    // Its end, and the second the timer may wait to free ids together.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(
        env.broker.timer_behind(),
        "the timer was told to wake when the window ended"
    );
}

#[tokio::test]
async fn memory_a_unique_window_begun_wakes_the_timer_at_its_end() {
    a_unique_window_begun_wakes_the_timer_at_its_end(crate::engines::memory().await).await
}

#[tokio::test]
async fn durable_a_unique_window_begun_wakes_the_timer_at_its_end() {
    a_unique_window_begun_wakes_the_timer_at_its_end(crate::engines::durable().await).await
}
