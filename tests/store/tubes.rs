//! Tubes' lifetime: a tube exists while a connection uses or watches it or
//! it holds jobs, `default` always; `list_tubes` gives them in creation
//! order, and the server counts them.

use std::time::Duration;

use delayq::store::{Store, TubeRef};

use crate::check::{NO_JOBS, ONE_READY, PRI, Tweak, counts, job};
use crate::env::Env;

store_tests!(
    default_always_exists,
    a_tube_lives_while_used_or_watched,
    a_tube_lives_while_it_holds_jobs_in_any_state,
    list_tubes_gives_them_in_creation_order,
);

async fn default_always_exists(env: Env<impl Store>) {
    assert_eq!(env.tube_names().await, ["default"]);
    env.check_tube("default", NO_JOBS, 0, 0).await;
    env.check_users("default", 0, 0).await;
    env.check_server(NO_JOBS, 0, 0, 1).await;
    env.attach("default", TubeRef::Using).await;
    env.check_users("default", 1, 0).await;
    env.detach("default", TubeRef::Using).await;
    let id = env.put(job("default")).await;
    assert!(env.broker.delete(1, &id).await.unwrap());
    assert_eq!(env.tube_names().await, ["default"]);
    env.check_tube("default", NO_JOBS, 1, 1).await;
    env.check_users("default", 0, 0).await;
    env.check_server(NO_JOBS, 1, 0, 1).await;
}

async fn a_tube_lives_while_used_or_watched(env: Env<impl Store>) {
    env.attach("a", TubeRef::Using).await;
    env.check_users("a", 1, 0).await;
    env.attach("a", TubeRef::Watching).await;
    env.attach("a", TubeRef::Watching).await;
    env.check_users("a", 1, 2).await;
    env.check_server(NO_JOBS, 0, 0, 2).await;
    env.detach("a", TubeRef::Using).await;
    env.check_users("a", 0, 2).await;
    env.detach("a", TubeRef::Watching).await;
    env.check_users("a", 0, 1).await;
    env.detach("a", TubeRef::Watching).await;
    assert!(!env.tube_exists("a").await, "no one uses or watches it");
    env.check_server(NO_JOBS, 0, 0, 1).await;
}

async fn a_tube_lives_while_it_holds_jobs_in_any_state(env: Env<impl Store>) {
    let ready = env.put(job("r")).await;
    let delayed = env.put(job("d").delay(Duration::from_secs(10))).await;
    let held = env.put(job("x")).await;
    assert_eq!(env.reserve(1, &["x"]).await.as_ref(), Some(&held));
    let buried = env.put(job("b")).await;
    assert_eq!(env.reserve(1, &["b"]).await.as_ref(), Some(&buried));
    assert!(env.broker.bury(1, &buried, PRI).await.unwrap());
    // Used for a while, then left: the jobs keep each tube alive.
    for name in ["r", "d", "x", "b"] {
        env.attach(name, TubeRef::Using).await;
        env.detach(name, TubeRef::Using).await;
    }
    assert_eq!(env.tube_names().await, ["default", "r", "d", "x", "b"]);
    env.check_server(counts(1, 1, 1, 1), 4, 0, 5).await;
    for (name, id) in [("r", &ready), ("d", &delayed), ("x", &held), ("b", &buried)] {
        assert!(env.broker.delete(1, id).await.unwrap(), "delete {id}");
        assert!(!env.tube_exists(name).await, "tube {name} without its job");
    }
    assert_eq!(env.tube_names().await, ["default"]);
    env.check_server(NO_JOBS, 4, 0, 1).await;
}

async fn list_tubes_gives_them_in_creation_order(env: Env<impl Store>) {
    env.attach("c", TubeRef::Watching).await;
    let b = env.put(job("b")).await;
    env.attach("a", TubeRef::Using).await;
    assert_eq!(env.tube_names().await, ["default", "c", "b", "a"]);
    env.check_server(ONE_READY, 1, 0, 4).await;
    // A tube that goes and comes back is a new tube: last in the list.
    assert!(env.broker.delete(1, &b).await.unwrap());
    assert_eq!(env.tube_names().await, ["default", "c", "a"]);
    env.put(job("b")).await;
    assert_eq!(env.tube_names().await, ["default", "c", "a", "b"]);
    env.check_tube("b", ONE_READY, 1, 0).await;
    env.check_server(ONE_READY, 2, 0, 4).await;
}
