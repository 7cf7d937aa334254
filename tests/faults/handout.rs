//! Workers blocked on one process are handed what another process makes
//! ready, at once. Once a look has found their tube empty, a worker that
//! comes back for more queues without asking Redis, so the other process's
//! announcement is what brings it each job.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::common::daemon::Daemon;
use crate::common::redis::RedisServer;

/// Jobs put through the other process; half with a one-second delay.
const JOBS: usize = 40;
/// Far below the workers' reserve timeout (2 s), after which a worker
/// would look again and find a job whose announcement was missed.
const PROMPT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_on_one_process_get_at_once_what_another_makes_ready() {
    let redis = RedisServer::start(&[]);
    let a = Daemon::redis(&redis.url).await;
    let b = Daemon::redis(&redis.url).await;
    // Job number -> when it was due; and when a worker on A got each.
    let mut due: HashMap<usize, Instant> = HashMap::new();
    let got: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let received = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut c = a.client().await;
        let (got, received) = (got.clone(), received.clone());
        workers.push(tokio::spawn(async move {
            assert_eq!(c.cmd("watch hand").await, "WATCHING 2");
            while received.load(Ordering::SeqCst) < JOBS {
                let line = c.cmd("reserve-with-timeout 2").await;
                if line == "TIMED_OUT" {
                    continue;
                }
                let job = c.job_after("RESERVED", &line).await;
                let at = Instant::now();
                let n: usize = String::from_utf8(job.body).unwrap().parse().unwrap();
                got.lock().await.push((n, at));
                received.fetch_add(1, Ordering::SeqCst);
                assert_eq!(c.cmd(&format!("delete {}", job.id)).await, "DELETED");
            }
        }));
    }
    let mut producer = b.client().await;
    assert_eq!(producer.cmd("use hand").await, "USING hand");
    for n in 0..JOBS {
        let delay = (n % 2) as u32;
        due.insert(n, Instant::now() + Duration::from_secs(delay.into()));
        producer
            .put_ok(0, delay, 60, n.to_string().as_bytes())
            .await;
        // Time for the workers to come back and queue between jobs.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("the workers got every job")
            .expect("a worker failed");
    }
    let got = got.lock().await;
    let mut seen: Vec<usize> = got.iter().map(|&(n, _)| n).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..JOBS).collect::<Vec<_>>(), "each job once");
    let late: Vec<(usize, Duration)> = got
        .iter()
        .map(|&(n, at)| (n, at.saturating_duration_since(due[&n])))
        .filter(|&(_, late)| late > PROMPT)
        .collect();
    assert!(late.is_empty(), "handed over late: {late:?}");
}
