//! `reserve_batch` (up to `max` ready jobs of the unpaused tubes given, in
//! the order successive `reserve` calls would take them) and
//! `remove_batch` (each id as `delete` or, with `finish`, as `finish`
//! would; how many went).

use std::time::Duration;

use delayq::job::{Counts, JobCounters, JobState};
use delayq::names::JobId;
use delayq::rules::MAX_BATCH;
use delayq::store::Store;

use crate::check::{NO_COUNTERS, PRI, RESERVED_ONCE, TTR, Tweak, counts, job, named, tubes};
use crate::env::Env;

store_tests!(
    reserve_batch_takes_what_successive_reserves_would,
    reserve_batch_never_takes_more_than_max,
    reserve_batch_with_nothing_ready_gets_nothing,
    reserve_batch_over_many_tubes_gets_every_ready_job,
    remove_batch_finish_removes_only_what_the_connection_holds,
    remove_batch_delete_spares_only_another_connections_jobs,
);

/// Reserves a batch for `conn`; the ids it got, each checked to come back
/// with the TTR and tube it was put with (`ttr` and `tube` of the job's
/// stats).
async fn batch(env: &Env<impl Store>, conn: u64, names: &[&str], max: usize) -> Vec<JobId> {
    let got = env.broker.reserve_batch(conn, &tubes(names), max).await;
    let got = got.expect("reserve-batch");
    assert!(got.len() <= max, "{} jobs for a batch of {max}", got.len());
    let mut ids = Vec::new();
    for r in got {
        let s = env.stats_job(&r.job.id).await;
        assert_eq!(
            (&r.job.tube, r.ttr, s.state),
            (&s.tube, s.ttr, JobState::Reserved),
            "job {}: (tube, ttr, state)",
            r.job.id
        );
        assert!(
            names.contains(&r.job.tube.as_str()),
            "job {} of tube {} is of a tube given",
            r.job.id,
            r.job.tube.as_str()
        );
        ids.push(r.job.id);
    }
    ids
}

/// The ids of jobs in the order `reserve` takes them: by priority, then by
/// the order they were put (`plan` is that order).
fn reserve_order(plan: &[(JobId, u32)]) -> Vec<JobId> {
    let mut order: Vec<(u32, usize, JobId)> = plan
        .iter()
        .enumerate()
        .map(|(i, (id, pri))| (*pri, i, id.clone()))
        .collect();
    order.sort();
    order.into_iter().map(|(_, _, id)| id).collect()
}

/// Jobs of mixed priorities in three tubes, one of them paused, and a
/// delayed and a buried one: successive `reserve` calls take the ready
/// ones of the unpaused tubes in one order; released and taken again in
/// batches of three, they come in the same order, each reserved.
async fn reserve_batch_takes_what_successive_reserves_would(env: Env<impl Store>) {
    let mut plan = Vec::new();
    // Tube, priority, TTR; equal priorities across tubes included.
    let spec = [
        ("a", 10, 60),
        ("b", 5, 30),
        ("paused", 0, 60),
        ("a", 5, 20),
        ("b", 10, 60),
        ("a", u32::MAX, 60),
        ("b", 0, 45),
        ("paused", 1, 60),
        ("a", 10, 50),
        ("b", 1024, 60),
    ];
    for (i, (name, pri, ttr)) in spec.iter().enumerate() {
        let ttr = Duration::from_secs(*ttr);
        let j = job(name).pri(*pri).ttr(ttr).body(format!("job {i}"));
        let id = env.put(j).await;
        if *name != "paused" {
            plan.push((id, *pri));
        }
    }
    // Neither delayed nor buried jobs are taken.
    let delayed = env
        .put(job("a").pri(0).delay(Duration::from_secs(100)))
        .await;
    let buried = env.put(job("b").pri(0)).await;
    assert_eq!(env.reserve_job(9, &buried).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(9, &buried, 0).await.unwrap());
    assert!(env.pause("paused", Duration::from_secs(600)).await);
    let names = ["a", "paused", "b"];

    let want = reserve_order(&plan);
    let mut one_by_one = Vec::new();
    while let Some(id) = env.reserve(1, &names).await {
        one_by_one.push(id);
    }
    assert_eq!(one_by_one, want, "successive reserves");
    for (id, pri) in &plan {
        assert!(env.release(1, id, *pri).await, "release {id}");
    }
    // Ready: the eight and the paused tube's two; urgent: all but the
    // jobs of priority 1024 and u32::MAX.
    let released = Counts {
        urgent: 8,
        ready: 10,
        ..counts(0, 0, 1, 1)
    };
    env.check_server(released, 12, 0, 4).await;

    let mut batched = Vec::new();
    loop {
        let got = batch(&env, 2, &names, 3).await;
        if got.is_empty() {
            break;
        }
        if batched.len() + 3 <= want.len() {
            assert_eq!(got.len(), 3, "a full batch while there are enough");
        }
        batched.extend(got);
    }
    assert_eq!(batched, want, "batches of three, one after another");
    let twice = JobCounters {
        reserves: 2,
        releases: 1,
        ..NO_COUNTERS
    };
    for (id, pri) in &plan {
        env.check_job(id, JobState::Reserved, *pri, twice).await;
    }
    // Held by the batch's connection, not the first one.
    assert!(!env.broker.finish(1, &want[0]).await.unwrap());
    assert!(env.broker.finish(2, &want[0]).await.unwrap());
    // The paused tube's jobs, the delayed and the buried are untouched.
    env.check_tube("paused", counts(2, 0, 0, 0), 2, 0).await;
    env.check_job(&delayed, JobState::Delayed, 0, NO_COUNTERS)
        .await;
    let buried_counters = JobCounters {
        buries: 1,
        ..RESERVED_ONCE
    };
    env.check_job(&buried, JobState::Buried, 0, buried_counters)
        .await;
    env.check_server(counts(2, 7, 1, 1), 12, 0, 4).await;
}

/// A batch takes at most `max` jobs, and what is ready when there are
/// fewer.
async fn reserve_batch_never_takes_more_than_max(env: Env<impl Store>) {
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(env.put(job("a")).await);
    }
    assert_eq!(batch(&env, 1, &["a"], 1).await, ids[..1]);
    assert_eq!(batch(&env, 1, &["a"], 2).await, ids[1..3]);
    assert_eq!(batch(&env, 2, &["a"], MAX_BATCH).await, ids[3..]);
    assert_eq!(batch(&env, 2, &["a"], MAX_BATCH).await, []);
    for id in &ids {
        env.check_job(id, JobState::Reserved, PRI, RESERVED_ONCE)
            .await;
        env.check_times(id, Duration::ZERO, Duration::ZERO, TTR, TTR)
            .await;
    }
    env.check_tube("a", counts(0, 6, 0, 0), 6, 0).await;
    // Each batch's connection holds its own.
    let mine = [ids[0].clone(), ids[3].clone()];
    assert_eq!(env.broker.remove_batch(1, &mine, true).await.unwrap(), 1);
    assert_eq!(env.broker.remove_batch(2, &mine, true).await.unwrap(), 1);
}

/// Nothing ready (delayed, buried, reserved, paused, no tube at all): an
/// empty batch, and no tube created.
async fn reserve_batch_with_nothing_ready_gets_nothing(env: Env<impl Store>) {
    env.put(job("a").delay(Duration::from_secs(10))).await;
    let buried = env.put(job("a")).await;
    assert_eq!(
        batch(&env, 1, &["a"], 5).await,
        std::slice::from_ref(&buried)
    );
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    let held = env.put(job("a")).await;
    assert_eq!(batch(&env, 1, &["a"], 5).await, [held]);
    env.put(job("p")).await;
    assert!(env.pause("p", Duration::from_secs(60)).await);
    for names in [&["a"][..], &["a", "p", "default"], &["nowhere"]] {
        assert_eq!(batch(&env, 2, names, MAX_BATCH).await, [], "{names:?}");
    }
    assert!(!env.tube_exists("nowhere").await, "a batch creates no tube");
    env.check_tube("a", counts(0, 1, 1, 1), 3, 0).await;
    env.check_tube("p", counts(1, 0, 0, 0), 1, 0).await;
}

/// Ready jobs in many tubes (on a cluster, over every shard): a batch at
/// least as large as what is ready takes every one, in `reserve`'s order.
async fn reserve_batch_over_many_tubes_gets_every_ready_job(env: Env<impl Store>) {
    let names: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut plan = Vec::new();
    for round in 0..5u32 {
        for (i, name) in names.iter().enumerate() {
            // A spread of priorities, many equal across tubes.
            let pri = (round * 7 + i as u32 * 3) % 5;
            plan.push((env.put(job(name).pri(pri)).await, pri));
        }
    }
    let ready = plan.len();
    let want = reserve_order(&plan);
    let got = batch(&env, 1, &names, ready).await;
    assert_eq!(got.len(), ready, "every ready job, with max = ready");
    assert_eq!(got, want, "in reserve's order");
    assert_eq!(batch(&env, 1, &names, MAX_BATCH).await, []);
    let total = ready as u64;
    env.check_server(counts(0, total, 0, 0), total, 0, 13).await;

    // Given back (finished) and put again: max over what is ready takes all.
    assert_eq!(env.broker.remove_batch(1, &got, true).await.unwrap(), total);
    let mut plan = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let pri = (i as u32) % 3;
        plan.push((env.put(job(name).pri(pri)).await, pri));
    }
    let got = batch(&env, 2, &names, MAX_BATCH).await;
    assert_eq!(got, reserve_order(&plan), "max over what is ready");
    env.check_server(counts(0, 12, 0, 0), total + 12, 0, 13)
        .await;
}

/// `remove_batch` with `finish` removes just the jobs the connection holds
/// and counts them; another connection's, ready, delayed, buried and
/// unknown ones are left as they were.
async fn remove_batch_finish_removes_only_what_the_connection_holds(env: Env<impl Store>) {
    let mine = env.put(job("default")).await;
    let mine_too = env.put(job("default").id("mine:2")).await;
    assert_eq!(
        batch(&env, 1, &["default"], 2).await,
        [mine.clone(), mine_too.clone()]
    );
    let theirs = env.put(job("default")).await;
    assert_eq!(env.reserve(2, &["default"]).await.as_ref(), Some(&theirs));
    let ready = env.put(job("default")).await;
    let delayed = env.put(job("default").delay(Duration::from_secs(10))).await;
    let buried = env.put(job("default")).await;
    assert_eq!(env.reserve_job(1, &buried).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    env.check_server(counts(1, 3, 1, 1), 6, 0, 1).await;

    let ids = [
        theirs.clone(),
        mine.clone(),
        ready.clone(),
        JobId::Server(999_999),
        delayed.clone(),
        named("no-such:job"),
        buried.clone(),
        mine_too.clone(),
    ];
    assert_eq!(env.broker.remove_batch(1, &ids, true).await.unwrap(), 2);
    for id in [&mine, &mine_too] {
        assert_eq!(env.broker.stats_job(id).await.unwrap(), None, "{id} went");
    }
    env.check_job(&theirs, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_job(&ready, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    env.check_job(&delayed, JobState::Delayed, PRI, NO_COUNTERS)
        .await;
    env.check_server(counts(1, 1, 1, 1), 6, 0, 1).await;
    env.check_tube("default", counts(1, 1, 1, 1), 6, 2).await;
    // Again: nothing this connection holds is left.
    assert_eq!(env.broker.remove_batch(1, &ids, true).await.unwrap(), 0);
    assert_eq!(env.broker.remove_batch(1, &[], true).await.unwrap(), 0);
    // The other connection finishes its own.
    assert_eq!(env.broker.remove_batch(2, &ids, true).await.unwrap(), 1);
    env.check_server(counts(1, 0, 1, 1), 6, 0, 1).await;
    env.check_tube("default", counts(1, 0, 1, 1), 6, 3).await;
}

/// `remove_batch` without `finish` deletes ready, delayed, buried and the
/// connection's own reserved jobs, in several tubes, but not a job another
/// connection holds.
async fn remove_batch_delete_spares_only_another_connections_jobs(env: Env<impl Store>) {
    let ready = env.put(job("a")).await;
    let delayed = env.put(job("b").delay(Duration::from_secs(10))).await;
    let buried = env.put(job("c").id("buried:1")).await;
    assert_eq!(env.reserve_job(1, &buried).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    let own = env.put(job("a")).await;
    assert_eq!(env.reserve_job(1, &own).await.as_ref(), Some(&own));
    let theirs = env.put(job("b")).await;
    assert_eq!(env.reserve_job(2, &theirs).await.as_ref(), Some(&theirs));
    env.check_server(counts(1, 2, 1, 1), 5, 0, 4).await;

    let ids = [
        ready.clone(),
        theirs.clone(),
        delayed.clone(),
        JobId::Server(999_999),
        buried.clone(),
        own.clone(),
    ];
    assert_eq!(env.broker.remove_batch(1, &ids, false).await.unwrap(), 4);
    for id in [&ready, &delayed, &buried, &own] {
        assert_eq!(env.broker.stats_job(id).await.unwrap(), None, "{id} went");
    }
    env.check_job(&theirs, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_server(counts(0, 1, 0, 0), 5, 0, 2).await;
    assert_eq!(env.broker.remove_batch(1, &ids, false).await.unwrap(), 0);
    assert_eq!(env.broker.remove_batch(2, &ids, false).await.unwrap(), 1);
    env.check_server(counts(0, 0, 0, 0), 5, 0, 1).await;
    assert!(!env.tube_exists("a").await, "a tube goes with its last job");
}
