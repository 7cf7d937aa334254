//! Log files recycled as spares: small files, thousands of live jobs, and
//! bursts of pipelined puts, so that compaction hands old log files back as
//! spares and new records are written over old ones. Every put is taken
//! (a burst waits for the keeper to prepare room rather than being refused
//! on a disk with room), and after each SIGKILL every job is back, though
//! a recycled file keeps the remains of its old records past its end.

use std::path::Path;

use crate::common::daemon::Daemon;
use crate::log_files;

/// Jobs kept live across the bursts.
const LIVE: usize = 3000;

/// Whether a log file has bytes other than zeros after its last record:
/// the remains of a recycled file's old life. Records are followed by
/// their numbers (each the one before plus one, the first in the header),
/// not by their checksums, which is enough to find where they end.
fn remains_past_its_end(file: &Path) -> bool {
    let data = std::fs::read(file).expect("read a log file");
    let mut next = u64::from_le_bytes(data[24..32].try_into().unwrap());
    let mut at = 32;
    while at + 16 <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
        if len == 0 || seq != next || at + 8 + len > data.len() {
            break;
        }
        next += 1;
        at += 8 + len;
    }
    data[at..].iter().any(|&b| b != 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_log_files_come_back_after_sigkill() {
    let dir = tempfile::tempdir().expect("a data directory");
    let args = ["-s", "70000"];
    let mut live: Vec<u64> = Vec::new();
    // Kills that left an older log file with remains past its end.
    let mut found = 0;
    let mut rng = fastrand::Rng::new();
    for kill in 0..300 {
        if found >= 3 {
            break;
        }
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
        found += usize::from(
            logs[..logs.len() - 1]
                .iter()
                .any(|f| remains_past_its_end(f)),
        );
    }
    assert!(found >= 3, "in 300 kills only {found} left such a file");
    let daemon = Daemon::durable(dir.path(), &args).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats().await.num("current-jobs-delayed"), LIVE as u64);
}
