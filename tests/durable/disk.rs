//! The disk: a file system that really fills (a small tmpfs), and kills at
//! random moments while compaction runs, with the directory's size after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::Client;
use crate::common::daemon::Daemon;
use crate::mounted_or_skipped;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it), or says why
    /// it cannot.
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().to_path_buf();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Tmpfs { _dir: dir, path })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Bytes the files of `dir` take on disk (allocated blocks, as `du`).
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().blocks() * 512)
        .sum()
}

/// A full disk: puts answer `OUT_OF_MEMORY` and change nothing; deletes,
/// reserves and reads go on on the same connection; once space is freed,
/// puts are taken again without a restart; after a SIGKILL every
/// acknowledged job is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_puts_and_recovers_by_itself() {
    let Some(fs) = mounted_or_skipped(Tmpfs::mount("3m"), "a tmpfs") else {
        return;
    };
    // Room to free later.
    let filler = fs.path.join("filler");
    std::fs::write(&filler, vec![1u8; 1 << 20]).unwrap();
    let data = fs.path.join("data");
    // Outside the tmpfs, which is to be full.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut daemon = Daemon::durable_logged(&data, &["-s", "262144"], log.path()).await;
    let mut c = daemon.client().await;
    let body = vec![b'x'; 4000];
    let mut acked = Vec::new();
    let refused = loop {
        let reply = c.put(0, 0, 60, &body).await;
        match reply.strip_prefix("INSERTED ") {
            Some(id) => acked.push(id.to_string()),
            None => break reply,
        }
        assert!(
            acked.len() < 2000,
            "a 3 MiB disk took {} jobs of 4 KB",
            acked.len()
        );
    };
    assert_eq!(refused, "OUT_OF_MEMORY");
    assert!(
        acked.len() > 10,
        "only {} puts before the disk filled",
        acked.len()
    );
    // Still refused, and nothing was stored for the refusals; each refusal
    // asks for room, but the disk is tried (and the trouble told) once a
    // second, not at every change.
    let said = |what: &str| {
        std::fs::read_to_string(log.path())
            .unwrap()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    };
    let (prepare, compact) = ("cannot prepare the next log file", "compaction failed");
    let before = (said(prepare), said(compact));
    let refusing = Instant::now();
    let mut refusals = 0;
    while refusing.elapsed() < Duration::from_secs(2) {
        assert_eq!(c.put(0, 0, 60, &body).await, "OUT_OF_MEMORY");
        refusals += 1;
    }
    let after = (said(prepare), said(compact));
    assert!(
        after.0 - before.0 <= 3 && after.1 - before.1 <= 3,
        "in 2 s of {refusals} refused puts the log said {:?} times that it cannot \
         prepare a file, and {:?} that compaction failed",
        after.0 - before.0,
        after.1 - before.1
    );
    let stats = c.stats().await;
    assert_eq!(stats.num("current-jobs-ready"), acked.len() as u64);
    // Everything else goes on, on the same connection.
    let first = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(c.cmd(&format!("delete {}", first.id)).await, "DELETED");
    for id in acked.drain(..5).skip(1) {
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
    c.found(&format!("peek {}", acked[0])).await;
    // Space back: puts are taken again, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let start = Instant::now();
    let back = loop {
        let reply = c.put(0, 0, 60, &body).await;
        if let Some(id) = reply.strip_prefix("INSERTED ") {
            break id.to_string();
        }
        assert_eq!(reply, "OUT_OF_MEMORY");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "puts still refused 10 s after space came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    acked.push(back);
    eprintln!(
        "disk full after {} jobs; puts taken again {:?} after space came back",
        acked.len(),
        start.elapsed()
    );
    daemon.kill();
    let daemon = Daemon::durable(&data, &["-s", "262144"]).await;
    let mut c = daemon.client().await;
    for id in &acked {
        assert_eq!(c.stats_job(id).await.get("state"), "ready", "job {id}");
    }
    assert_eq!(
        c.stats().await.num("current-jobs-ready"),
        acked.len() as u64
    );
}

/// Dead letters made in bulk while the disk is full (filled by another
/// program after their jobs were reserved) leave the room set aside for
/// deletes alone: every delete succeeds, the log goes on, and puts come
/// back once there is space. A reviewer's 6,000 jobs on their last try,
/// their worker gone, took that room: 2,411 deletes answered
/// `INTERNAL_ERROR`, and the log failed for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_made_in_bulk_on_a_full_disk_leave_the_deletes_their_room() {
    const JOBS: usize = 6000;
    let Some(fs) = mounted_or_skipped(Tmpfs::mount("3m"), "a tmpfs") else {
        return;
    };
    let data = fs.path.join("data");
    let daemon = Daemon::durable(&data, &["-s", "65536"]).await;
    let mut c = daemon.client().await;
    crate::bulk::put_n(&mut c, JOBS, 600, "tries=1").await;
    let worker = crate::bulk::reserve_n(&daemon, JOBS).await;
    // Another program fills the disk.
    let filler = fs.path.join("filler");
    {
        use std::io::Write;
        let mut out = std::fs::File::create(&filler).unwrap();
        while out.write_all(&[7u8; 4096]).is_ok() {}
    }
    drop(worker);
    crate::bulk::until_counted(&mut c, "buried", JOBS as u64).await;
    let ids: Vec<String> = (1..=JOBS).map(|id| id.to_string()).collect();
    for chunk in ids.chunks(500) {
        let deletes: String = chunk.iter().map(|id| format!("delete {id}\r\n")).collect();
        c.send(deletes.as_bytes()).await;
        for id in chunk {
            assert_eq!(c.line().await, "DELETED", "delete {id}");
        }
    }
    std::fs::remove_file(&filler).unwrap();
    let start = Instant::now();
    loop {
        let reply = c.put(0, 0, 60, b"after").await;
        if reply.starts_with("INSERTED ") {
            break;
        }
        assert_eq!(reply, "OUT_OF_MEMORY", "the log failed");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "puts still refused 10 s after space came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A disk that delayq filled by itself, with nothing else on it: once its
/// jobs are deleted, the compaction that frees the dead records' room can
/// run (it writes into the room kept for it), and puts are taken again
/// with no restart and no file removed by hand. Before, the snapshot found
/// no room, the old files stayed, and every put was refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_the_log_filled_recovers_once_its_jobs_are_deleted() {
    let Some(fs) = mounted_or_skipped(Tmpfs::mount("3m"), "a tmpfs") else {
        return;
    };
    let data = fs.path.join("data");
    let daemon = Daemon::durable(&data, &["-s", "262144"]).await;
    let mut c = daemon.client().await;
    let body = vec![b'x'; 4000];
    let mut acked = Vec::new();
    while let Some(id) = c.put(0, 0, 60, &body).await.strip_prefix("INSERTED ") {
        acked.push(id.to_string());
        assert!(
            acked.len() < 2000,
            "a 3 MiB disk took {} jobs of 4 KB",
            acked.len()
        );
    }
    assert!(
        acked.len() > 10,
        "only {} puts before the disk filled",
        acked.len()
    );
    assert_eq!(c.put(0, 0, 60, &body).await, "OUT_OF_MEMORY");
    for id in &acked {
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
    // Half as many again must fit (the dead records' room came back),
    // within a few seconds (compaction runs once a second while the disk
    // is short).
    let start = Instant::now();
    let mut again = 0;
    while again * 2 < acked.len() {
        let reply = c.put(0, 0, 60, &body).await;
        if reply.starts_with("INSERTED ") {
            again += 1;
            continue;
        }
        assert_eq!(reply, "OUT_OF_MEMORY");
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{} jobs filled the disk; 15 s after they were deleted only {again} more \
             were taken; the directory: {:?}",
            acked.len(),
            std::fs::read_dir(&data)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{} jobs filled the disk; {again} more taken within {:?} after they were deleted",
        acked.len(),
        start.elapsed()
    );
}

/// Put/delete cycles over a set of live jobs, with small log files so that
/// compaction runs again and again, and SIGKILL at random moments: after
/// every restart the live jobs are exactly there; at the end the directory
/// holds a few files, not the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_during_compaction_lose_nothing_and_the_directory_stays_small() {
    const FILE: u64 = 65536;
    let flags = ["-s", "65536", "-z", "4096"];
    let dir = tempfile::tempdir().unwrap();
    let rounds = crate::common::scale(8, 40);
    let mut live: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut snapshots_seen = 0;
    let mut cycles = 0;
    for round in 0..rounds {
        let mut daemon = Daemon::durable(dir.path(), &flags).await;
        let mut c: Client = daemon.client().await;
        // Everything live is there, byte for byte, and nothing else.
        assert_eq!(
            c.stats().await.num("current-jobs-ready"),
            live.len() as u64,
            "round {round}: live jobs"
        );
        for (id, body) in &live {
            assert_eq!(&c.found(&format!("peek {id}")).await.body, body, "job {id}");
        }
        // Cycles until a random moment, then SIGKILL without warning.
        let until = Instant::now() + Duration::from_millis(rng.u64(200..900));
        while Instant::now() < until {
            let body = format!("{cycles:08} {}", "y".repeat(rng.usize(50..300))).into_bytes();
            let id = c.put_ok(0, 0, 60, &body).await.to_string();
            live.insert(id, body);
            cycles += 1;
            if live.len() > 100 {
                let victim = live.keys().nth(rng.usize(..live.len())).unwrap().clone();
                assert_eq!(c.cmd(&format!("delete {victim}")).await, "DELETED");
                live.remove(&victim);
            }
        }
        snapshots_seen += std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("snapshot."))
            })
            .count();
        daemon.kill();
    }
    assert!(
        snapshots_seen > 0,
        "compaction never ran in {cycles} cycles"
    );
    let size = allocated(dir.path());
    eprintln!(
        "{rounds} kills over {cycles} put/delete cycles, {} live: directory {size} bytes",
        live.len()
    );
    // The live jobs (100 of at most 330 bytes), the file being written,
    // spares, a snapshot and the garbage compaction allows: a few files.
    assert!(size <= 8 * FILE, "directory of {size} bytes");
}

/// Under a file-size limit (`ulimit -f`) smaller than a log file, the
/// first log file cannot be made: the start fails and says why, where the
/// kernel's SIGXFSZ would have killed the process without a word.
#[test]
fn a_file_size_limit_is_reported_not_a_silent_death() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let dir = tempfile::tempdir().expect("a scratch directory");
    let mut command = Command::new(crate::common::daemon::BIN);
    command
        .args(["-l", "127.0.0.1", "-p", "0", "-b"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let mut child = command.spawn().expect("spawn delayq");
    let status = crate::common::daemon::wait_exit(&mut child, crate::common::REPLY_TIMEOUT);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.signal(), None, "killed by a signal: {stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
}
