//! A snapshot and the log files around it, as a stop at the wrong moment
//! leaves them: a log that ends before the snapshot begins, log files a
//! compaction cut short left behind, and a spare that was being made the
//! next log file. Each state is made on disk from a real server's own
//! files, then started on, and what the next lives acknowledge must stay.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::{copy_dir, files_named, frames, log_files};

/// Small log files, so that a few hundred puts switch files and compact.
const SMALL_FILES: [&str; 2] = ["-s", "70000"];

/// The data directory's snapshots, oldest first.
fn snapshots(dir: &Path) -> Vec<PathBuf> {
    files_named(dir, "snapshot.")
}

/// The number of the first record after a snapshot (its name, in hex).
pub fn snapshot_start(path: &Path) -> u64 {
    let name = path.file_name().and_then(|n| n.to_str()).expect("a name");
    u64::from_str_radix(name.trim_start_matches("snapshot."), 16).expect("a hex start")
}

/// A frame's record number: after its length and checksum (see `frames`).
fn seq(data: &[u8], frame: (usize, usize)) -> u64 {
    u64::from_le_bytes(data[frame.0 + 8..frame.0 + 16].try_into().unwrap())
}

/// Stops the server as a deploy does, and waits until it has gone.
pub(crate) fn stop(mut daemon: Daemon) {
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success(), "delayq did not stop cleanly");
}

/// Puts and deletes 700-byte jobs until a snapshot has dropped the first
/// log file, which takes compaction.
pub(crate) async fn churn_until_compacted(c: &mut Client, dir: &Path) {
    let first = log_files(dir);
    assert!(!first.is_empty(), "no log files in {dir:?}");
    let filler = vec![b'f'; 700];
    let deadline = Instant::now() + Duration::from_secs(30);
    while log_files(dir).iter().any(|f| first.contains(f)) || snapshots(dir).is_empty() {
        assert!(Instant::now() < deadline, "compaction never happened");
        for _ in 0..50 {
            let id = c.put_ok(0, 0, 60, &filler).await;
            assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
        }
    }
}

/// A log that ends before the snapshot begins (what a power cut leaves
/// when the snapshot reached the disk and the last records of the log did
/// not): the changes of the lives after it are numbered on from the
/// snapshot's start, so that no later start takes them for records the
/// snapshot holds and skips them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_ending_before_the_snapshot_loses_nothing_acknowledged_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    let mut c = daemon.client().await;
    let kept = c.put_ok(0, 0, 60, b"in the snapshot").await;
    let gone = c.put_ok(0, 0, 60, b"deleted in the second life").await;
    churn_until_compacted(&mut c, dir.path()).await;
    drop(c);
    stop(daemon);

    // Cut the log from the record just before the snapshot's start on.
    let start = snapshot_start(snapshots(dir.path()).last().expect("a snapshot"));
    let logs = log_files(dir.path());
    let (holder, cut) = logs
        .iter()
        .find_map(|path| {
            let data = std::fs::read(path).expect("read a log file");
            frames(&data)
                .into_iter()
                .find(|&f| seq(&data, f) == start - 1)
                .map(|f| (path.clone(), f.0))
        })
        .expect("the record before the snapshot's start is in a log file");
    let mut data = std::fs::read(&holder).unwrap();
    data[cut..].fill(0);
    std::fs::write(&holder, &data).unwrap();
    for later in logs.iter().filter(|p| **p > holder) {
        std::fs::remove_file(later).unwrap();
    }
    // The clean stop's synced mark says those records were synced: the
    // start takes the cut for damage.
    let (status, stderr) = crate::start_or_refuse(dir.path(), &SMALL_FILES).expect("a refusal");
    assert!(
        !status.success() && stderr.contains("were synced"),
        "{stderr}"
    );
    // Records a power cut takes were never synced, so no synced mark says
    // they were: a mark that is not whole says nothing.
    let head = dir.path().join("head");
    let mut data = std::fs::read(&head).unwrap();
    data[256..276].fill(0);
    std::fs::write(&head, &data).unwrap();

    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    let mut c = daemon.client().await;
    assert_eq!(
        c.found(&format!("peek {kept}")).await.body,
        b"in the snapshot"
    );
    let mut acknowledged = Vec::new();
    for n in 0..3 {
        let body = format!("acknowledged in the second life {n}");
        acknowledged.push((c.put_ok(0, 0, 60, body.as_bytes()).await, body));
    }
    assert_eq!(c.cmd(&format!("delete {gone}")).await, "DELETED");
    drop(c);
    stop(daemon);

    for life in ["third", "fourth"] {
        let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
        let mut c = daemon.client().await;
        for (id, body) in &acknowledged {
            let job = c.found(&format!("peek {id}")).await;
            assert_eq!(job.body, body.as_bytes(), "job {id} in the {life} life");
        }
        assert_eq!(c.cmd(&format!("peek {gone}")).await, "NOT_FOUND", "{life}");
        assert_eq!(
            c.found(&format!("peek {kept}")).await.body,
            b"in the snapshot"
        );
        drop(c);
        stop(daemon);
    }
}

/// Log files wholly before the snapshot that a compaction cut short left
/// behind are removed at the next start, not kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_files_a_cut_short_compaction_left_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    let mut c = daemon.client().await;
    let kept = c.put_ok(0, 0, 60, b"kept").await;
    let first = log_files(dir.path())[0].clone();
    let saved = std::fs::read(&first).unwrap();
    churn_until_compacted(&mut c, dir.path()).await;
    drop(c);
    stop(daemon);
    // As if the server had stopped between writing the snapshot and
    // removing the files it made needless.
    assert!(!first.exists());
    std::fs::write(&first, &saved).unwrap();

    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    let mut c = daemon.client().await;
    assert_eq!(c.found(&format!("peek {kept}")).await.body, b"kept");
    assert!(!first.exists(), "{first:?} is still there after the start");
    drop(c);
    stop(daemon);
}

/// A spare the server was making the next log file when it stopped: its
/// header and the records written into it reached the disk, its new name
/// did not. Those records were never acknowledged. Reused as a spare, the
/// next life would write its own records over their start and leave the
/// rest after them, numbered on from them, for a later start to replay:
/// here a delete that nobody was told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_holding_records_that_never_reached_the_log_is_not_reused() {
    // The first life writes big files; the later ones take small files
    // and small jobs, so that the file it left is full for them and their
    // first change begins the next file.
    let big = ["-s", "1048576", "-z", "4000"];
    let small = ["-s", "4096", "-z", "1000"];
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &big).await;
    let mut c = daemon.client().await;
    let kept = c.put_ok(0, 0, 60, &[b'k'; 4000]).await;
    drop(c);
    stop(daemon);

    // Another life on a copy makes the records: a put, which begins a new
    // log file, then the delete.
    let copy = copy_dir(dir.path());
    let daemon = Daemon::durable(copy.path(), &small).await;
    let mut c = daemon.client().await;
    let put = c.put_ok(0, 0, 60, b"hello").await;
    assert_eq!(c.cmd(&format!("delete {kept}")).await, "DELETED");
    drop(c);
    stop(daemon);
    let newest = log_files(copy.path()).pop().expect("a log file");
    assert!(
        !log_files(dir.path())
            .iter()
            .any(|p| p.file_name() == newest.file_name()),
        "the put did not begin a new log file"
    );

    // That file, under a spare's name, in the first life's directory.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("spare."))
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    std::fs::copy(&newest, dir.path().join("spare.0")).unwrap();

    let daemon = Daemon::durable(dir.path(), &small).await;
    let mut c = daemon.client().await;
    assert_eq!(
        c.found(&format!("peek {kept}")).await.body,
        vec![b'k'; 4000]
    );
    // The same put as the other life's, a record of the same length.
    assert_eq!(c.put_ok(0, 0, 60, b"hello").await, put);
    drop(c);
    stop(daemon);

    let daemon = Daemon::durable(dir.path(), &small).await;
    let mut c = daemon.client().await;
    assert_eq!(
        c.found(&format!("peek {kept}")).await.body,
        vec![b'k'; 4000],
        "a delete nobody was told of was replayed"
    );
    assert_eq!(c.found(&format!("peek {put}")).await.body, b"hello");
    drop(c);
    stop(daemon);
}

/// Holds `n` (a multiple of 1000) client ids for `window`, each put and
/// deleted.
async fn hold_ids(c: &mut Client, n: usize, window: &str) {
    for chunk in 0..n / 1000 {
        let puts: String = (0..1000)
            .map(|i| format!("put 0 0 60 1 held:{chunk}-{i} unique={window}\r\nx\r\n"))
            .collect();
        c.send(puts.as_bytes()).await;
        let mut ids = Vec::new();
        for _ in 0..1000 {
            let line = c.line().await;
            ids.push(line.strip_prefix("INSERTED ").expect(&line).to_string());
        }
        c.send_line(&format!("delete-batch {}", ids.join(" ")))
            .await;
        c.line().await;
    }
}

/// Puts and deletes `pairs` (a multiple of 100) jobs of 100 bytes.
async fn churn(c: &mut Client, pairs: usize) {
    let body = "b".repeat(100);
    for _ in 0..pairs / 100 {
        c.send(
            format!("put 0 0 60 100\r\n{body}\r\n")
                .repeat(100)
                .as_bytes(),
        )
        .await;
        let mut deletes = String::new();
        for _ in 0..100 {
            let line = c.line().await;
            let id = line.strip_prefix("INSERTED ").expect(&line);
            deletes.push_str(&format!("delete {id}\r\n"));
        }
        c.send(deletes.as_bytes()).await;
        for _ in 0..100 {
            assert_eq!(c.line().await, "DELETED");
        }
    }
}

/// The state that is not jobs (client ids held by unique windows, here)
/// is live, as jobs are: a churn of jobs beside it is compacted as it
/// would be without it. Counted as dead, it made every new log file begin
/// a snapshot of all of it (a reviewer's put/delete pairs each wrote 1.9
/// KB to the disk beside 200,000 held ids, against 0.45 KB without).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_client_ids_are_not_compacted_again_at_every_new_log_file() {
    const HELD: usize = 20_000;
    const PAIRS: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    hold_ids(&mut c, HELD, "1h").await;
    let before = c.stats().await.num("binlog-records-migrated");
    churn(&mut c, PAIRS).await;
    // The churn writes about a third of what the held ids take: it may
    // end in one snapshot of them, not in one a file.
    let migrated = c.stats().await.num("binlog-records-migrated") - before;
    assert!(
        migrated <= (HELD + PAIRS) as u64,
        "{migrated} records rewritten while {PAIRS} jobs were put and deleted \
         beside {HELD} held client ids"
    );
}

/// Once their windows end, held client ids are no longer live: the next
/// churn compacts them away as soon as it would with none. They counted
/// as live until the next snapshot, which then came only once the churn
/// had written as much again (a reviewer's directory grew to 15.4 MB
/// over 7.5 MB of ids gone, where 1 MB is the rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_client_ids_whose_windows_ended_are_compacted_away() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    hold_ids(&mut c, 20_000, "2s").await;
    let held = snapshots(dir.path());
    assert!(!held.is_empty(), "holding the ids took no snapshot");
    let size = |p: &PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
    let largest = held.iter().map(size).max().unwrap();
    // The windows end, the last one's too (a put looks at its end itself),
    // and the timer frees the ids whose windows ended up to a second later.
    let last = "held:19-999";
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        c.send(format!("put 0 0 60 1 {last}\r\nx\r\n").as_bytes())
            .await;
        let reply = c.line().await;
        if reply == format!("INSERTED {last}") {
            break;
        }
        assert_eq!(reply, format!("EXISTS {last}"));
        assert!(Instant::now() < deadline, "the ids were never freed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(c.cmd(&format!("delete {last}")).await, "DELETED");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    churn(&mut c, 1_000).await;
    // The snapshot the churn asks for is written in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: Vec<u64> = snapshots(dir.path()).iter().map(size).collect();
        if now.iter().all(|&s| s < largest / 4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "snapshots of {now:?} bytes after the ids' windows ended, against {largest} \
             while they were held"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An older snapshot left beside the newest (a stop between the newest's
/// naming and the older's removal) goes at the next start, and the jobs
/// are the newest's and the log's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_snapshot_left_behind_goes_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    let mut c = daemon.client().await;
    let kept = c.put_ok(0, 0, 60, b"kept").await;
    churn_until_compacted(&mut c, dir.path()).await;
    let older = snapshots(dir.path()).pop().expect("a snapshot");
    let copy = std::fs::read(&older).unwrap();
    let gone = c
        .put_ok(0, 0, 60, b"deleted after the older snapshot")
        .await;
    assert_eq!(c.cmd(&format!("delete {gone}")).await, "DELETED");
    churn_until_compacted(&mut c, dir.path()).await;
    let newest = snapshots(dir.path()).pop().expect("a snapshot");
    assert!(
        newest > older,
        "a later snapshot: {newest:?} after {older:?}"
    );
    drop(c);
    stop(daemon);
    std::fs::write(&older, &copy).unwrap();

    let daemon = Daemon::durable(dir.path(), &SMALL_FILES).await;
    assert_eq!(snapshots(dir.path()), [newest], "the older one went");
    let mut c = daemon.client().await;
    assert_eq!(c.found(&format!("peek {kept}")).await.body, b"kept");
    assert_eq!(c.cmd(&format!("peek {gone}")).await, "NOT_FOUND");
}
