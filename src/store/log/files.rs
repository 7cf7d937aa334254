//! The data directory: its lock, and the names, headers and preparation of
//! its files.
//!
//! ```text
//! lock                      held (flock) while a delayq process uses the directory
//! log.<16 hex digits>       a log file, numbered from 1 up, no number skipped
//! snapshot.<16 hex digits>  every job as of the record number in its name
//! spare.<n>                 a file made ready to become the next log file
//! *.tmp                     being written; a leftover one is removed at start
//! ```
//!
//! A log file and a snapshot begin with a 32-byte header: a magic word, the
//! format version, and two numbers (a log file's own number and the number
//! of its first record; a snapshot's first record number to replay after it).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes of a file header.
pub const HEADER: u64 = 32;
/// The format version this build writes (2: varint fields in records).
pub const VERSION: u32 = 2;
/// The oldest format version this build reads (1: fixed-size fields, what
/// delayq wrote before; its files are read, never appended to).
pub const OLDEST_VERSION: u32 = 1;

const LOG_MAGIC: &[u8; 8] = b"DELAYQLG";
const SNAPSHOT_MAGIC: &[u8; 8] = b"DELAYQSN";

/// Which kind of file a header opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A log file.
    Log,
    /// A snapshot.
    Snapshot,
}

/// A file header: (number, first record number) for a log file, (start,
/// 0) for a snapshot.
pub fn header(kind: Kind, a: u64, b: u64) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(match kind {
        Kind::Log => LOG_MAGIC,
        Kind::Snapshot => SNAPSHOT_MAGIC,
    });
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&a.to_le_bytes());
    h[24..32].copy_from_slice(&b.to_le_bytes());
    h
}

/// Reads a header: its two numbers and the file's format version; the
/// error says what is wrong with it.
pub fn read_header(kind: Kind, bytes: &[u8]) -> Result<(u64, u64, u32), String> {
    let Some(h) = bytes.get(..HEADER as usize) else {
        return Err("shorter than its header".into());
    };
    let magic = match kind {
        Kind::Log => LOG_MAGIC,
        Kind::Snapshot => SNAPSHOT_MAGIC,
    };
    if &h[..8] != magic {
        return Err("not a delayq file (wrong magic)".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(format!(
            "format version {version}; this delayq reads versions {OLDEST_VERSION} to {VERSION}"
        ));
    }
    let a = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
    Ok((a, b, version))
}

/// The path of log file `n`.
pub fn log_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("log.{n:016x}"))
}

/// The path of the snapshot that replays from record `start`.
pub fn snapshot_path(dir: &Path, start: u64) -> PathBuf {
    dir.join(format!("snapshot.{start:016x}"))
}

/// What a data directory holds.
#[derive(Debug, Default)]
pub struct Listing {
    /// Log files by number, in order.
    pub logs: Vec<(u64, PathBuf)>,
    /// Snapshots by start, in order.
    pub snapshots: Vec<(u64, PathBuf)>,
    /// Spare files.
    pub spares: Vec<PathBuf>,
}

/// Lists `dir`, removing leftover `*.tmp` files.
pub fn list(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing::default();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let number = |prefix: &str| {
            name.strip_prefix(prefix)
                .filter(|hex| hex.len() == 16)
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        };
        if name.ends_with(".tmp") {
            fs::remove_file(&path)?;
        } else if let Some(n) = number("log.") {
            listing.logs.push((n, path));
        } else if let Some(start) = number("snapshot.") {
            listing.snapshots.push((start, path));
        } else if name.starts_with("spare.") {
            listing.spares.push(path);
        }
    }
    listing.logs.sort();
    listing.snapshots.sort();
    Ok(listing)
}

/// Syncs a directory, so that files created, renamed or removed in it stay
/// so after a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Takes the directory's lock, so that a second delayq process pointed at
/// it stops instead of writing beside the first. Held while the file lives.
pub fn lock(dir: &Path) -> Result<File, String> {
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(format!(
            "{} is in use by another delayq process (its lock is held); \
             give each process a directory of its own",
            dir.display()
        )),
        Err(fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// Makes a spare file of `size` bytes whose blocks are allocated and
/// written (zeros), so that writing into it later cannot run out of room,
/// and a sync of such a write has no file size or block map to update: on
/// ext4 and XFS a block that `fallocate` reserved is marked unwritten, and
/// the first write into it makes `fdatasync` commit that change to the
/// file system's journal too, which costs as much again as the data.
pub fn prepare_spare(path: &Path, size: u64) -> io::Result<File> {
    prepare(path, size, &[])
}

/// Makes a new log file as [`prepare_spare`] makes a spare, with its header
/// `head` written and synced before it takes its name: a log file is never
/// seen without its header, which would stop every later start.
pub fn create_log(path: &Path, size: u64, head: &[u8]) -> io::Result<File> {
    prepare(path, size, head)
}

fn prepare(path: &Path, size: u64, head: &[u8]) -> io::Result<File> {
    let tmp = path.with_extension("tmp");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&tmp)?;
    if let Err(e) = allocate(&file, size) {
        drop(file);
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    file.write_all_at(head, 0)?;
    file.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(file)
}

/// Allocates `size` bytes for `file` and writes zeros over them: `fallocate`
/// first where the file system has it (a full disk then fails at once, and
/// the blocks are contiguous), then the zeros that make them written.
fn allocate(file: &File, size: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size).map_err(|_| io::Error::other("file size too large"))?;
    // SAFETY: a valid descriptor and plain integers.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 | libc::EOPNOTSUPP | libc::EINVAL => {
            let zeros = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < size {
                let n = (size - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            Ok(())
        }
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_and_refuse_what_is_not_theirs() {
        let h = header(Kind::Log, 3, 99);
        assert_eq!(read_header(Kind::Log, &h), Ok((3, 99, VERSION)));
        assert!(
            read_header(Kind::Snapshot, &h)
                .unwrap_err()
                .contains("magic")
        );
        let mut newer = h;
        newer[8] = 3;
        assert!(
            read_header(Kind::Log, &newer)
                .unwrap_err()
                .contains("version 3")
        );
        assert!(read_header(Kind::Log, &h[..10]).is_err());
    }
}
