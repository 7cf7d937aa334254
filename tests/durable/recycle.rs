//! Log files recycled as spares: small files, thousands of live jobs, and
//! bursts of pipelined puts, so that compaction hands old log files back as
//! spares and new records are written over old ones. Every put is taken
//! (a burst waits for the keeper to prepare room rather than being refused
//! on a disk with room), and after each SIGKILL every job is back.
//!
//! Whether compaction recycles a file or the keeper prepares a fresh one
//! first depends on timing, so the kills alone cannot promise that a file
//! with an old life's remains past its end was ever read back. The end of
//! the test therefore makes that situation itself, in the two shapes it
//! takes: remains that begin exactly where an old record began (a whole
//! record with an older number) and remains that begin in the middle of one.

use std::collections::VecDeque;
use std::path::Path;

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::{frames, log_files};

/// Jobs kept live across the bursts.
const LIVE: usize = 3000;

/// Whether a log file has bytes other than zeros after its last record:
/// the remains of a recycled file's old life.
fn remains_past_its_end(file: &Path) -> bool {
    let data = std::fs::read(file).expect("read a log file");
    let end = frames(&data).last().map_or(32, |&(_, end)| end);
    data[end..].iter().any(|&b| b != 0)
}

/// Writes over the unused end of `file` (zeros after its last record) what
/// a recycled file keeps there: the bytes of its own records from `from`
/// on, as its old life wrote them at those offsets. Returns how many bytes
/// were written.
fn leave_remains(file: &Path, from: usize) -> usize {
    let mut data = std::fs::read(file).expect("read a log file");
    let end = frames(&data).last().map_or(32, |&(_, end)| end);
    let n = (data.len() - end).min(end - from);
    data.copy_within(from..from + n, end);
    std::fs::write(file, &data).expect("write a log file");
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_log_files_come_back_after_sigkill() {
    let dir = tempfile::tempdir().expect("a data directory");
    let args = ["-s", "70000"];
    let mut live: Vec<u64> = Vec::new();
    let mut rng = fastrand::Rng::new();
    let mut recycled = 0;
    for kill in 0..40 {
        let mut daemon = Daemon::durable(dir.path(), &args).await;
        let mut c = daemon.client().await;
        assert_eq!(
            c.stats().await.num("current-jobs-delayed"),
            live.len() as u64,
            "after kill {kill}"
        );
        for _ in 0..rng.usize(1..40) {
            let body = "x".repeat(rng.usize(50..900));
            let put = format!("put 0 3600 60 {}\r\n{body}\r\n", body.len());
            c.send(put.repeat(50).as_bytes()).await;
            for _ in 0..50 {
                let reply = c.line().await;
                let id = reply
                    .strip_prefix("INSERTED ")
                    .unwrap_or_else(|| panic!("a put on a disk with room got {reply:?}"));
                live.push(id.parse().expect("an id"));
            }
            let gone: Vec<u64> = live.drain(..live.len().saturating_sub(LIVE)).collect();
            let deletes: String = gone.iter().map(|id| format!("delete {id}\r\n")).collect();
            c.send(deletes.as_bytes()).await;
            for _ in &gone {
                assert_eq!(c.line().await, "DELETED");
            }
        }
        daemon.kill();
        let logs = log_files(dir.path());
        recycled += usize::from(
            logs[..logs.len() - 1]
                .iter()
                .any(|f| remains_past_its_end(f)),
        );
    }
    eprintln!("{recycled} of 40 kills left a recycled file with remains past its end");

    // The two shapes of remains, each in an older log file with room
    // after its last record (the newest file's end is a torn tail, which
    // other tests cover). Compaction has left few log files behind the
    // bursts, so a fresh directory gets its own: puts one at a time, with
    // bodies of many sizes, so the files end with gaps of many sizes.
    drop(dir);
    let dir = tempfile::tempdir().expect("a data directory");
    let mut daemon = Daemon::durable(dir.path(), &args).await;
    let mut c = daemon.client().await;
    let mut live = Vec::new();
    for i in 0..800 {
        live.push(
            c.put_ok(0, 3600, 60, &vec![b'x'; 200 + i * 137 % 800])
                .await,
        );
    }
    daemon.kill();
    let logs = log_files(dir.path());
    let room = |f: &Path| {
        let data = std::fs::read(f).expect("read a log file");
        let end = frames(&data).last().map_or(32, |&(_, end)| end);
        data.len() - end
    };
    let mut roomy: Vec<_> = logs[..logs.len() - 1]
        .iter()
        .filter(|f| !remains_past_its_end(f))
        .collect();
    roomy.sort_by_key(|f| room(f));
    assert!(
        roomy.len() >= 2 && room(roomy[roomy.len() - 2]) >= 16,
        "fewer than two older log files with room after their last record: {logs:?}"
    );
    let whole = roomy.pop().unwrap();
    let data = std::fs::read(whole).expect("read a log file");
    let second = frames(&data)[1].0;
    assert!(leave_remains(whole, second) > 0);
    let cut = roomy.pop().unwrap();
    assert!(leave_remains(cut, 32 + 5) > 0);

    for round in 0..2 {
        let mut daemon = Daemon::durable(dir.path(), &args).await;
        let mut c = daemon.client().await;
        assert_eq!(
            c.stats().await.num("current-jobs-delayed"),
            live.len() as u64,
            "round {round} after the remains were left"
        );
        for id in live.iter().step_by(97) {
            let job = c.found(&format!("peek {id}")).await;
            assert_eq!(job.id, id.to_string());
            assert!(job.body.iter().all(|&b| b == b'x'), "job {id}'s body");
        }
        daemon.kill();
    }
}

/// The spares in `dir` made anew: a fresh spare is zeros to its end, a
/// recycled one begins with its old life's log header.
fn fresh_spares(dir: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    use std::io::Read;
    crate::files_named(dir, "spare.")
        .into_iter()
        .filter(|f| {
            let mut head = [0u8; 8];
            std::fs::File::open(f).is_ok_and(|mut file| {
                file.read_exact(&mut head).is_ok() && head.iter().all(|&b| b == 0)
            })
        })
        .collect()
}

/// `n` put/delete cycles, pipelined: `n` puts of `body`, whose ids join
/// `live`, then deletes of the `n` oldest jobs in it.
async fn cycles(c: &mut Client, live: &mut VecDeque<u64>, body: &str, n: usize) {
    let put = format!("put 0 3600 60 {}\r\n{body}\r\n", body.len());
    c.send(put.repeat(n).as_bytes()).await;
    for _ in 0..n {
        let reply = c.line().await;
        let id = reply
            .strip_prefix("INSERTED ")
            .unwrap_or_else(|| panic!("a put got {reply:?}"));
        live.push_back(id.parse().expect("an id"));
    }
    let deletes: String = live
        .drain(..n)
        .map(|id| format!("delete {id}\r\n"))
        .collect();
    c.send(deletes.as_bytes()).await;
    for _ in 0..n {
        assert_eq!(c.line().await, "DELETED");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_queue_s_log_files_go_round_without_new_ones() {
    // Every new file is zero-filled and synced, and every removed one is,
    // on a file system mounted with `discard`, a discard sent to the disk:
    // either holds up the log's syncs behind it. With a few live jobs and
    // steady put/delete cycles, each begin's snapshot frees the file just
    // ended, which comes back as a spare: once warm, no spare is made anew.
    let dir = tempfile::tempdir().expect("a data directory");
    let mut daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    let mut live = VecDeque::new();
    for _ in 0..20 {
        live.push_back(c.put_ok(0, 3600, 60, &[b'y'; 100]).await);
    }
    // About 340 cycles fill a file: 50 at a time, a begin every seven
    // rounds or so.
    let mut fresh_before = std::collections::BTreeSet::new();
    let mut made = std::collections::BTreeSet::new();
    let first_file = log_files(dir.path()).last().cloned();
    for round in 0..300 {
        cycles(&mut c, &mut live, &"y".repeat(100), 50).await;
        // Warm after a hundred rounds (about fifteen begins): a fresh
        // spare made before then may still be waiting for its turn.
        let fresh = fresh_spares(dir.path());
        if round < 100 {
            fresh_before.extend(fresh);
        } else {
            made.extend(fresh.difference(&fresh_before).cloned());
        }
    }
    let begun = log_files(dir.path()).last().cloned();
    assert_ne!(first_file, begun, "no log file began");
    assert!(
        made.is_empty(),
        "spares made anew once warm, over rounds that began about thirty log \
         files: {made:?}"
    );
    assert_eq!(c.stats().await.num("current-jobs-delayed"), 20);
    // Every log file and spare here has had an earlier life: a kill
    // leaves the live jobs, and nothing of those lives, to a restart.
    daemon.kill();
    let daemon = Daemon::durable(dir.path(), &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats().await.num("current-jobs-delayed"), 20);
    for id in &live {
        let job = c.found(&format!("peek {id}")).await;
        assert_eq!(job.body, b"y".repeat(100), "job {id}'s body");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_for_a_snapshot_is_left_alone_while_the_disk_has_room() {
    // The room kept for a snapshot on a full disk is used only then: a
    // snapshot written into it is cut to its own length (on a file system
    // mounted with `discard`, a discard of the rest) and a new room is
    // zero-filled after it, about a megabyte of work for the disk at every
    // snapshot, in front of the log's syncs.
    let dir = tempfile::tempdir().expect("a data directory");
    let daemon = Daemon::durable(dir.path(), &["-s", "1048576"]).await;
    let mut c = daemon.client().await;
    let body = "y".repeat(1000);
    let mut live = VecDeque::new();
    for _ in 0..20 {
        live.push_back(c.put_ok(0, 3600, 60, body.as_bytes()).await);
    }
    let room = dir.path().join("snapshot-room");
    let room_made = || std::fs::metadata(&room).and_then(|m| m.modified()).ok();
    let snapshots = || crate::files_named(dir.path(), "snapshot.0");
    let mut room_when_warm = None;
    let mut seen_snapshots = std::collections::BTreeSet::new();
    // About a thousand cycles fill a file: ten rounds of 100.
    for round in 0..120 {
        cycles(&mut c, &mut live, &body, 100).await;
        if round < 30 {
            room_when_warm = room_made();
        } else {
            seen_snapshots.extend(snapshots());
        }
    }
    assert!(
        seen_snapshots.len() >= 4,
        "too few snapshots taken to tell: {seen_snapshots:?}"
    );
    assert!(room_when_warm.is_some(), "no room kept for a snapshot");
    assert_eq!(room_made(), room_when_warm, "the room was made again");
    assert_eq!(c.stats().await.num("current-jobs-delayed"), 20);
}
