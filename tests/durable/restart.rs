//! Restarts: every state and every field of a job comes back after SIGKILL,
//! after a second SIGKILL right after the recovery, and after SIGTERM.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::daemon::Daemon;
use crate::common::{Client, every_byte};

/// What `stats-job` says of each job, less what moves with the clock (age,
/// time left) or the log's layout (file).
async fn image(c: &mut Client, ids: &[String]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for id in ids {
        let stats = c.stats_job(id).await;
        let fields = stats
            .map()
            .into_iter()
            .filter(|(k, _)| !["age", "time-left", "file"].contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        out.insert(id.clone(), fields);
    }
    out
}

fn inserted(reply: &str) -> String {
    reply
        .strip_prefix("INSERTED ")
        .unwrap_or_else(|| panic!("expected INSERTED, got {reply:?}"))
        .to_string()
}

/// Jobs in every state, in two tubes, with client ids and every byte in a
/// body, and their counters moved; returns the ids and which was reserved.
async fn populate(c: &mut Client, worker: &mut Client) -> (Vec<String>, String) {
    let mut ids = Vec::new();
    c.cmd("use mail").await;
    // Ready, same priority: their order must survive.
    for n in 0..3 {
        ids.push(inserted(
            &c.put(7, 0, 60, format!("fifo {n}").as_bytes()).await,
        ));
    }
    // Delayed for an hour, with every byte in its body, and one by its own id.
    ids.push(inserted(&c.put(3, 3600, 30, &every_byte()).await));
    ids.push(inserted(
        &c.put_id(5, 3600, 30, b"close it", "order-close:4711").await,
    ));
    c.cmd("use default").await;
    // Three buried in a chosen order (b, c, a), each reserved first.
    let mut buried = Vec::new();
    for name in ["a", "b", "c"] {
        buried.push(inserted(&c.put(99, 0, 60, name.as_bytes()).await));
    }
    for &n in &[1usize, 2, 0] {
        let job = worker.reserved(&format!("reserve-job {}", buried[n])).await;
        assert_eq!(worker.cmd(&format!("bury {} 42", job.id)).await, "BURIED");
    }
    // One released (counted), kicked back from burial (counted), then held.
    let held = inserted(&c.put(1, 0, 120, b"held").await);
    worker.reserved(&format!("reserve-job {held}")).await;
    assert_eq!(worker.cmd(&format!("release {held} 1 0")).await, "RELEASED");
    worker.reserved(&format!("reserve-job {held}")).await;
    assert_eq!(worker.cmd(&format!("bury {held} 1")).await, "BURIED");
    assert_eq!(c.cmd(&format!("kick-job {held}")).await, "KICKED");
    worker.reserved(&format!("reserve-job {held}")).await;
    ids.extend(buried);
    ids.push(held.clone());
    (ids, held)
}

/// After SIGKILL every job is back with every field; the held one is ready
/// again; then a second SIGKILL right after the recovery changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_and_field_survives_sigkill_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let mut worker = daemon.client().await;
    let (ids, held) = populate(&mut c, &mut worker).await;
    let before = image(&mut c, &ids).await;
    let tubes = c.tubes().await;
    let max_before: u64 = ids.iter().filter_map(|i| i.parse().ok()).max().unwrap();
    daemon.kill();

    let mut expected = before.clone();
    // Its worker's connection died with the process: ready again, as in
    // beanstalkd, its counters kept.
    expected
        .get_mut(&held)
        .unwrap()
        .insert("state".into(), "ready".into());
    for round in ["first", "second"] {
        let daemon_now = Daemon::durable(dir.path(), &[]).await;
        let mut c = daemon_now.client().await;
        assert_eq!(
            image(&mut c, &ids).await,
            expected,
            "after the {round} SIGKILL"
        );
        let mut now_tubes = c.tubes().await;
        now_tubes.sort();
        let mut want = tubes.clone();
        want.sort();
        assert_eq!(now_tubes, want, "tubes after the {round} SIGKILL");
        let mut dead = daemon_now;
        dead.kill();
    }

    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    // Client ids still answer EXISTS; server ids go on above the old ones.
    assert_eq!(
        c.put_id(5, 0, 30, b"again", "order-close:4711").await,
        "EXISTS order-close:4711"
    );
    let next: u64 = inserted(&c.put(0, 0, 30, b"new").await).parse().unwrap();
    assert!(next > max_before, "id {next} reused (had {max_before})");
    // Buried in the order they were buried.
    for want in [&ids[6], &ids[7], &ids[5]] {
        let found = c.found("peek-buried").await;
        assert_eq!(&found.id, want);
        assert_eq!(c.cmd(&format!("kick-job {want}")).await, "KICKED");
    }
    // The every-byte body, byte for byte.
    let found = c.found(&format!("peek {}", ids[3])).await;
    assert_eq!(found.body, every_byte());
    // FIFO within a priority: the three equal-priority jobs in put order.
    c.cmd("watch mail").await;
    c.cmd("ignore default").await;
    for (n, id) in ids[..3].iter().enumerate() {
        let job = c.reserved("reserve-with-timeout 0").await;
        assert_eq!((&job.id, job.body), (id, format!("fifo {n}").into_bytes()));
    }
}

/// A graceful stop (SIGTERM) keeps everything too, and gives the held job
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &["-f", "1000"]).await;
    let mut c = daemon.client().await;
    let mut worker = daemon.client().await;
    let (ids, held) = populate(&mut c, &mut worker).await;
    let mut expected = image(&mut c, &ids).await;
    expected
        .get_mut(&held)
        .unwrap()
        .insert("state".into(), "ready".into());
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success());
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(image(&mut c, &ids).await, expected);
}

/// Due times are wall-clock times: a job due in 2 s, with the server down
/// for 3 s, is ready as soon as it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_due_during_an_outage_is_ready_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let id = inserted(&c.put(0, 2, 30, b"due soon").await);
    let later = inserted(&c.put(0, 3600, 30, b"due later").await);
    let put_at = Instant::now();
    daemon.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(job.id, id);
    assert!(put_at.elapsed() >= Duration::from_secs(3));
    let stats = c.stats_job(&later).await;
    assert_eq!(stats.get("state"), "delayed");
    let left = stats.num("time-left");
    assert!((3590..=3597).contains(&left), "time-left {left}");
}
