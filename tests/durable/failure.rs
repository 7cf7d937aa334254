//! A file system that fails under the log: an ext4 image on a loop device,
//! mounted to turn read-only at its first error, and an error raised in it
//! through ext4's own `trigger_fs_error` while delayq runs. Writes and
//! syncs then really fail (`EROFS`), as they do when a disk goes bad.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::daemon::Daemon;
use crate::mounted_or_skipped;

/// An ext4 file system in an image file, mounted for one test on a loop
/// device; unmounted when dropped (the loop device goes with it).
struct Ext4 {
    dir: tempfile::TempDir,
    image: PathBuf,
}

impl Ext4 {
    /// Makes and mounts a file system of `mib` MiB, or says why it cannot.
    fn mount(mib: u64) -> Result<Ext4, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| e.to_string())?;
        let fs = Ext4 { dir, image };
        run("mkfs.ext4", &["-q", "-F"], &fs.image)?;
        std::fs::create_dir(fs.path()).map_err(|e| e.to_string())?;
        mount(&["-o", "loop,errors=remount-ro"], &fs.image, &fs.path())?;
        Ok(fs)
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// Raises an error in the file system, as a failing disk would: ext4
    /// aborts its journal and turns read-only.
    fn fail(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(self.path())
            .output()
            .expect("run findmnt");
        let source = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let device = Path::new(&source)
            .file_name()
            .expect("a device name")
            .to_owned();
        let knob = Path::new("/sys/fs/ext4")
            .join(device)
            .join("trigger_fs_error");
        std::fs::write(&knob, "delayq test").unwrap_or_else(|e| {
            panic!("cannot write {}: {e}", knob.display());
        });
    }

    /// Unmounts and mounts the image again (ext4 replays what its journal
    /// holds), as a restart after the disk was fixed would.
    fn remount(&self) {
        let mnt = self.path();
        run("umount", &[], &mnt).expect("unmount");
        mount(&["-o", "loop"], &self.image, &mnt).expect("mount again");
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// A file system on a loop device, made by `mount`, or `None` (the reason
/// printed) where this kernel or user cannot have one.
fn on_a_loop_device<T>(mount: impl FnOnce() -> Result<T, String>, what: &str) -> Option<T> {
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: this kernel has no loop devices");
        return None;
    }
    mounted_or_skipped(mount(), what)
}

/// Puts 50 jobs with bodies `PREFIX N`; returns each id and its body.
async fn put_jobs(c: &mut crate::common::Client, prefix: &str) -> Vec<(u64, String)> {
    let mut acked = Vec::new();
    for n in 0..50 {
        let body = format!("{prefix} {n}");
        acked.push((c.put_ok(0, 0, 60, body.as_bytes()).await, body));
    }
    acked
}

/// Mounts `source` at `at` with the options `args`; the error says why not.
fn mount(args: &[&str], source: &Path, at: &Path) -> Result<(), String> {
    let out = Command::new("mount")
        .args(args)
        .arg(source)
        .arg(at)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn run(program: &str, args: &[&str], path: &Path) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The log's file system fails under a running server: no change is
/// answered as made from then on (puts and deletes alike), reads go on,
/// and once the disk is back every job acknowledged before is there, and
/// nothing refused is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_file_system_stops_changes_and_keeps_what_was_acknowledged() {
    let Some(fs) = on_a_loop_device(|| Ext4::mount(64), "an ext4 image") else {
        return;
    };
    let data = fs.path().join("data");
    let mut daemon = Daemon::durable(&data, &[]).await;
    let mut c = daemon.client().await;
    // Each acknowledged job and its body.
    let acked = put_jobs(&mut c, "job").await;
    fs.fail();
    // The file system is read-only once `fail` returns: from here on no
    // put may be answered INSERTED.
    assert_eq!(c.put(0, 0, 60, b"under way").await, "INTERNAL_ERROR");
    for _ in 0..3 {
        assert_eq!(c.put(0, 0, 60, b"refused").await, "INTERNAL_ERROR");
    }
    let (kept, _) = &acked[0];
    assert_eq!(
        c.cmd(&format!("delete {kept}")).await,
        "INTERNAL_ERROR",
        "a delete that cannot be made safe is not answered DELETED"
    );
    // Reads go on, and the refused delete changed nothing.
    assert_eq!(c.found(&format!("peek {kept}")).await.body, b"job 0");
    // The first put after the failure was made in memory before its write
    // failed (the log learns of the failure from that write): answered
    // INTERNAL_ERROR, it is not on disk. The puts refused after it made
    // nothing.
    let live = c.stats().await.num("current-jobs-ready");
    assert_eq!(live, acked.len() as u64 + 1, "jobs in the failed server");
    daemon.kill();
    drop(c);

    fs.remount();
    // Only the acknowledged jobs are back: the put under way at the
    // failure is not.
    only_these_are_back(&data, &acked).await;
}

/// Starts a server on `data` and checks that its ready jobs are `acked`
/// (id and body), and no others.
async fn only_these_are_back(data: &Path, acked: &[(u64, String)]) {
    let daemon = Daemon::durable(data, &[]).await;
    let mut c = daemon.client().await;
    for (id, body) in acked {
        assert_eq!(
            c.found(&format!("peek {id}")).await.body,
            body.as_bytes(),
            "job {id}, acknowledged"
        );
    }
    assert_eq!(
        c.stats().await.num("current-jobs-ready"),
        acked.len() as u64,
        "jobs back that were never acknowledged"
    );
}

/// An ext4 file system on a loop device whose image lives on a small tmpfs
/// of its own: once that tmpfs is full, a write-back into a block punched
/// out of the image fails (`ENOSPC` from the loop device) while ext4 stays
/// read-write and keeps the page it could not write, marked clean, in its
/// cache. That is what a disk that fails one write leaves: a cache that
/// says what the disk does not.
struct Leaky {
    dir: tempfile::TempDir,
}

impl Leaky {
    /// An image of 32 MiB on a tmpfs of 40, every block of it written (so
    /// that only blocks punched out later need room), mounted.
    fn mount() -> Result<Leaky, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let fs = Leaky { dir };
        std::fs::create_dir(fs.backing()).map_err(|e| e.to_string())?;
        std::fs::create_dir(fs.path()).map_err(|e| e.to_string())?;
        mount(
            &["-t", "tmpfs", "-o", "size=40m"],
            Path::new("tmpfs"),
            &fs.backing(),
        )?;
        std::fs::write(fs.image(), vec![0u8; 32 << 20]).map_err(|e| e.to_string())?;
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ],
            &fs.image(),
        )?;
        mount(&["-o", "loop,errors=continue"], &fs.image(), &fs.path())?;
        Ok(fs)
    }

    fn backing(&self) -> PathBuf {
        self.dir.path().join("backing")
    }

    fn image(&self) -> PathBuf {
        self.backing().join("fs.img")
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// Punches the blocks of `file` from byte `from` (a multiple of 4096)
    /// on out of the image; they hold zeros, which a hole reads as too.
    fn punch(&self, file: &Path, from: u64) {
        let out = Command::new("filefrag")
            .args(["-v", "-b4096"])
            .arg(file)
            .output()
            .expect("run filefrag");
        let image = std::fs::OpenOptions::new()
            .write(true)
            .open(self.image())
            .expect("open the image");
        let mut punched = 0;
        // Extent lines: "  0:   0..  511:   34816..  35327:  512: ...".
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let nums: Vec<u64> = line
                .split([':', '.', ' '])
                .filter(|s| !s.is_empty())
                .map_while(|s| s.parse().ok())
                .collect();
            let [_, logical, _, physical, _, len, ..] = nums[..] else {
                continue;
            };
            for i in 0..len {
                if (logical + i) * 4096 >= from {
                    let at = i64::try_from((physical + i) * 4096).unwrap();
                    // SAFETY: a system call on a descriptor `image` keeps open.
                    let rc = unsafe {
                        libc::fallocate(
                            image.as_raw_fd(),
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            at,
                            4096,
                        )
                    };
                    assert_eq!(rc, 0, "punch a block of the image");
                    punched += 1;
                }
            }
        }
        assert!(punched > 0, "no block of {} punched", file.display());
    }

    /// Fills the tmpfs under the image; `unfill` frees it again.
    fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.backing().join("filler")).expect("filler");
        let block = vec![0u8; 4096];
        while filler.write_all(&block).is_ok() {}
    }

    fn unfill(&self) {
        std::fs::remove_file(self.backing().join("filler")).expect("remove the filler");
    }

    /// Unmounts the file system and mounts it again: its cache is gone, as
    /// after a reboot.
    fn remount(&self) {
        run("umount", &[], &self.path()).expect("unmount");
        mount(&["-o", "loop,errors=continue"], &self.image(), &self.path()).expect("mount again");
    }
}

impl Drop for Leaky {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.backing())
            .status();
    }
}

/// The byte after the last record of the log file `path`.
fn log_end(path: &Path) -> u64 {
    let data = std::fs::read(path).expect("read the log file");
    crate::frames(&data).last().map_or(32, |f| f.1) as u64
}

/// A record the disk refused (its write-back failed, its put answered
/// `INTERNAL_ERROR`) stays in the kernel's cache, marked clean, after the
/// server stops. A restart on the same file system must read the disk, not
/// that cache: otherwise it serves the refused job now, writes the next
/// records after it, and the start after a reboot finds a hole where it
/// was, with records after it, and calls the log damaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_failed_write_serves_what_the_disk_has() {
    let Some(fs) = on_a_loop_device(Leaky::mount, "an ext4 image on a tmpfs") else {
        return;
    };
    let data = fs.path().join("data");
    let mut daemon = Daemon::durable(&data, &[]).await;
    let mut c = daemon.client().await;
    let mut acked = put_jobs(&mut c, "before").await;
    let log = crate::log_files(&data).pop().expect("a log file");
    // Pads the log to a block's end, so that the refused record fills a
    // block of its own: the loop device fails a write of whole blocks
    // only. A put's record is its body plus as many bytes again for any
    // body of 128 to 16,383 bytes.
    let before = log_end(&log);
    acked.push((c.put_ok(0, 0, 60, &[b'p'; 200]).await, "p".repeat(200)));
    let extra = log_end(&log) - before - 200;
    let mut gap = (4096 - log_end(&log) % 4096) % 4096;
    if gap < extra + 128 {
        gap += 4096;
    }
    let pad = "q".repeat((gap - extra) as usize);
    acked.push((c.put_ok(0, 0, 60, pad.as_bytes()).await, pad));
    let end = log_end(&log);
    assert_eq!(end % 4096, 0, "the log padded to a block's end");
    assert_eq!(
        crate::log_files(&data).pop(),
        Some(log.clone()),
        "no new log file begun"
    );

    fs.punch(&log, end);
    fs.fill();
    let refused = vec![b'r'; (4096 - extra) as usize];
    assert_eq!(c.put(0, 0, 60, &refused).await, "INTERNAL_ERROR");
    assert_eq!(
        log_end(&log),
        end + 4096,
        "the refused record is in the cache"
    );
    fs.unfill();
    daemon.signal(libc::SIGTERM);
    daemon.wait_exit();
    drop(c);

    // Restarted on the same file system, its cache kept.
    let mut daemon = Daemon::durable(&data, &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(
        c.stats().await.num("current-jobs-ready"),
        acked.len() as u64,
        "the refused put is not served"
    );
    for n in 0..20 {
        let body = format!("after {n}");
        acked.push((c.put_ok(0, 0, 60, body.as_bytes()).await, body));
    }
    daemon.kill();
    drop(c);

    fs.remount();
    only_these_are_back(&data, &acked).await;
}

/// The data directory deleted under a running server: its log file takes
/// writes and syncs as before, but nothing in it would survive a restart,
/// so no change is answered as made from then on; reads go on, and the
/// log says how to save the jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_removed_under_the_server_stops_changes() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let said = scratch.path().join("delayq.log");
    let daemon = Daemon::durable_logged(&data, &[], &said).await;
    let mut c = daemon.client().await;
    let kept = c.put_ok(0, 0, 60, b"before").await;
    std::fs::remove_dir_all(&data).unwrap();
    assert_eq!(c.put(0, 0, 60, b"after").await, "INTERNAL_ERROR");
    assert_eq!(c.put(0, 0, 60, b"again").await, "INTERNAL_ERROR");
    assert_eq!(c.found(&format!("peek {kept}")).await.body, b"before");
    let said = std::fs::read_to_string(&said).unwrap();
    assert!(
        said.contains("was removed") && said.contains("delayq export"),
        "{said}"
    );
}
