//! The durable embedded engine on real processes and real files: restarts
//! after SIGKILL (and a second one right after the recovery), torn tails at
//! every byte of the last record, a flipped byte, the directory's lock, a
//! disk that really fills (a small tmpfs), kills while compaction runs, and
//! clients holding every descriptor they may.
//!
//! The ledger tests under load (SIGKILL ten times in a row) are in
//! `tests/faults`, shared with the Redis engine.

#[path = "../common/mod.rs"]
mod common;

mod bulk;
mod damage;
mod descriptors;
mod disk;
mod failure;
mod missing;
mod order;
mod recycle;
mod restart;
mod snapshot;
mod upgrade;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::daemon::{BIN, wait_exit};

/// A file system mounted for one test, or `None` (the reason printed)
/// where this user may not mount one. Mounting needs CAP_SYS_ADMIN: as
/// root (CI runs as root) a failure to mount is an error, not a skip.
pub fn mounted_or_skipped<T>(mounted: Result<T, String>, what: &str) -> Option<T> {
    match mounted {
        Ok(fs) => Some(fs),
        Err(why) => {
            // SAFETY: geteuid takes nothing and cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            assert!(!root, "root could not mount {what}: {why}");
            eprintln!("skipped: cannot mount {what} without root: {why}");
            None
        }
    }
}

/// Every ready job of the server `c` is connected to, reserved one by one
/// until none is left.
pub async fn reserve_all(c: &mut common::Client) -> Vec<common::Job> {
    let mut out = Vec::new();
    loop {
        let reply = c.cmd("reserve-with-timeout 0").await;
        if reply == "TIMED_OUT" {
            return out;
        }
        out.push(c.job_after("RESERVED", &reply).await);
    }
}

/// The log files of a data directory, oldest first.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    files_named(dir, "log.")
}

/// The files of a data directory whose names begin with `prefix`, in name
/// order (for log files and snapshots, oldest first).
pub fn files_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the data directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    found.sort();
    found
}

/// The frames of a log file as `(start, end)` byte ranges, read the way the
/// format says (`src/store/log/record.rs`): after a 32-byte header, each
/// frame is a little-endian length of what follows its checksum, the
/// checksum, then that many bytes; a length of zero ends the data.
pub fn frames(file: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 32;
    while at + 8 <= file.len() {
        let len = u32::from_le_bytes(file[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > file.len() {
            break;
        }
        out.push((at, at + 8 + len));
        at += 8 + len;
    }
    out
}

/// Copies every file of `from` into a new scratch directory.
pub fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("a scratch directory");
    for entry in std::fs::read_dir(from).expect("read the data directory") {
        let path = entry.expect("a directory entry").path();
        std::fs::copy(&path, to.path().join(path.file_name().unwrap())).expect("copy a file");
    }
    to
}

/// Runs the binary on `dir` with `args` until it either exits (its status
/// and standard error) or says it listens (then it is killed and `None`).
/// Its own log says which: a connection to its port could reach another
/// test's server that took the port meanwhile.
pub fn start_or_refuse(dir: &Path, args: &[&str]) -> Option<(std::process::ExitStatus, String)> {
    use std::io::BufRead;
    // Port 0: nothing connects, and a port picked free beforehand may be
    // another test's by the time this server listens.
    let mut child = Command::new(BIN)
        .args(["-l", "127.0.0.1", "-p", "0", "-b"])
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn delayq");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut err = String::new();
    let limit = std::time::Instant::now() + common::REPLY_TIMEOUT;
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(line) if line.contains("delayq listening") => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(line) => {
                err.push_str(&line);
                err.push('\n');
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = wait_exit(&mut child, common::REPLY_TIMEOUT);
                return Some((status, err));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                assert!(
                    std::time::Instant::now() < limit,
                    "neither started nor refused:\n{err}"
                );
            }
        }
    }
}
