//! A file system that fails under the log: an ext4 image on a loop device,
//! mounted to turn read-only at its first error, and an error raised in it
//! through ext4's own `trigger_fs_error` while delayq runs. Writes and
//! syncs then really fail (`EROFS`), as they do when a disk goes bad.

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
        let mnt = fs.path();
        let out = Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&fs.image)
            .arg(&mnt)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
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
        let out = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&self.image)
            .arg(&mnt)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
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
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: this kernel has no loop devices");
        return;
    }
    let Some(fs) = mounted_or_skipped(Ext4::mount(64), "an ext4 image") else {
        return;
    };
    let data = fs.path().join("data");
    let mut daemon = Daemon::durable(&data, &[]).await;
    let mut c = daemon.client().await;
    // Each acknowledged job and its body.
    let mut acked = Vec::new();
    for n in 0..50 {
        let body = format!("job {n}");
        acked.push((c.put_ok(0, 0, 60, body.as_bytes()).await, body));
    }
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
    let daemon = Daemon::durable(&data, &[]).await;
    let mut c = daemon.client().await;
    for (id, body) in &acked {
        assert_eq!(
            c.found(&format!("peek {id}")).await.body,
            body.as_bytes(),
            "job {id}, acknowledged before the failure"
        );
    }
    assert_eq!(
        c.stats().await.num("current-jobs-ready"),
        acked.len() as u64,
        "only the acknowledged jobs are back: the put under way at the failure is not"
    );
}
