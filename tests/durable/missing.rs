//! Lost and foreign files: the newest log file (or the only one after a
//! snapshot) removed, which the series alone does not show, and files
//! whose header is bad or names another number. Each is refused, naming
//! what is wrong; with `--salvage` the start goes on without it, never
//! handing out a server id again, and the next start needs no salvage
//! (but for a file lost from the middle of the series).

use std::path::{Path, PathBuf};

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::snapshot::{churn_until_compacted, snapshot_start, stop};
use crate::{copy_dir, files_named, log_files, start_or_refuse};

/// Small log files: a few hundred puts of 1 KB fill several.
const FILES: &[&str] = &["-s", "70000"];
const SALVAGE: &[&str] = &["-s", "70000", "--salvage"];

/// A body of about 1 KB that says which job it is.
fn body(k: usize) -> Vec<u8> {
    let mut b = format!("job {k} ").into_bytes();
    b.resize(1000, b'x');
    b
}

/// Puts `n` jobs, stops the server (SIGTERM); returns the directory and
/// the highest server id handed out.
async fn filled(n: usize) -> (tempfile::TempDir, u64) {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    let mut last = 0;
    for k in 0..n {
        last = c.put_ok(0, 0, 60, &body(k)).await;
    }
    drop(c);
    stop(daemon);
    assert!(log_files(dir.path()).len() >= 4, "too few log files");
    (dir, last)
}

/// The server ids of the ready jobs of a server, reserved one by one.
async fn ready_ids(c: &mut Client) -> Vec<u64> {
    crate::reserve_all(c)
        .await
        .into_iter()
        .map(|job| job.id.parse().unwrap())
        .collect()
}

/// The refusal of a start on `dir`: it exits with an error, saying all
/// of `says`; a second try is refused alike (refusing changed nothing).
fn refused(dir: &Path, says: &[&str]) -> String {
    let (status, stderr) = start_or_refuse(dir, FILES).expect("a refusal, not a start");
    assert!(!status.success(), "exit status {status}");
    for s in says {
        assert!(stderr.contains(s), "says {s:?}: {stderr}");
    }
    assert!(start_or_refuse(dir, FILES).is_some(), "refused only once");
    stderr
}

fn name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap()
}

/// A server with `--salvage` on `dir`, its log in `log`, killed after it
/// served: the ready jobs' ids, then a put's id.
async fn salvage_start(dir: &Path, log: &Path) -> (Vec<u64>, u64) {
    let mut daemon = Daemon::durable_logged(dir, SALVAGE, log).await;
    let mut c = daemon.client().await;
    let ready = ready_ids(&mut c).await;
    let put = c.put_ok(0, 0, 60, b"after the salvage").await;
    drop(c);
    daemon.kill();
    (ready, put)
}

/// A server with `--salvage` on `dir`, its log in `log`: the ready jobs'
/// ids, then a put's id; then a start without `--salvage` that must
/// succeed, and a put's id there.
async fn salvaged(dir: &Path, log: &Path) -> (Vec<u64>, u64, u64) {
    let (ready, put) = salvage_start(dir, log).await;
    let daemon = Daemon::durable(dir, FILES).await;
    let mut c = daemon.client().await;
    let again = c.put_ok(0, 0, 60, b"after the next start").await;
    (ready, put, again)
}

/// The newest log file removed: refused, naming it; with `--salvage` the
/// rest is served, and the next ids are past every one the lost file
/// could have handed out; the next start needs no salvage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_newest_log_file_is_refused_then_salvaged_without_reusing_ids() {
    const N: usize = 300;
    let (dir, last) = filled(N).await;
    let newest = log_files(dir.path()).pop().unwrap();
    std::fs::remove_file(&newest).unwrap();
    refused(dir.path(), &[name(&newest), "missing", "--salvage"]);

    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    let (ready, put, again) = salvaged(dir.path(), &log).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains(name(&newest)), "names the file: {said}");
    assert!(
        !ready.is_empty() && ready.len() < N,
        "{} of {N} jobs",
        ready.len()
    );
    assert_eq!(ready, (1..=ready.len() as u64).collect::<Vec<_>>());
    assert!(
        put > last,
        "id {put} handed out again (the last was {last})"
    );
    assert!(again > put, "id {again} after {put}");
}

/// The only log file after a snapshot (every log file) removed: the
/// snapshot alone looked like a whole directory. Refused; with `--salvage`
/// the snapshot's jobs are served, and no id is handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_log_after_a_snapshot_is_refused_then_salvaged() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    let kept = [
        c.put_ok(0, 0, 60, b"kept 0").await,
        c.put_ok(0, 0, 60, b"kept 1").await,
    ];
    churn_until_compacted(&mut c, dir.path()).await;
    let last = c.put_ok(0, 0, 60, b"after the snapshot").await;
    drop(c);
    stop(daemon);
    assert!(!files_named(dir.path(), "snapshot.").is_empty());
    let logs = log_files(dir.path());
    for path in &logs {
        std::fs::remove_file(path).unwrap();
    }
    refused(dir.path(), &[name(logs.last().unwrap()), "missing"]);

    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    let (ready, put, again) = salvaged(dir.path(), &log).await;
    // Jobs put before the snapshot and deleted after it come back: their
    // deletes were in the lost file.
    assert!(
        ready.starts_with(&kept) && ready.iter().all(|&id| id <= last),
        "the snapshot's jobs: {ready:?}"
    );
    assert!(
        put > last,
        "id {put} handed out again (the last was {last})"
    );
    assert!(again > put, "id {again} after {put}");
}

/// A log file of the middle whose magic is damaged: refused, naming it;
/// with `--salvage` skipped whole (its jobs lost, said so), set aside as
/// `*.damaged`, and the rest served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_header_is_refused_then_skipped_whole_with_salvage() {
    const N: usize = 300;
    let (dir, last) = filled(N).await;
    let bad = log_files(dir.path())[1].clone();
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&bad, &bytes).unwrap();
    refused(dir.path(), &[name(&bad), "bad header", "--salvage"]);

    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    let (ready, put) = salvage_start(dir.path(), &log).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains(name(&bad)) && said.contains("lost"),
        "names the file and says its records are lost: {said}"
    );
    assert!(
        !ready.is_empty() && ready.len() < N,
        "{} of {N} jobs",
        ready.len()
    );
    assert!(
        put > last,
        "id {put} handed out again (the last was {last})"
    );
    assert!(!bad.exists(), "set aside");
    let aside = PathBuf::from(format!("{}.damaged", bad.display()));
    assert_eq!(std::fs::read(&aside).unwrap(), bytes, "kept as it was");
}

/// Files that are not the log files their names say: an empty file after
/// the newest, and a copy of the first saved under a later number (its
/// header names another). Refused; with `--salvage` set aside, every job
/// served, and the next start needs no salvage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_log_files_are_refused_then_set_aside_with_salvage() {
    const N: usize = 300;
    let (dir, last) = filled(N).await;
    let logs = log_files(dir.path());
    let number = |p: &Path| u64::from_str_radix(&name(p)[4..], 16).unwrap();
    let newest = number(logs.last().unwrap());
    let empty = |to: &Path| std::fs::write(to.join(format!("log.{:016x}", newest + 1)), b"");
    let copy = |to: &Path| {
        let at = to.join(format!("log.{:016x}", newest + 3));
        std::fs::copy(to.join(name(&logs[0])), at).map(drop)
    };
    for (what, make) in [
        ("empty", &empty as &dyn Fn(&Path) -> std::io::Result<()>),
        ("copy", &copy),
    ] {
        let copy_of = copy_dir(dir.path());
        let at = copy_of.path();
        make(at).unwrap();
        let foreign = log_files(at).pop().unwrap();
        let original = std::fs::read(&foreign).unwrap();
        refused(at, &[name(&foreign)]);
        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("delayq.log");
        let (ready, put, again) = salvaged(at, &log).await;
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(said.contains(name(&foreign)), "{what}: names it: {said}");
        assert_eq!(ready.len(), N, "{what}: every job");
        assert!(put > last, "{what}: id {put} after {last}");
        assert!(again > put, "{what}: id {again} after {put}");
        // Set aside; a new log file may take its number since (a salvaged
        // start begins one).
        assert!(
            std::fs::read(&foreign).map_or(true, |now| now != original),
            "{what}: set aside"
        );
        assert!(
            files_named(at, name(&foreign))
                .iter()
                .any(|p| name(p).ends_with(".damaged")),
            "{what}: kept aside"
        );
    }
}

/// A snapshot whose header is damaged: refused, naming it; with
/// `--salvage` skipped whole and set aside, and the start goes on with the
/// log files there (the records before them are missing, and skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_with_a_bad_header_is_refused_then_skipped_with_salvage() {
    bad_snapshot_header(0).await;
}

/// The same with a flip in the header's zeros (bytes 12 to 15 and, in a
/// snapshot, 24 to 31), which a header without a checksum of its own must
/// check as it checks the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_with_a_flip_in_its_header_zeros_is_refused_then_skipped_with_salvage() {
    bad_snapshot_header(13).await;
    bad_snapshot_header(28).await;
}

/// Damages a snapshot's header at byte `at`, then checks the refusal and
/// the salvage.
async fn bad_snapshot_header(at: usize) {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    c.put_ok(0, 0, 60, b"kept").await;
    churn_until_compacted(&mut c, dir.path()).await;
    let last = c.put_ok(0, 0, 60, b"after the snapshot").await;
    drop(c);
    stop(daemon);
    let snapshot = files_named(dir.path(), "snapshot.").pop().unwrap();
    let mut bytes = std::fs::read(&snapshot).unwrap();
    bytes[at] ^= 0x20;
    std::fs::write(&snapshot, &bytes).unwrap();
    refused(dir.path(), &[name(&snapshot), "bad header", "--salvage"]);

    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    let (ready, put) = salvage_start(dir.path(), &log).await;
    assert!(
        ready.contains(&last),
        "the log's jobs are served: {ready:?}"
    );
    assert!(
        put > last,
        "id {put} handed out again (the last was {last})"
    );
    assert!(!snapshot.exists(), "set aside");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains(name(&snapshot)), "names it: {said}");
}

/// A snapshot cut short (its end and some records gone): refused, naming
/// it; with `--salvage` its records up to the cut are served, and the start
/// says that a damaged rest was skipped. It said `skipped=0`, as if nothing
/// had been lost (a reviewer's 2,500 jobs came back as 2,100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_cut_short_is_refused_then_salvaged_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    c.put_ok(0, 0, 60, b"kept").await;
    churn_until_compacted(&mut c, dir.path()).await;
    drop(c);
    stop(daemon);
    let snapshot = files_named(dir.path(), "snapshot.").pop().unwrap();
    let bytes = std::fs::read(&snapshot).unwrap();
    std::fs::write(&snapshot, &bytes[..bytes.len() - 10]).unwrap();
    refused(dir.path(), &[name(&snapshot), "--salvage"]);

    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("delayq.log");
    salvage_start(dir.path(), &log).await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("damaged rest of a snapshot") && said.contains(name(&snapshot)),
        "names the snapshot's skipped rest: {said}"
    );
    assert!(
        said.contains("damaged_rests_skipped=1"),
        "the summary counts it: {said}"
    );
}

/// One copy of the head file damaged: the start goes on with the other (a
/// crash can tear the write of a copy), and says so, since a failing disk
/// does the same and weakens the check the head is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_copy_of_the_head_is_said_and_the_other_used() {
    const N: usize = 300;
    let (dir, _) = filled(N).await;
    let head = dir.path().join("head");
    let mut bytes = std::fs::read(&head).unwrap();
    // Both copies: the start goes on with either one whole.
    for at in [30, 512 + 30] {
        let mut one = bytes.clone();
        one[at] ^= 1;
        std::fs::write(&head, &one).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("delayq.log");
        let daemon = Daemon::durable_logged(dir.path(), FILES, &log).await;
        let mut c = daemon.client().await;
        assert_eq!(ready_ids(&mut c).await.len(), N);
        drop(c);
        stop(daemon);
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(said.contains("copies is damaged"), "{said}");
        bytes = std::fs::read(&head).unwrap();
    }
}

/// Sets the first record that log file `path`'s header says it begins at,
/// and clears its records: a damaged header, and no record to say so.
fn says_it_begins_at(path: &Path, first: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[24..32].copy_from_slice(&first.to_le_bytes());
    bytes[32..].fill(0);
    std::fs::write(path, &bytes).unwrap();
}

/// The newest log file's header saying it begins at record 1, or 0, with
/// its records cleared: taken at its word, the files before it were
/// leftovers of a compaction, and were removed with every job in them,
/// though there is no snapshot. Refused, naming it, every file kept; with
/// `--salvage` it is set aside and the older files' jobs are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newest_log_file_saying_it_begins_at_the_start_is_refused() {
    const N: usize = 300;
    for first in [1, 0] {
        let (dir, last) = filled(N).await;
        let logs = log_files(dir.path());
        let newest = logs.last().unwrap().clone();
        says_it_begins_at(&newest, first);
        refused(dir.path(), &[name(&newest), "--salvage"]);
        assert_eq!(log_files(dir.path()), logs, "every log file kept");

        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("delayq.log");
        let (ready, put) = salvage_start(dir.path(), &log).await;
        assert!(
            ready.len() > N / 2 && ready.len() < N,
            "the older files' jobs: {} of {N}",
            ready.len()
        );
        assert_eq!(ready, (1..=ready.len() as u64).collect::<Vec<_>>());
        assert!(
            put > last,
            "id {put} handed out again (the last was {last})"
        );
    }
}

/// The same after a snapshot: the newest log file's header saying it
/// begins where the snapshot does made the files before it leftovers,
/// though they hold the changes made after the snapshot. Refused, naming
/// one of them; every file kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newest_log_file_saying_it_begins_at_the_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::durable(dir.path(), FILES).await;
    let mut c = daemon.client().await;
    churn_until_compacted(&mut c, dir.path()).await;
    for k in 0..200 {
        c.put_ok(0, 0, 60, &body(k)).await;
    }
    drop(c);
    stop(daemon);
    let snapshot = files_named(dir.path(), "snapshot.")
        .pop()
        .expect("a snapshot");
    let logs = log_files(dir.path());
    assert!(logs.len() >= 2, "log files after the snapshot: {logs:?}");
    let newest = logs.last().unwrap().clone();
    says_it_begins_at(&newest, snapshot_start(&snapshot));
    refused(dir.path(), &["lacks", "--salvage"]);
    assert_eq!(log_files(dir.path()), logs, "every log file kept");
}
