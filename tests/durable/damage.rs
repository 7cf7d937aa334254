//! Damage: a torn last record at every byte offset, a flipped byte and a
//! zeroed record in the middle of a log file (refused, then salvaged, also
//! in a record whose own group was written unsynced), a
//! hole that was never synced (a torn tail), ids lost from the end of the
//! log never handed out again, and a second process on one directory.

use std::path::Path;

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::{copy_dir, frames, log_files, start_or_refuse};

/// Small log files, so copies are quick.
const SMALL: &[&str] = &["-s", "131072"];

/// Puts `n` ready jobs (`job 0`, ...) and SIGKILLs the server once the last
/// is acknowledged: the last record of the newest log file is then the last
/// put. Returns the directory and that log file.
async fn jobs_then_kill(n: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), SMALL).await;
    let mut c = daemon.client().await;
    for k in 0..n {
        c.put_ok(0, 0, 60, format!("job {k}").as_bytes()).await;
    }
    daemon.kill();
    let log = log_files(dir.path()).pop().expect("a log file");
    (dir, log)
}

/// The bodies of the ready jobs of a server on `dir`, in order.
async fn bodies(dir: &Path) -> Vec<String> {
    bodies_with(dir, SMALL).await
}

/// [`bodies`], with the server started with `args`.
async fn bodies_with(dir: &Path, args: &[&str]) -> Vec<String> {
    let daemon = Daemon::durable(dir, args).await;
    let mut c: Client = daemon.client().await;
    crate::reserve_all(&mut c)
        .await
        .into_iter()
        .map(|job| String::from_utf8(job.body).unwrap())
        .collect()
}

fn expected(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("job {k}")).collect()
}

/// The last record cut at each of its byte offsets, the rest of the file as
/// a preallocated file leaves it (zeros), or as a crash may (the rest of the
/// record's bytes, but wrong, or cut off with the file): the server starts,
/// every earlier job is there, the torn one is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_record_at_every_offset_is_cut_off() {
    const N: usize = 5;
    let (dir, log) = jobs_then_kill(N).await;
    let file = std::fs::read(&log).unwrap();
    let &(start, end) = frames(&file).last().expect("records");
    assert_eq!(
        bodies(copy_dir(dir.path()).path()).await,
        expected(N),
        "intact"
    );
    let name = log.file_name().unwrap();
    let mut tried = 0;
    for cut in start..end {
        for how in ["zeros", "garbage", "truncated"] {
            let copy = copy_dir(dir.path());
            let path = copy.path().join(name);
            let mut bytes = file.clone();
            match how {
                "zeros" => bytes[cut..end].fill(0),
                "garbage" => {
                    for (i, b) in bytes[cut..end].iter_mut().enumerate() {
                        *b = b.wrapping_add(1 + i as u8);
                    }
                }
                _ => bytes.truncate(cut),
            }
            std::fs::write(&path, &bytes).unwrap();
            let got = bodies(copy.path()).await;
            assert_eq!(
                got,
                expected(N - 1),
                "last record torn at byte {} of {} ({how})",
                cut - start,
                end - start
            );
            tried += 1;
        }
    }
    eprintln!(
        "{tried} torn tails tried over a {}-byte record",
        end - start
    );
}

/// How the jobs reach the log before one of them is damaged.
#[derive(Clone, Copy)]
enum Jobs {
    /// Six, put one at a time, each synced before the next; SIGKILL.
    OneByOne,
    /// Ten: jobs 0 to 5 in one write, so that their records go to the
    /// disk in one group, stamped alike with the sync before it, then jobs
    /// 6 to 9 one at a time; SIGKILL.
    Grouped,
    /// Six in one write and nothing after them, so no later record's stamp
    /// says they were synced; then SIGTERM, or SIGKILL once the server
    /// has been idle a moment.
    LastGroup { kill: bool },
}

impl Jobs {
    /// Puts the jobs and stops the server; returns how many jobs, the
    /// directory and the newest log file.
    ///
    /// Where jobs 2 and 3 must share a group, what else the machine does
    /// can prevent it (the writer may take the first puts before the rest
    /// have come): then it is done again, five times at most.
    async fn put(self) -> (usize, tempfile::TempDir, std::path::PathBuf) {
        if let Jobs::OneByOne = self {
            let (dir, log) = jobs_then_kill(6).await;
            return (6, dir, log);
        }
        for _ in 0..5 {
            let (n, dir, log) = self.put_once().await;
            let file = std::fs::read(&log).unwrap();
            let (_, end) = record_of(&file, "job 2");
            // The record after job 2's was written before job 2's was
            // synced when its stamp (its seq minus the gap at byte 16) is
            // below job 2's seq.
            let gap = u32::from_le_bytes(file[end + 16..end + 20].try_into().unwrap());
            if gap > 1 {
                return (n, dir, log);
            }
        }
        panic!("jobs 2 and 3 were not written in one group, five times over");
    }

    async fn put_once(self) -> (usize, tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::durable(dir.path(), SMALL).await;
        let mut c = daemon.client().await;
        let group: String = (0..6)
            .map(|k| format!("put 0 0 60 5\r\njob {k}\r\n"))
            .collect();
        c.send(group.as_bytes()).await;
        for _ in 0..6 {
            let reply = c.line().await;
            assert!(reply.starts_with("INSERTED "), "{reply}");
        }
        let n = match self {
            Jobs::LastGroup { kill: false } => {
                daemon.signal(libc::SIGTERM);
                assert!(daemon.wait_exit().success());
                6
            }
            Jobs::LastGroup { kill: true } => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                daemon.kill();
                6
            }
            _ => {
                for k in 6..10 {
                    c.put_ok(0, 0, 60, format!("job {k}").as_bytes()).await;
                }
                daemon.kill();
                10
            }
        };
        let log = log_files(dir.path()).pop().expect("a log file");
        (n, dir, log)
    }
}

/// Damages the record of job 2 with `damage` (given the file and the
/// record's bounds), then checks that delayq refuses to start, naming
/// the file and the record's offset, that refusing changed nothing (it
/// refuses again), and that with `--salvage` it serves every job but job 2.
async fn refused_then_salvaged(jobs: Jobs, damage: impl FnOnce(&mut [u8], usize, usize)) {
    let (n, dir, log) = jobs.put().await;
    let mut file = std::fs::read(&log).unwrap();
    // Past `OneByOne`, what makes the case: the record after the damaged
    // one was written before it was synced, so only the later groups, or
    // the head file's synced mark, tell that the damaged record had been
    // synced.
    let (start, end) = record_of(&file, "job 2");
    damage(&mut file, start, end);
    std::fs::write(&log, &file).unwrap();

    let (status, stderr) = start_or_refuse(dir.path(), SMALL).expect("a refusal, not a start");
    assert!(!status.success(), "exit status {status}");
    let name = log.file_name().unwrap().to_str().unwrap();
    assert!(stderr.contains(name), "names the file: {stderr}");
    assert!(
        stderr.contains(&start.to_string()),
        "names offset {start}: {stderr}"
    );
    assert!(start_or_refuse(dir.path(), SMALL).is_some());

    let mut want = expected(n);
    want.remove(2);
    let daemon = Daemon::durable(dir.path(), &["-s", "131072", "--salvage"]).await;
    let mut c: Client = daemon.client().await;
    let got: Vec<String> = crate::reserve_all(&mut c)
        .await
        .into_iter()
        .map(|job| String::from_utf8(job.body).unwrap())
        .collect();
    assert_eq!(got, want, "every job but the damaged one");
    // The salvaged start compacts the damaged file away, so the next
    // start needs no --salvage.
    let limit = std::time::Instant::now() + crate::common::REPLY_TIMEOUT;
    while log.exists() {
        assert!(
            std::time::Instant::now() < limit,
            "the damaged file is still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop((c, daemon));
    assert_eq!(
        bodies(dir.path()).await,
        want,
        "a plain start after the salvage"
    );
}

/// The record of a job, found by its body (the header-only records before
/// the puts vary).
fn record_of(file: &[u8], body: &str) -> (usize, usize) {
    *frames(file)
        .iter()
        .find(|(s, e)| {
            file[*s..*e]
                .windows(body.len())
                .any(|w| w == body.as_bytes())
        })
        .unwrap_or_else(|| panic!("the record of {body}"))
}

/// A flipped byte in the middle of a log file (in a record with others
/// after it) is damage, not a torn tail: delayq refuses to start and names
/// the file and offset; with `--salvage` it starts without that record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_refused_then_salvaged() {
    refused_then_salvaged(Jobs::OneByOne, |file, start, end| {
        file[(start + end) / 2] ^= 0x40
    })
    .await;
}

/// The same in a record written in one group with those after it: the
/// records of its own group carry the stamp of the sync before them, but
/// those of later groups say it was synced, so it is damage, not a torn
/// tail that would drop (and clear from the disk) every job after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_group_synced_since_is_refused_then_salvaged() {
    refused_then_salvaged(Jobs::Grouped, |file, start, end| {
        file[(start + end) / 2] ^= 0x40
    })
    .await;
}

/// A whole record turned to zeros in the middle of the newest log file
/// (a block that never reached the disk, or was zeroed since) reads like
/// the end of the data, but synced records follow it: damage, refused and
/// named, not a silent end that drops every job after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_record_with_synced_records_after_it_is_refused_then_salvaged() {
    refused_then_salvaged(Jobs::OneByOne, |file, start, end| file[start..end].fill(0)).await;
}

/// The same, the record written in one group with those after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_record_in_a_group_synced_since_is_refused_then_salvaged() {
    refused_then_salvaged(Jobs::Grouped, |file, start, end| file[start..end].fill(0)).await;
}

/// A flipped byte in the last group written before a clean stop: no later
/// record's stamp says that group was synced, but the head file's synced
/// mark does, so it is damage, not a torn tail (which would drop, and
/// clear from the disk, every job after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_last_group_before_a_stop_is_refused_then_salvaged() {
    let flip = |file: &mut [u8], start: usize, end: usize| file[(start + end) / 2] ^= 0x40;
    refused_then_salvaged(Jobs::LastGroup { kill: false }, flip).await;
}

/// The same when the server was killed, idle, after that group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_record_in_the_last_group_before_a_kill_is_refused_then_salvaged() {
    let zero = |file: &mut [u8], start: usize, end: usize| file[start..end].fill(0);
    refused_then_salvaged(Jobs::LastGroup { kill: true }, zero).await;
}

/// The same hole where nothing after it was synced (`-F`) is a torn tail:
/// cut off, and the bytes after it cleared, so that records written over
/// the hole later do not join up with the old ones: after a second crash,
/// the jobs cut off do not come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsynced_hole_is_a_torn_tail_whose_rest_never_comes_back() {
    const NEVER: &[&str] = &["-s", "131072", "-F"];
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), NEVER).await;
    let mut c = daemon.client().await;
    for k in 0..5 {
        c.put_ok(0, 0, 60, format!("job {k}").as_bytes()).await;
    }
    daemon.kill();
    let log = log_files(dir.path()).pop().expect("a log file");
    let mut file = std::fs::read(&log).unwrap();
    let (start, end) = record_of(&file, "job 2");
    file[start..end].fill(0);
    std::fs::write(&log, &file).unwrap();

    // The hole and all after it go; the same number of bytes is written
    // over it next ("job 9" is as long as "job 2"), ending where the old
    // "job 3" begins.
    let mut daemon = Daemon::durable(dir.path(), NEVER).await;
    let mut c = daemon.client().await;
    c.put_ok(0, 0, 60, b"job 9").await;
    daemon.kill();
    assert_eq!(
        bodies_with(dir.path(), NEVER).await,
        ["job 0", "job 1", "job 9"],
        "jobs cut off as a torn tail came back after the next crash"
    );
}

/// The ready jobs' count and the id the next put takes, on a server
/// started on `dir`, which is then killed.
async fn ready_and_next_id(dir: &Path) -> (u64, u64) {
    let mut daemon = Daemon::durable(dir, SMALL).await;
    let mut c = daemon.client().await;
    let ready = c.stats().await.num("current-jobs-ready");
    let id = c.put_ok(0, 0, 60, b"new").await;
    daemon.kill();
    (ready, id)
}

/// Changes the newest log file of `dir` with `change`, given its bytes and
/// the bounds of its last record.
fn change_last_record(dir: &Path, change: impl FnOnce(&mut Vec<u8>, usize, usize)) {
    let log = log_files(dir).pop().expect("a log file");
    let mut bytes = std::fs::read(&log).unwrap();
    let &(start, end) = frames(&bytes).last().expect("records");
    change(&mut bytes, start, end);
    std::fs::write(&log, &bytes).unwrap();
}

/// Acknowledged puts lost from the end of the log (cut off or zeroed after
/// a SIGKILL, as a checker or a failing disk may; under -f a power cut
/// does the same): their jobs are gone, but their ids, which clients may
/// hold, are never handed out again, nor that of a put lost after a clean
/// stop. After a clean stop the ids go on from the last one, and the start
/// clears that, so a crash after it is not taken for a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_lost_from_the_end_of_the_log_are_not_handed_out_again() {
    const N: usize = 10;
    let (dir, log) = jobs_then_kill(N).await;
    let file = std::fs::read(&log).unwrap();
    let records = frames(&file);
    assert_eq!(records.len(), N, "one record a put");
    let cut = records[N - 3].0;
    let name = log.file_name().unwrap();
    for how in ["truncated", "zeros", "truncated, the head file gone"] {
        let copy = copy_dir(dir.path());
        let mut bytes = file.clone();
        match how {
            "zeros" => bytes[cut..].fill(0),
            _ => bytes.truncate(cut),
        }
        if how.ends_with("gone") {
            std::fs::remove_file(copy.path().join("head")).unwrap();
        }
        std::fs::write(copy.path().join(name), &bytes).unwrap();
        let (ready, id) = ready_and_next_id(copy.path()).await;
        assert_eq!(ready, N as u64 - 3, "{how}");
        assert!(
            id > N as u64,
            "{how}: a lost job's id {id} was handed out again"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), SMALL).await;
    let mut c = daemon.client().await;
    for k in 0..3 {
        assert_eq!(
            c.put_ok(0, 0, 60, format!("job {k}").as_bytes()).await,
            k + 1
        );
    }
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit().success());
    // A tail torn, cut or zeroed after the clean stop is cut off all the
    // same, and it may have held a put: its id is not handed out again.
    for how in ["torn", "truncated", "zeros"] {
        let copy = copy_dir(dir.path());
        change_last_record(copy.path(), |bytes, start, end| match how {
            "torn" => bytes[end - 1] ^= 0xff,
            "truncated" => bytes.truncate(start),
            _ => bytes[start..].fill(0),
        });
        let (ready, id) = ready_and_next_id(copy.path()).await;
        assert_eq!(ready, 2, "{how}");
        assert!(id > 3, "{how}: the lost put's id {id} was handed out again");
    }
    let (ready, id) = ready_and_next_id(dir.path()).await;
    assert_eq!(
        (ready, id),
        (3, 4),
        "after a clean stop, ids go on from the last"
    );
    change_last_record(dir.path(), |bytes, start, _| bytes[start..].fill(0));
    let (ready, again) = ready_and_next_id(dir.path()).await;
    assert_eq!(ready, 3);
    assert!(
        again > id,
        "the killed run was taken for a clean stop: id {again} again"
    );
}

/// A server id an import kept, far past the sequence, is not handed out
/// again when the import's record is lost from the end of the log: the
/// head file says it before the record is synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_an_import_kept_is_not_handed_out_again_when_its_record_is_lost() {
    const KEPT: u64 = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::durable(dir.path(), SMALL).await;
    let mut c = daemon.client().await;
    for k in 0..3 {
        c.put_ok(0, 0, 60, format!("job {k}").as_bytes()).await;
    }
    let line = format!(
        r#"{{"id":{KEPT},"tube":"default","state":"ready","pri":1,"created":"2026-01-01T00:00:00Z","ttr-ms":60000,"body":"imported"}}"#
    );
    let reply = c.cmd(&format!("import {}\r\n{line}", line.len())).await;
    assert_eq!(reply, format!("IMPORTED {KEPT}"));
    daemon.kill();
    change_last_record(dir.path(), |bytes, start, end| {
        assert!(
            bytes[start..end].windows(8).any(|w| w == b"imported"),
            "the import is the last record"
        );
        bytes.truncate(start);
    });
    let (ready, id) = ready_and_next_id(dir.path()).await;
    assert_eq!(ready, 3);
    assert!(
        id > KEPT,
        "the imported job's id {KEPT} may come again: {id}"
    );
}

/// One process per directory: a second exits at once with a clear error,
/// and the first serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_one_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Daemon::durable(dir.path(), &[]).await;
    let (status, stderr) = start_or_refuse(dir.path(), &[]).expect("the second must not start");
    assert!(!status.success());
    assert!(
        stderr.contains("in use by another delayq process"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "terminal colours in a log that is not a terminal: {stderr:?}"
    );
    let mut c = first.client().await;
    c.put_ok(0, 0, 60, b"still here").await;
}

/// A data directory that is a file: the start is refused, saying so.
#[test]
fn a_data_directory_that_is_a_file_is_refused_by_name() {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("jobs");
    std::fs::write(&file, b"not a directory").unwrap();
    let (status, stderr) = start_or_refuse(&file, &[]).expect("a refusal, not a start");
    assert!(!status.success());
    assert!(stderr.contains("is a file, not a directory"), "{stderr}");
}
