//! Schedules as the engines keep them: `set_schedule` (a new one, or one
//! replacing another of its name, up to `MAX_SCHEDULES`), `remove_schedule`
//! and `schedules` (every one, by name, field for field as registered).
//! Their firing is the broker's and is checked over the wire, in
//! `tests/conformance/schedules.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use delayq::names::Tube;
use delayq::schedule::{MAX_SCHEDULES, Schedule, When};
use delayq::store::Store;

use crate::env::Env;

store_tests!(
    schedules_are_kept_field_for_field_and_listed_by_name,
    a_schedule_of_the_same_name_replaces_the_old_one,
    removing_a_schedule_forgets_it_and_says_whether_there_was_one,
    a_new_schedule_beyond_the_most_kept_is_refused,
);

const NOW: u64 = 1_795_661_340_000; // 2026-11-26T02:49:00Z

fn every(name: &str, period: Duration, body: &'static [u8]) -> Schedule {
    Schedule {
        name: Arc::from(name),
        when: When::every(period).expect("a valid interval"),
        tube: Tube::parse(b"beats").unwrap(),
        pri: 3,
        ttr: Duration::from_secs(45),
        body: Bytes::from_static(body),
        since: NOW,
    }
}

async fn listed(env: &Env<impl Store>) -> Vec<Schedule> {
    env.broker.schedules().await.expect("schedules")
}

async fn schedules_are_kept_field_for_field_and_listed_by_name(env: Env<impl Store>) {
    let report = Schedule {
        name: Arc::from("nightly-report"),
        when: When::cron("Europe/Berlin", "0 2 * * MON-FRI", NOW).unwrap(),
        tube: Tube::parse(b"reports").unwrap(),
        pri: 0,
        ttr: Duration::from_secs(600),
        body: Bytes::from_static(b"\0\r\n\xff report"),
        since: NOW + 17,
    };
    let beat = every("heartbeat", Duration::from_secs(30), b"");
    assert!(env.broker.set_schedule(&report).await.unwrap());
    assert!(env.broker.set_schedule(&beat).await.unwrap());
    assert_eq!(listed(&env).await, vec![beat, report]);
}

async fn a_schedule_of_the_same_name_replaces_the_old_one(env: Env<impl Store>) {
    let old = every("cleanup", Duration::from_secs(60), b"old");
    let mut new = every("cleanup", Duration::from_secs(7200), b"new");
    new.since += 1000;
    assert!(env.broker.set_schedule(&old).await.unwrap());
    assert!(env.broker.set_schedule(&new).await.unwrap());
    assert_eq!(listed(&env).await, vec![new]);
}

async fn removing_a_schedule_forgets_it_and_says_whether_there_was_one(env: Env<impl Store>) {
    let a = every("a", Duration::from_secs(1), b"a");
    let b = every("b", Duration::from_secs(2), b"b");
    env.broker.set_schedule(&a).await.unwrap();
    env.broker.set_schedule(&b).await.unwrap();
    assert!(env.broker.remove_schedule("a").await.unwrap());
    assert!(!env.broker.remove_schedule("a").await.unwrap());
    assert!(!env.broker.remove_schedule("never").await.unwrap());
    assert_eq!(listed(&env).await, vec![b]);
}

async fn a_new_schedule_beyond_the_most_kept_is_refused(env: Env<impl Store>) {
    for i in 0..MAX_SCHEDULES {
        let s = every(&format!("s{i:04}"), Duration::from_secs(86_400), b"");
        assert!(env.broker.set_schedule(&s).await.unwrap(), "schedule {i}");
    }
    let extra = every("extra", Duration::from_secs(60), b"");
    assert!(!env.broker.set_schedule(&extra).await.unwrap());
    // An existing one may still be replaced, and once one is removed a new
    // one fits.
    let again = every("s0007", Duration::from_secs(60), b"again");
    assert!(env.broker.set_schedule(&again).await.unwrap());
    assert!(env.broker.remove_schedule("s0001").await.unwrap());
    assert!(env.broker.set_schedule(&extra).await.unwrap());
    let all = listed(&env).await;
    assert_eq!(all.len(), MAX_SCHEDULES);
    assert!(all.contains(&again) && all.contains(&extra));
    assert!(!all.iter().any(|s| &*s.name == "s0001"));
}
