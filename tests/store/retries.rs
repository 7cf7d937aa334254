//! Tries, backoff and dead letters (EXTENSION): a job's tries in a round,
//! the wait after a TTR runs out or a release with no delay (fixed,
//! exponential, capped, jittered), the burial of a job that used up its
//! tries and the fresh round a kick gives it, and a tube's settings, which
//! fill in the options a job is put without, outlive the tube, and change
//! only the jobs put after them.
//!
//! Real-time engines sleep here for a TTR (one second) and a backoff or two
//! (at most half a second); no test sleeps for more than two seconds.

use std::time::Duration;

use delayq::job::{Backoff, JobCounters, JobState, LifeStats, Lifecycle, Released};
use delayq::names::JobId;
use delayq::rules::backoff_wait;
use delayq::store::{Store, TubeRef};

use crate::check::{
    NO_COUNTERS, ONE_READY, PRI, RESERVED_ONCE, TTR, Tweak, counts, job, named, tube,
};
use crate::env::Env;

const SECOND: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;

store_tests!(
    tries_bury_a_dead_letter_when_the_last_ttr_runs_out,
    without_options_a_job_is_ready_at_once_when_its_ttr_runs_out,
    a_fixed_backoff_delays_a_job_whose_ttr_ran_out,
    an_exponential_backoff_doubles_with_each_try_up_to_its_cap,
    jitter_takes_off_a_share_set_by_the_job_and_its_try,
    release_after_the_last_try_buries_a_dead_letter,
    a_job_given_back_unfailed_gets_its_try_back,
    release_with_no_delay_waits_out_the_backoff_and_its_own_delay_is_kept,
    bury_is_no_dead_letter_and_counts_no_try,
    a_tubes_settings_fill_in_the_options_a_job_is_put_without,
    new_settings_change_only_the_jobs_put_afterwards,
    settings_outlive_their_tube,
);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Only `tries`.
fn tries(n: u32) -> Lifecycle {
    Lifecycle {
        tries: Some(n),
        ..Lifecycle::default()
    }
}

/// The number of a server id, the key its jitter is spread by.
fn number(id: &JobId) -> u64 {
    match id {
        JobId::Server(n) => *n,
        other => panic!("want a server id, got {other}"),
    }
}

/// Where a job is in its tries, if it has options.
async fn life_of(env: &Env<impl Store>, id: &JobId) -> Option<LifeStats> {
    env.stats_job(id).await.life
}

/// Checks a job's options, its tries in this round and its dead-letter mark.
async fn check_life(env: &Env<impl Store>, id: &JobId, options: Lifecycle, tries: u32, dead: bool) {
    let want = LifeStats {
        options,
        tries,
        dead,
    };
    assert_eq!(
        life_of(env, id).await,
        Some(want),
        "job {id}: life (options, tries, dead)"
    );
}

/// Releases a job `conn` holds with no delay of its own.
async fn release(env: &Env<impl Store>, conn: u64, id: &JobId, pri: u32) -> Option<Released> {
    env.broker.release(conn, id, pri, ZERO).await.unwrap()
}

/// Lets a job's one-second TTR run out and moves what fell due.
async fn ttr_runs_out(env: &Env<impl Store>) {
    env.advance(SECOND).await;
    env.broker.tick().await.unwrap();
}

/// How `release` leaves a job that is not buried.
fn back(name: &str, delay: Duration) -> Option<Released> {
    Some(Released {
        tube: tube(name),
        buried: false,
        delay,
    })
}

async fn tries_bury_a_dead_letter_when_the_last_ttr_runs_out(env: Env<impl Store>) {
    let life = tries(2);
    let id = env.put(job("a").ttr(SECOND).life(life)).await;
    check_life(&env, &id, life, 0, false).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 1, false).await;
    ttr_runs_out(&env).await;
    // A try left and no backoff: ready at once, as in beanstalkd.
    let once = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Ready, PRI, once).await;
    env.check_times(&id, SECOND, ZERO, SECOND, ZERO).await;
    check_life(&env, &id, life, 1, false).await;
    assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 2, false).await;
    ttr_runs_out(&env).await;
    // Its last try: buried, as a dead letter.
    let dead = JobCounters {
        reserves: 2,
        timeouts: 2,
        buries: 1,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Buried, PRI, dead).await;
    env.check_times(&id, 2 * SECOND, ZERO, SECOND, ZERO).await;
    check_life(&env, &id, life, 2, true).await;
    env.check_tube("a", counts(0, 0, 0, 1), 1, 0).await;
    env.check_server(counts(0, 0, 0, 1), 1, 2, 2).await;
    let first = env.broker.peek_buried(&tube("a")).await.unwrap();
    assert_eq!(first.map(|j| j.id).as_ref(), Some(&id), "peek-buried");
    assert_eq!(env.reserve(3, &["a"]).await, None);
    assert!(!env.release(2, &id, PRI).await, "its last holder lost it");
    // Kicked: a fresh round, with all its tries again.
    assert_eq!(env.broker.kick(&tube("a"), 1).await.unwrap(), 1);
    let kicked = JobCounters { kicks: 1, ..dead };
    env.check_job(&id, JobState::Ready, PRI, kicked).await;
    check_life(&env, &id, life, 0, false).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 1, false).await;
    // Its first try of two: released, not buried.
    assert_eq!(release(&env, 1, &id, PRI).await, back("a", ZERO));
    let released = JobCounters {
        reserves: 3,
        releases: 1,
        ..kicked
    };
    env.check_job(&id, JobState::Ready, PRI, released).await;
    check_life(&env, &id, life, 1, false).await;
}

/// A job given back unfailed (the server stops while a worker holds it,
/// or a reserve took it for a client that had gone) gets back the try its
/// reserve counted: on its last try, it is then reserved once more, not
/// twice, before it is a dead letter. One its worker failed keeps the try.
async fn a_job_given_back_unfailed_gets_its_try_back(env: Env<impl Store>) {
    let life = tries(2);
    let id = env.put(job("a").life(life)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert_eq!(release(&env, 1, &id, PRI).await, back("a", ZERO));
    // Its last try, given back.
    assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 2, false).await;
    env.broker
        .release_all(2, std::slice::from_ref(&id), false)
        .await
        .unwrap();
    let given_back = JobCounters {
        reserves: 2,
        releases: 1,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Ready, PRI, given_back).await;
    check_life(&env, &id, life, 1, false).await;
    // Its last try again, failed by its worker's going: a dead letter.
    assert_eq!(env.reserve(3, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 2, false).await;
    env.broker
        .release_all(3, std::slice::from_ref(&id), true)
        .await
        .unwrap();
    let dead = JobCounters {
        reserves: 3,
        buries: 1,
        ..given_back
    };
    env.check_job(&id, JobState::Buried, PRI, dead).await;
    check_life(&env, &id, life, 2, true).await;
}

async fn without_options_a_job_is_ready_at_once_when_its_ttr_runs_out(env: Env<impl Store>) {
    // Another tube's settings change nothing here.
    let strict = Lifecycle {
        tries: Some(1),
        backoff: Some(Backoff::Fixed(5 * SECOND)),
        ..Lifecycle::default()
    };
    env.broker.set_tube(&tube("b"), strict).await.unwrap();
    let id = env.put(job("a").ttr(SECOND)).await;
    assert_eq!(life_of(&env, &id).await, None, "no options: no life");
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert_eq!(life_of(&env, &id).await, None, "reserved");
    ttr_runs_out(&env).await;
    let once = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Ready, PRI, once).await;
    env.check_times(&id, SECOND, ZERO, SECOND, ZERO).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    assert_eq!(life_of(&env, &id).await, None, "timed out");
    // Released with no delay, however often: ready at once, never buried.
    for n in 2..=4 {
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        assert_eq!(release(&env, 1, &id, PRI).await, back("a", ZERO), "try {n}");
    }
    let released = JobCounters {
        reserves: 4,
        releases: 3,
        ..once
    };
    env.check_job(&id, JobState::Ready, PRI, released).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(env.broker.bury(1, &id, PRI).await.unwrap());
    assert!(env.broker.kick_job(&id).await.unwrap());
    assert_eq!(life_of(&env, &id).await, None, "buried and kicked");
}

async fn a_fixed_backoff_delays_a_job_whose_ttr_ran_out(env: Env<impl Store>) {
    let wait = ms(500);
    let life = Lifecycle {
        tries: Some(3),
        backoff: Some(Backoff::Fixed(wait)),
        ..Lifecycle::default()
    };
    let id = env.put(job("a").ttr(SECOND).life(life)).await;
    assert_eq!(backoff_wait(&life, number(&id), 1), Some(wait), "no jitter");
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    ttr_runs_out(&env).await;
    let timed_out = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Delayed, PRI, timed_out).await;
    env.check_times(&id, SECOND, wait, SECOND, wait).await;
    check_life(&env, &id, life, 1, false).await;
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    env.check_server(counts(0, 0, 1, 0), 1, 1, 2).await;
    let first = env.broker.peek_delayed(&tube("a")).await.unwrap();
    assert_eq!(first.map(|j| j.id).as_ref(), Some(&id), "peek-delayed");
    assert_eq!(
        env.reserve(2, &["a"]).await,
        None,
        "waiting out its backoff"
    );
    // Not back before its wait is over...
    env.advance(wait - env.moment()).await;
    assert!(env.broker.tick().await.unwrap().is_some(), "still due");
    env.check_job(&id, JobState::Delayed, PRI, timed_out).await;
    let s = env.stats_job(&id).await;
    env.assert_time(s.time_left, env.moment(), "time-left just before");
    assert_eq!(env.reserve(2, &["a"]).await, None, "just before");
    // ...and back once it is.
    env.advance(env.moment()).await;
    env.broker.tick().await.unwrap();
    env.check_job(&id, JobState::Ready, PRI, timed_out).await;
    env.check_times(&id, SECOND + wait, wait, SECOND, ZERO)
        .await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 2, false).await;
    // The same wait after the second try.
    assert_eq!(release(&env, 2, &id, PRI).await, back("a", wait));
    env.check_times(&id, SECOND + wait, wait, SECOND, wait)
        .await;
    env.check_job(
        &id,
        JobState::Delayed,
        PRI,
        JobCounters {
            reserves: 2,
            releases: 1,
            ..timed_out
        },
    )
    .await;
}

async fn an_exponential_backoff_doubles_with_each_try_up_to_its_cap(env: Env<impl Store>) {
    let (base, cap) = (ms(400), SECOND);
    let life = Lifecycle {
        tries: Some(5),
        backoff: Some(Backoff::Exponential(base)),
        backoff_max: Some(cap),
        ..Lifecycle::default()
    };
    let id = env.put(job("a").ttr(SECOND).life(life)).await;
    let wait = |n| backoff_wait(&life, number(&id), n).expect("a backoff");
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    ttr_runs_out(&env).await;
    let first = wait(1);
    assert_eq!(first, base, "the first wait is the base");
    let mut counters = JobCounters {
        timeouts: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Delayed, PRI, counters).await;
    env.check_times(&id, SECOND, first, SECOND, first).await;
    // Kicked out of its wait: the round goes on.
    assert!(env.broker.kick_job(&id).await.unwrap());
    check_life(&env, &id, life, 1, false).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    check_life(&env, &id, life, 2, false).await;
    ttr_runs_out(&env).await;
    let second = wait(2);
    assert_eq!(second, 2 * first, "the second wait doubles the first");
    counters = JobCounters {
        reserves: 2,
        timeouts: 2,
        kicks: 1,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Delayed, PRI, counters).await;
    env.check_times(&id, 2 * SECOND, second, SECOND, second)
        .await;
    // The third would be 1.6 s: capped at 1 s, the fourth too (released
    // with no delay, which backs off the same way).
    assert_eq!((wait(3), wait(4)), (cap, cap), "capped");
    for n in 3..=4 {
        assert!(env.broker.kick_job(&id).await.unwrap());
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        assert_eq!(release(&env, 1, &id, PRI).await, back("a", cap), "try {n}");
        env.check_times(&id, 2 * SECOND, cap, SECOND, cap).await;
        check_life(&env, &id, life, n, false).await;
    }
    // The fifth and last try: buried.
    assert!(env.broker.kick_job(&id).await.unwrap());
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    let got = release(&env, 1, &id, PRI).await.expect("held");
    assert_eq!((&got.tube, got.buried), (&tube("a"), true), "{got:?}");
    counters = JobCounters {
        reserves: 5,
        timeouts: 2,
        releases: 2,
        buries: 1,
        kicks: 4,
    };
    env.check_job(&id, JobState::Buried, PRI, counters).await;
    check_life(&env, &id, life, 5, true).await;
}

async fn jitter_takes_off_a_share_set_by_the_job_and_its_try(env: Env<impl Store>) {
    let base = 2 * SECOND;
    let life = Lifecycle {
        backoff: Some(Backoff::Fixed(base)),
        jitter: Some(50),
        ..Lifecycle::default()
    };
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(env.put(job("a").ttr(SECOND).life(life)).await);
    }
    let mut waits = Vec::new();
    // The first try of each: released with no delay.
    for id in &ids {
        assert_eq!(env.reserve_job(1, id).await.as_ref(), Some(id));
        let want = backoff_wait(&life, number(id), 1).unwrap();
        assert_eq!(release(&env, 1, id, PRI).await, back("a", want), "job {id}");
        env.check_times(id, ZERO, want, SECOND, want).await;
        waits.push(want);
    }
    // The second: their TTRs run out together.
    for id in &ids {
        assert!(env.broker.kick_job(id).await.unwrap());
        assert_eq!(env.reserve_job(1, id).await.as_ref(), Some(id));
    }
    ttr_runs_out(&env).await;
    let counters = JobCounters {
        reserves: 2,
        timeouts: 1,
        releases: 1,
        kicks: 1,
        ..NO_COUNTERS
    };
    for id in &ids {
        let want = backoff_wait(&life, number(id), 2).unwrap();
        env.check_job(id, JobState::Delayed, PRI, counters).await;
        env.check_times(id, SECOND, want, SECOND, want).await;
        check_life(&env, id, life, 2, false).await;
        waits.push(want);
    }
    assert!(
        waits.iter().all(|w| (base / 2..=base).contains(w)),
        "jitter 50 takes off at most half: {waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w < base),
        "jitter shortens: {waits:?}"
    );
}

async fn release_after_the_last_try_buries_a_dead_letter(env: Env<impl Store>) {
    let life = Lifecycle {
        tries: Some(1),
        backoff: Some(Backoff::Fixed(5 * SECOND)),
        ..Lifecycle::default()
    };
    let id = env.put(job("a").life(life)).await;
    let other = env.put(job("a").id("order:1").life(life)).await;
    assert_eq!(env.reserve_job(1, &id).await.as_ref(), Some(&id));
    let got = release(&env, 1, &id, 7).await.expect("held");
    assert_eq!((&got.tube, got.buried), (&tube("a"), true), "{got:?}");
    let dead = JobCounters {
        buries: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Buried, 7, dead).await;
    check_life(&env, &id, life, 1, true).await;
    // With a delay of its own too.
    assert_eq!(env.reserve_job(1, &other).await.as_ref(), Some(&other));
    let got = env.broker.release(1, &other, 8, 10 * SECOND).await;
    let got = got.unwrap().expect("held");
    assert_eq!((&got.tube, got.buried), (&tube("a"), true), "{got:?}");
    env.check_job(&other, JobState::Buried, 8, dead).await;
    check_life(&env, &other, life, 1, true).await;
    env.check_tube("a", counts(0, 0, 0, 2), 2, 0).await;
    let first = env.broker.peek_buried(&tube("a")).await.unwrap();
    assert_eq!(first.map(|j| j.id).as_ref(), Some(&id), "peek-buried");
    // Kicked: its one try again, and the backoff after it.
    assert!(env.broker.kick_job(&other).await.unwrap());
    check_life(&env, &other, life, 0, false).await;
    let kicked = JobCounters { kicks: 1, ..dead };
    env.check_job(&other, JobState::Ready, 8, kicked).await;
    assert_eq!(env.reserve_job(1, &other).await.as_ref(), Some(&other));
    let got = release(&env, 1, &other, 8).await.expect("held");
    assert!(got.buried, "its one try is its last: {got:?}");
    check_life(&env, &other, life, 1, true).await;
    assert_eq!(other, named("order:1"));
}

async fn release_with_no_delay_waits_out_the_backoff_and_its_own_delay_is_kept(
    env: Env<impl Store>,
) {
    let wait = 5 * SECOND;
    let life = Lifecycle {
        tries: Some(5),
        backoff: Some(Backoff::Fixed(wait)),
        ..Lifecycle::default()
    };
    let id = env.put(job("a").life(life)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert_eq!(release(&env, 1, &id, 9).await, back("a", wait));
    let mut counters = JobCounters {
        releases: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Delayed, 9, counters).await;
    env.check_times(&id, ZERO, wait, TTR, wait).await;
    env.check_tube("a", counts(0, 0, 1, 0), 1, 0).await;
    assert_eq!(
        env.reserve(2, &["a"]).await,
        None,
        "waiting out its backoff"
    );
    // A delay of its own, shorter or longer than the backoff, is kept.
    for (n, own) in [(2, 2 * SECOND), (3, 20 * SECOND)] {
        assert!(env.broker.kick_job(&id).await.unwrap());
        assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
        let got = env.broker.release(1, &id, 9, own).await.unwrap();
        assert_eq!(got, back("a", own), "try {n}");
        env.check_times(&id, ZERO, own, TTR, own).await;
        check_life(&env, &id, life, n, false).await;
    }
    counters = JobCounters {
        reserves: 3,
        releases: 3,
        kicks: 2,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Delayed, 9, counters).await;
    // Tries and no backoff: ready at once.
    let plain = env.put(job("a").life(tries(5))).await;
    assert_eq!(env.reserve_job(1, &plain).await.as_ref(), Some(&plain));
    assert_eq!(release(&env, 1, &plain, PRI).await, back("a", ZERO));
    let released = JobCounters {
        releases: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&plain, JobState::Ready, PRI, released).await;
    env.check_times(&plain, ZERO, ZERO, TTR, ZERO).await;
}

async fn bury_is_no_dead_letter_and_counts_no_try(env: Env<impl Store>) {
    let life = tries(1);
    let id = env.put(job("a").life(life)).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(env.broker.bury(1, &id, 3).await.unwrap());
    let buried = JobCounters {
        buries: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&id, JobState::Buried, 3, buried).await;
    check_life(&env, &id, life, 1, false).await;
    // Kicked: a fresh round; its one try used up by a release, a dead letter.
    assert!(env.broker.kick_job(&id).await.unwrap());
    check_life(&env, &id, life, 0, false).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(release(&env, 1, &id, 3).await.expect("held").buried);
    check_life(&env, &id, life, 1, true).await;
    // Kicked again, and buried by its worker: no dead letter any more.
    assert_eq!(env.broker.kick(&tube("a"), 5).await.unwrap(), 1);
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&id));
    assert!(env.broker.bury(1, &id, 3).await.unwrap());
    check_life(&env, &id, life, 1, false).await;
    let counters = JobCounters {
        reserves: 3,
        buries: 3,
        kicks: 2,
        ..NO_COUNTERS
    };
    env.check_job(&id, JobState::Buried, 3, counters).await;
}

async fn a_tubes_settings_fill_in_the_options_a_job_is_put_without(env: Env<impl Store>) {
    let a = tube("a");
    assert_eq!(
        env.broker.tube_settings(&a).await.unwrap(),
        Lifecycle::default()
    );
    let settings = Lifecycle {
        tries: Some(3),
        backoff: Some(Backoff::Exponential(10 * SECOND)),
        backoff_max: Some(60 * SECOND),
        jitter: Some(20),
        ..Lifecycle::default()
    };
    env.broker.set_tube(&a, settings).await.unwrap();
    assert_eq!(env.broker.tube_settings(&a).await.unwrap(), settings);
    let plain = env.put(job("a")).await;
    check_life(&env, &plain, settings, 0, false).await;
    // Its own options win, one by one.
    let own = Lifecycle {
        tries: Some(5),
        backoff: Some(Backoff::Fixed(SECOND)),
        ..Lifecycle::default()
    };
    let mine = env.put(job("a").life(own)).await;
    let merged = Lifecycle {
        tries: Some(5),
        backoff: Some(Backoff::Fixed(SECOND)),
        ..settings
    };
    check_life(&env, &mine, merged, 0, false).await;
    let jitter_only = Lifecycle {
        jitter: Some(70),
        ..Lifecycle::default()
    };
    let third = env.put(job("a").life(jitter_only)).await;
    let merged = Lifecycle {
        jitter: Some(70),
        ..settings
    };
    check_life(&env, &third, merged, 0, false).await;
    // Another tube's jobs do not take them.
    let elsewhere = env.put(job("b")).await;
    assert_eq!(life_of(&env, &elsewhere).await, None, "tube b");
    // And the jobs act on them.
    assert_eq!(env.reserve_job(1, &plain).await.as_ref(), Some(&plain));
    let want = backoff_wait(&settings, number(&plain), 1).unwrap();
    assert_eq!(release(&env, 1, &plain, PRI).await, back("a", want));
    env.check_times(&plain, ZERO, want, TTR, want).await;
}

async fn new_settings_change_only_the_jobs_put_afterwards(env: Env<impl Store>) {
    let a = tube("a");
    let before = env.put(job("a")).await;
    let first = tries(2);
    env.broker.set_tube(&a, first).await.unwrap();
    assert_eq!(
        life_of(&env, &before).await,
        None,
        "put before the settings"
    );
    let under_first = env.put(job("a")).await;
    check_life(&env, &under_first, first, 0, false).await;
    // Replaced as a whole: no tries any more.
    let second = Lifecycle {
        backoff: Some(Backoff::Fixed(3 * SECOND)),
        jitter: Some(10),
        ..Lifecycle::default()
    };
    env.broker.set_tube(&a, second).await.unwrap();
    assert_eq!(env.broker.tube_settings(&a).await.unwrap(), second);
    check_life(&env, &under_first, first, 0, false).await;
    let under_second = env.put(job("a")).await;
    check_life(&env, &under_second, second, 0, false).await;
    // The job put before any still behaves as in beanstalkd.
    assert_eq!(env.reserve_job(1, &before).await.as_ref(), Some(&before));
    assert_eq!(release(&env, 1, &before, PRI).await, back("a", ZERO));
    env.check_job(
        &before,
        JobState::Ready,
        PRI,
        JobCounters {
            releases: 1,
            ..RESERVED_ONCE
        },
    )
    .await;
    assert_eq!(life_of(&env, &before).await, None, "released");
    // Cleared.
    env.broker.set_tube(&a, Lifecycle::default()).await.unwrap();
    assert_eq!(
        env.broker.tube_settings(&a).await.unwrap(),
        Lifecycle::default()
    );
    let after = env.put(job("a")).await;
    assert_eq!(life_of(&env, &after).await, None, "put after clearing");
    check_life(&env, &under_first, first, 0, false).await;
    check_life(&env, &under_second, second, 0, false).await;
}

async fn settings_outlive_their_tube(env: Env<impl Store>) {
    let ghost = tube("ghost");
    let settings = Lifecycle {
        tries: Some(4),
        backoff: Some(Backoff::Fixed(2 * SECOND)),
        ..Lifecycle::default()
    };
    env.broker.set_tube(&ghost, settings).await.unwrap();
    assert!(!env.tube_exists("ghost").await, "settings make no tube");
    assert_eq!(env.broker.tube_settings(&ghost).await.unwrap(), settings);
    // Created by a put, which takes them.
    let id = env.put(job("ghost")).await;
    assert!(env.tube_exists("ghost").await);
    check_life(&env, &id, settings, 0, false).await;
    // Gone with its last job: the settings stay.
    assert!(env.broker.delete(1, &id).await.unwrap());
    assert!(!env.tube_exists("ghost").await, "gone with its last job");
    assert_eq!(env.broker.tube_settings(&ghost).await.unwrap(), settings);
    // Used and left by a connection: still kept.
    env.attach("ghost", TubeRef::Using).await;
    assert!(env.tube_exists("ghost").await);
    env.detach("ghost", TubeRef::Using).await;
    assert!(!env.tube_exists("ghost").await, "gone with its last user");
    assert_eq!(env.broker.tube_settings(&ghost).await.unwrap(), settings);
    // And still given to the jobs put when it comes back.
    let again = env.put(job("ghost")).await;
    check_life(&env, &again, settings, 0, false).await;
    assert_eq!(env.reserve_job(1, &again).await.as_ref(), Some(&again));
    let want = backoff_wait(&settings, number(&again), 1).unwrap();
    assert_eq!(release(&env, 1, &again, PRI).await, back("ghost", want));
    // A tube never used has none.
    let never = env.broker.tube_settings(&tube("never")).await.unwrap();
    assert_eq!(never, Lifecycle::default());
}
