//! What the broker does for connections: hands ready jobs to those blocked
//! in `reserve` (`wait`), longest waiting first, from whatever made the job
//! ready; gives a job back when its waiter has gone (`give_back`, which
//! undoes the reserve and its counter); and returns a departed
//! connection's jobs (`release_all`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use delayq::broker::Handout;
use delayq::job::{Counts, JobState};
use delayq::names::{JobId, Tube};
use delayq::store::{Store, TubeRef};
use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::check::{
    NO_COUNTERS, NO_JOBS, ONE_READY, ONE_RESERVED, PRI, RESERVED_ONCE, TTR, Tweak, job, tube, tubes,
};
use crate::env::Env;

store_tests!(
    a_waiting_connection_is_handed_a_job_put_afterwards,
    a_job_already_ready_is_handed_over_as_the_connection_waits,
    the_longest_waiting_connection_is_served_first,
    a_connection_waiting_on_several_tubes_is_served_from_any,
    stop_waiting_withdraws_the_connection,
    a_job_whose_waiter_has_gone_is_given_back,
    every_way_a_job_becomes_ready_serves_the_waiting,
    the_timer_serves_the_waiting,
    release_all_returns_only_the_connections_own_jobs,
    a_tube_known_empty_spares_the_look_and_still_serves_the_waiting,
    a_job_made_ready_between_the_look_and_the_queueing_is_handed_over,
    use_and_watch_counts_add_up_when_many_change_at_once,
);

/// The tubes a waiting connection waits on.
fn on(names: &[&str]) -> Arc<[Tube]> {
    tubes(names).into()
}

/// The id of the job a waiter was handed; fails if it has none yet.
#[track_caller]
fn handed(rx: &mut oneshot::Receiver<Handout>) -> JobId {
    match rx.try_recv() {
        Ok(handout) => handout.got.job.id,
        Err(e) => panic!("the waiter was handed nothing: {e:?}"),
    }
}

impl<S: Store> Env<S> {
    /// Blocks `conn` on `name` as a session's `reserve` does: looks at the
    /// store unless the tube is known to have nothing, then queues. Returns
    /// whether the look was spared, and the receiver.
    async fn block(&self, conn: u64, name: &str) -> (bool, oneshot::Receiver<Handout>) {
        let tubes = on(&[name]);
        let (looked, known_empty) = self.broker.look(&tubes);
        if !known_empty {
            let got = self.broker.reserve(conn, &tubes).await.unwrap();
            assert!(got.is_none(), "{name} has a job ready: {got:?}");
        }
        let (_, rx, serve) = self.broker.register(conn, tubes.clone(), Some(looked));
        if serve {
            self.broker.serve_waiting(&tubes).await;
        }
        (known_empty, rx)
    }

    /// Connections waiting on a tube (the broker's figure, in stats-tube),
    /// and on any tube (in stats).
    async fn waiting(&self, name: &str) -> (u64, u64) {
        let on_tube = self.broker.stats_tube(&tube(name)).await.unwrap();
        let (_, total) = self.broker.stats().await.unwrap();
        (on_tube.expect("the tube exists").1, total)
    }
}

async fn a_waiting_connection_is_handed_a_job_put_afterwards(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let (waiter, mut rx) = env.broker.wait(1, on(&["a"]), None).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "nothing yet");
    assert_eq!(env.waiting("a").await, (1, 1));
    let id = env.put(job("a")).await;
    let got = rx.try_recv().expect("handed the job").got;
    assert_eq!((&got.job.id, got.ttr), (&id, TTR));
    assert_eq!(env.waiting("a").await, (0, 0));
    assert!(!env.broker.stop_waiting(waiter), "already served");
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
    // Reserved for the waiting connection, no other.
    assert!(!env.broker.finish(2, &id).await.unwrap());
    assert!(env.broker.finish(1, &id).await.unwrap());
}

async fn a_job_already_ready_is_handed_over_as_the_connection_waits(env: Env<impl Store>) {
    let id = env.put(job("a")).await;
    let (_, mut rx) = env.broker.wait(1, on(&["a"]), None).await;
    assert_eq!(handed(&mut rx), id);
    assert_eq!(env.waiting("a").await, (0, 0));
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_tube("a", ONE_RESERVED, 1, 0).await;
}

async fn the_longest_waiting_connection_is_served_first(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let mut waiters = Vec::new();
    for conn in 1..=3 {
        waiters.push(env.broker.wait(conn, on(&["a"]), None).await.1);
    }
    let first = env.put(job("a")).await;
    let second = env.put(job("a")).await;
    assert_eq!(handed(&mut waiters[0]), first);
    assert_eq!(handed(&mut waiters[1]), second);
    assert_eq!(waiters[2].try_recv(), Err(TryRecvError::Empty));
    assert_eq!(env.waiting("a").await, (1, 1));
    for (conn, id) in [(1, &first), (2, &second)] {
        assert!(!env.broker.finish(3, id).await.unwrap());
        assert!(
            env.broker.finish(conn, id).await.unwrap(),
            "{conn} holds {id}"
        );
    }
}

async fn a_connection_waiting_on_several_tubes_is_served_from_any(env: Env<impl Store>) {
    for name in ["a", "b"] {
        env.attach(name, TubeRef::Watching).await;
    }
    let (_, mut rx) = env.broker.wait(1, on(&["a", "b"]), None).await;
    assert_eq!(env.waiting("a").await, (1, 1));
    assert_eq!(env.waiting("b").await, (1, 1));
    let id = env.put(job("b")).await;
    assert_eq!(handed(&mut rx), id);
    assert_eq!(env.waiting("a").await, (0, 0), "served, so off every queue");
}

async fn stop_waiting_withdraws_the_connection(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let (waiter, mut rx) = env.broker.wait(1, on(&["a"]), None).await;
    assert!(env.broker.stop_waiting(waiter));
    assert!(!env.broker.stop_waiting(waiter), "withdrawn already");
    assert_eq!(env.waiting("a").await, (0, 0));
    let id = env.put(job("a")).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    env.check_job(&id, JobState::Ready, PRI, NO_COUNTERS).await;
    env.check_tube("a", ONE_READY, 1, 0).await;
}

async fn a_job_whose_waiter_has_gone_is_given_back(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    // Gone without a word (its receiver dropped): the job it was handed
    // comes back as if never reserved.
    drop(env.broker.wait(1, on(&["a"]), None).await);
    let lone = env.put(job("a")).await;
    env.check_job(&lone, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    env.check_tube("a", ONE_READY, 1, 0).await;
    assert_eq!(env.waiting("a").await, (0, 0));
    assert!(env.broker.delete(1, &lone).await.unwrap());
    // With another connection waiting behind it, that one gets the job.
    drop(env.broker.wait(2, on(&["a"]), None).await);
    let (_, mut rx) = env.broker.wait(3, on(&["a"]), None).await;
    let id = env.put(job("a")).await;
    assert_eq!(handed(&mut rx), id);
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    assert!(!env.broker.finish(2, &id).await.unwrap());
    assert!(env.broker.finish(3, &id).await.unwrap());
    env.check_tube("a", NO_JOBS, 2, 2).await;
}

async fn every_way_a_job_becomes_ready_serves_the_waiting(env: Env<impl Store>) {
    let a = tube("a");
    env.attach("a", TubeRef::Watching).await;

    let released = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&released));
    let (_, mut rx) = env.broker.wait(2, on(&["a"]), None).await;
    assert!(env.release(1, &released, PRI).await);
    assert_eq!(handed(&mut rx), released, "release");

    let buried = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    let (_, mut rx) = env.broker.wait(2, on(&["a"]), None).await;
    assert_eq!(env.broker.kick(&a, 1).await.unwrap(), 1);
    assert_eq!(handed(&mut rx), buried, "kick");

    let delay = Duration::from_secs(10);
    let delayed = env.put(job("a").delay(delay)).await;
    let (_, mut rx) = env.broker.wait(2, on(&["a"]), None).await;
    assert!(env.broker.kick_job(&delayed).await.unwrap());
    assert_eq!(handed(&mut rx), delayed, "kick-job");

    assert!(env.pause("a", Duration::from_secs(60)).await);
    let (_, mut rx) = env.broker.wait(2, on(&["a"]), None).await;
    let paused = env.put(job("a")).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "paused");
    assert!(env.pause("a", Duration::ZERO).await);
    assert_eq!(handed(&mut rx), paused, "pause-tube 0");

    let held = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&held));
    let (_, mut rx) = env.broker.wait(2, on(&["a"]), None).await;
    env.broker
        .release_all(1, std::slice::from_ref(&held), true)
        .await
        .unwrap();
    assert_eq!(handed(&mut rx), held, "release-all");

    let reserved = Counts {
        reserved: 5,
        ..NO_JOBS
    };
    env.check_tube("a", reserved, 5, 0).await;
}

async fn the_timer_serves_the_waiting(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let second = Duration::from_secs(1);
    let id = env.put(job("a").delay(second)).await;
    let (_, mut rx) = env.broker.wait(1, on(&["a"]), None).await;
    env.advance(second).await;
    assert_eq!(
        rx.try_recv(),
        Err(TryRecvError::Empty),
        "nothing runs the timer but tick"
    );
    // The tick's answer is from before the hand-out: then nothing was
    // pending; the TTR the waiter's reserve started is the broker's to
    // schedule.
    assert_eq!(env.broker.tick().await.unwrap(), None);
    assert_eq!(handed(&mut rx), id);
    env.check_job(&id, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_times(&id, second, second, TTR, TTR).await;
}

async fn release_all_returns_only_the_connections_own_jobs(env: Env<impl Store>) {
    let mine_a = env.put(job("a")).await;
    let mine_b = env.put(job("b")).await;
    let theirs = env.put(job("a")).await;
    let ready = env.put(job("a")).await;
    assert_eq!(env.reserve(1, &["a"]).await.as_ref(), Some(&mine_a));
    assert_eq!(env.reserve(1, &["b"]).await.as_ref(), Some(&mine_b));
    assert_eq!(env.reserve(2, &["a"]).await.as_ref(), Some(&theirs));
    // What connection 1 believes it holds may name jobs it does not.
    let held = [
        mine_a.clone(),
        mine_b.clone(),
        theirs.clone(),
        ready.clone(),
    ];
    env.broker.release_all(1, &held, true).await.unwrap();
    // Back as if never taken from the queue: no release is counted.
    env.check_job(&mine_a, JobState::Ready, PRI, RESERVED_ONCE)
        .await;
    env.check_job(&mine_b, JobState::Ready, PRI, RESERVED_ONCE)
        .await;
    env.check_job(&theirs, JobState::Reserved, PRI, RESERVED_ONCE)
        .await;
    env.check_job(&ready, JobState::Ready, PRI, NO_COUNTERS)
        .await;
    let a = Counts {
        urgent: 2,
        ready: 2,
        reserved: 1,
        ..NO_JOBS
    };
    env.check_tube("a", a, 3, 0).await;
    env.check_tube("b", ONE_READY, 1, 0).await;
    assert!(env.broker.finish(2, &theirs).await.unwrap());
    assert!(!env.broker.finish(1, &mine_a).await.unwrap());
}

/// A reserve whose tubes a look found empty, with nothing made ready since,
/// queues without asking the store (on Redis, a round trip per worker that
/// comes back for more while its tube is empty): whatever makes a job ready
/// next is followed by a hand-out, which finds it queued.
async fn a_tube_known_empty_spares_the_look_and_still_serves_the_waiting(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let (spared, mut first) = env.block(1, "a").await;
    assert!(!spared, "nothing was known of the tube before");
    let (spared, mut second) = env.block(2, "a").await;
    assert!(
        spared,
        "the first look found nothing, and nothing came since"
    );
    let (spared, mut third) = env.block(3, "a").await;
    assert!(spared);
    // Another tube's job says nothing of this one.
    env.put(job("b")).await;
    assert!(env.broker.look(&on(&["a"])).1, "b's job is not a's");

    let put = env.put(job("a")).await;
    assert_eq!(handed(&mut first), put, "put");
    // The hand-out found nothing more for the others.
    assert!(env.broker.look(&on(&["a"])).1);
    assert!(env.release(1, &put, PRI).await);
    assert_eq!(handed(&mut second), put, "release");

    let (spared, mut fourth) = env.block(4, "a").await;
    assert!(spared);
    (env.broker
        .release_all(2, std::slice::from_ref(&put), true)
        .await)
        .unwrap();
    assert_eq!(handed(&mut third), put, "release-all");

    let second = Duration::from_secs(1);
    let delayed = env.put(job("a").delay(second)).await;
    let (spared, mut fifth) = env.block(5, "a").await;
    assert!(spared, "a delayed job is no ready one");
    env.advance(second).await;
    env.broker.tick().await.unwrap();
    let last = env.put(job("a")).await;
    // The longer waiting got the older job. (On a cluster the reserves of
    // one hand-out round run at once, and the first one there asks every
    // shard what it holds: the other waits for that, and so comes second.)
    assert_eq!(
        [handed(&mut fourth), handed(&mut fifth)],
        [delayed, last],
        "timer, then put"
    );
    assert_eq!(env.waiting("a").await, (0, 0));
    // With nobody waiting, nothing is known: the next reserve looks.
    assert!(!env.broker.look(&on(&["a"])).1);
}

/// The race the serving after a reserve's queueing is for: a job made ready
/// after its look, while nobody waited, is handed over once it queues.
async fn a_job_made_ready_between_the_look_and_the_queueing_is_handed_over(env: Env<impl Store>) {
    env.attach("a", TubeRef::Watching).await;
    let tubes = on(&["a"]);
    let (looked, known_empty) = env.broker.look(&tubes);
    assert!(!known_empty);
    assert!(env.broker.reserve(1, &tubes).await.unwrap().is_none());
    let id = env.put(job("a")).await;
    let (_, mut rx, serve) = env.broker.register(1, tubes.clone(), Some(looked));
    assert!(serve, "a job was made ready after the look");
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    env.broker.serve_waiting(&tubes).await;
    assert_eq!(handed(&mut rx), id);
    // Queued again right after a look that found nothing, and nothing
    // made ready since: no serving is needed.
    let (looked, _) = env.broker.look(&tubes);
    assert!(env.broker.reserve(2, &tubes).await.unwrap().is_none());
    // Nor is a timer tick that made nothing ready a reason to serve.
    env.broker.tick().await.unwrap();
    let (_, _, serve) = env.broker.register(2, tubes, Some(looked));
    assert!(!serve);
}

/// Use and watch counts changed by many connections at once (on Redis they
/// are gathered into one change per tube and count) add up, including
/// changes that cancel out.
async fn use_and_watch_counts_add_up_when_many_change_at_once(env: Env<impl Store>) {
    let a = tube("a");
    let mut changes = Vec::new();
    for i in 0..300 {
        changes.push((TubeRef::Using, i < 200));
        changes.push((TubeRef::Watching, i < 250));
    }
    for (how, on) in &changes {
        if !on {
            // Attached first, so that each detach undoes an attach.
            env.broker.attach(&a, *how).await.unwrap();
        }
    }
    let (broker, a) = (&env.broker, &a);
    let all = changes.iter().map(|&(how, on)| async move {
        if on {
            broker.attach(a, how).await
        } else {
            broker.detach(a, how).await
        }
    });
    for result in futures_util::future::join_all(all).await {
        result.unwrap();
    }
    let stats = env
        .broker
        .stats_tube(a)
        .await
        .unwrap()
        .expect("the tube exists");
    assert_eq!((stats.0.using, stats.0.watching), (200, 250));

    // A change is on its way once its future is first polled, ahead of
    // whatever is asked after, as a new connection's count of `default`
    // is (the connection does not wait for it).
    let b = tube("b");
    let mut using = Box::pin(env.broker.attach(&b, TubeRef::Using));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // An embedded engine is done at once; a remote one is under way.
    let first = using.as_mut().poll(&mut cx);
    let stats = env.broker.stats_tube(&b).await.unwrap();
    assert_eq!(stats.map(|s| s.0.using), Some(1), "counted before asked");
    match first {
        std::task::Poll::Ready(done) => done.unwrap(),
        std::task::Poll::Pending => using.await.unwrap(),
    }
}
