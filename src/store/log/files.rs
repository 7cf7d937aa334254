//! The data directory: its lock, and the names, headers and preparation of
//! its files.
//!
//! ```text
//! lock                      held (flock) while a delayq process uses the directory
//! log.<16 hex digits>       a log file, numbered from 1 up, no number skipped
//! snapshot.<16 hex digits>  every job as of the record number in its name
//! spare.<n>                 a file made ready to become the next log file
//! head                      the newest log file begun (see [`Head`])
//! *.damaged                 a file with a bad header, set aside by --salvage
//! *.tmp                     being written; a leftover one is removed at start
//! ```
//!
//! A log file and a snapshot begin with a 32-byte header: a magic word, the
//! format version, four zero bytes, and two numbers (a log file's own number
//! and the number of its first record; a snapshot's first record number to
//! replay after it, and zero). The header has no checksum of its own: every
//! byte of it is checked against what it must be (the numbers against the
//! file's name and its records), so the zeros must be zeros.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::warn;

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
    if h[12..16] != [0; 4] {
        return Err("its bytes 12 to 15 are not zero".into());
    }
    let a = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
    if kind == Kind::Snapshot && b != 0 {
        return Err("its bytes 24 to 31 are not zero".into());
    }
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
    /// The directory.
    pub dir: PathBuf,
    /// Log files by number, in order.
    pub logs: Vec<(u64, PathBuf)>,
    /// Snapshots by start, in order.
    pub snapshots: Vec<(u64, PathBuf)>,
    /// Spare files.
    pub spares: Vec<PathBuf>,
    /// The head file, as read (`None`: there is none), and its generation.
    pub head: Option<Result<(Head, u64), String>>,
    /// The highest record the head file says was synced (0: it says
    /// none, or there is no head file).
    pub synced: u64,
    /// The head file says the last run stopped cleanly, every change it
    /// took in the log (see [`SYNCED_AT`]).
    pub stopped: bool,
}

/// Lists `dir`, removing leftover `*.tmp` files.
pub fn list(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing {
        dir: dir.to_path_buf(),
        ..Listing::default()
    };
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
        } else if name == HEAD_FILE {
            listing.head = Some(read_head(&path));
            (listing.synced, listing.stopped) = read_synced(&path);
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

/// The file that names the newest log file begun.
///
/// Without it, a start cannot tell a directory whose newest log files were
/// lost from one that never had them: the series simply ends sooner, and
/// the jobs (and server ids) of those files would be forgotten silently.
/// It is a lower bound, and every crash order keeps it one: it is
/// rewritten only once the new log file's name is on disk (renamed, the
/// directory synced), so after a crash it names that file or the one
/// before, never one not yet there. (A record at the end of each finished
/// file naming its successor was the other way considered: it says nothing
/// once compaction has removed the files before the current one, the very
/// case of a snapshot followed by one log file, and it would cost a sync
/// of the old file after the new one is named.)
///
/// It is overwritten in place, never replaced by a new file: on a full
/// disk a new file may find no block, and a log that cannot begin its
/// next file would stop taking changes. So it holds two copies, in
/// different sectors, each with a checksum and a generation; a write goes
/// to the older copy, so a torn write leaves the newer one whole (naming
/// the file before: still a lower bound).
pub const HEAD_FILE: &str = "head";
const HEAD_MAGIC: &[u8; 8] = b"DELAYQHD";
const HEAD_LEN: usize = 48;
/// Where the two copies lie: a sector apart.
const HEAD_SLOTS: [u64; 2] = [0, 512];
const HEAD_SIZE: u64 = 1024;

/// What the head file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The newest log file begun: every log file up to it was on disk.
    pub number: u64,
    /// A server id at or above every one handed out before that file
    /// began (the next one a put would take then).
    pub next_key: u64,
    /// The size of the log files it is written with: how many puts that
    /// file can hold at most, should it be lost.
    pub file_size: u64,
}

fn encode_head(head: &Head, generation: u64) -> [u8; HEAD_LEN] {
    let mut b = [0u8; HEAD_LEN];
    b[..8].copy_from_slice(HEAD_MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    b[24..32].copy_from_slice(&head.number.to_le_bytes());
    b[32..40].copy_from_slice(&head.next_key.to_le_bytes());
    b[40..48].copy_from_slice(&head.file_size.to_le_bytes());
    let crc = head_crc(&b);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Where the head file keeps the synced mark: the highest record known
/// synced, written by the writer thread when it has nothing more to write
/// (not synced itself: it only ever says less than is on disk). It tells
/// recovery which records of the newest log file were synced, when no
/// later record's stamp says so, as none does for the last group before a
/// stop: a bad record among them is damage, not a torn tail. In the first
/// sector, between the two copies: a write of it rewrites the first copy
/// with its own bytes.
///
/// Written by a clean stop, once everything taken was synced, the mark
/// says so too (its magic is [`STOPPED_MAGIC`]), and the start after
/// clears it, synced, before the first change. A start that does not find
/// it cannot tell what the log lost from its end (a power cut under -f or
/// -F, a torn tail, a file cut short), so it numbers new jobs past every
/// id the newest file could have held.
const SYNCED_AT: u64 = 256;
const SYNCED_MAGIC: &[u8; 8] = b"DELAYQSY";
const STOPPED_MAGIC: &[u8; 8] = b"DELAYQST";
const SYNCED_LEN: usize = 20;

fn encode_synced(seq: u64, stopped: bool) -> [u8; SYNCED_LEN] {
    let mut b = [0u8; SYNCED_LEN];
    b[..8].copy_from_slice(if stopped { STOPPED_MAGIC } else { SYNCED_MAGIC });
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&b[..16]);
    b[16..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The synced mark of a head file, and whether a clean stop wrote it; 0
/// and not stopped if it has none or it is not whole (heads written before
/// 2026-12-07 have none, and builds before the clean stop's mark never
/// say stopped: a start after an upgrade numbers past the newest file).
fn read_synced(path: &Path) -> (u64, bool) {
    let Ok(data) = fs::read(path) else {
        return (0, false);
    };
    let at = SYNCED_AT as usize;
    let Some(b) = data.get(at..at + SYNCED_LEN) else {
        return (0, false);
    };
    let crc = u32::from_le_bytes(b[16..].try_into().expect("4 bytes"));
    let stopped = &b[..8] == STOPPED_MAGIC;
    if !(stopped || &b[..8] == SYNCED_MAGIC) || crc != crc32c::crc32c(&b[..16]) {
        return (0, false);
    }
    (
        u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        stopped,
    )
}

/// The checksum of a head copy: its version and everything after the
/// checksum itself, so that a changed version is a damaged copy, not a
/// copy read by the wrong rules.
fn head_crc(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[8..12]), &b[16..HEAD_LEN])
}

/// The newest format version whose heads were written with the version
/// left out of their checksum.
const UNSUMMED_HEAD_VERSION: u32 = 2;

/// A whole head copy: what it says, its generation and its version.
fn decode_head(b: &[u8]) -> Option<(Head, u64, u32)> {
    let b = b.get(..HEAD_LEN)?;
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    // Builds before 2026-12-02 left the version out of the checksum; the
    // heads they wrote are rewritten in the new form when the next log
    // file begins.
    let whole =
        crc == head_crc(b) || (version <= UNSUMMED_HEAD_VERSION && crc == crc32c::crc32c(&b[16..]));
    (&b[..8] == HEAD_MAGIC && whole).then(|| {
        let head = Head {
            number: word(24),
            next_key: word(32),
            file_size: word(40),
        };
        (head, word(16), version)
    })
}

/// Reads a head file: the copy of the highest generation; the error says
/// that neither copy is whole, or that the newest is of a format this
/// build does not know (written by a newer delayq).
pub fn read_head(path: &Path) -> Result<(Head, u64), String> {
    let data = fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let whole: Vec<_> = HEAD_SLOTS
        .iter()
        .filter_map(|&at| decode_head(data.get(at as usize..)?))
        .collect();
    if whole.len() == 1 {
        // A torn write of a copy leaves this, and so does a failing disk,
        // which would also weaken the check the head is for: said, not
        // refused, as the whole copy is still a lower bound.
        warn!(
            file = %path.display(),
            "one of the head file's two copies is damaged (a write torn by a crash, \
             or a failing disk); the other is used"
        );
    }
    let (head, generation, version) = whole
        .into_iter()
        .max_by_key(|&(_, generation, _)| generation)
        .ok_or_else(|| "neither of its two copies is whole".to_string())?;
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(format!(
            "format version {version}; this delayq reads versions {OLDEST_VERSION} to {VERSION}"
        ));
    }
    Ok((head, generation))
}

/// The head file, open for rewriting.
pub struct HeadFile {
    file: File,
    generation: u64,
}

impl HeadFile {
    /// Opens the head file, whose newest copy is of `generation`.
    pub fn open(dir: &Path, generation: u64) -> io::Result<HeadFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(HEAD_FILE))?;
        Ok(HeadFile { file, generation })
    }

    /// Makes a new head file saying `head` (both copies), its blocks
    /// allocated, named once whole, the directory synced.
    pub fn create(dir: &Path, head: &Head) -> io::Result<HeadFile> {
        let mut both = vec![0u8; HEAD_SIZE as usize];
        for (generation, at) in HEAD_SLOTS.iter().enumerate() {
            let at = *at as usize;
            both[at..at + HEAD_LEN].copy_from_slice(&encode_head(head, generation as u64));
        }
        let file = prepare(&dir.join(HEAD_FILE), HEAD_SIZE, &both)?;
        sync_dir(dir)?;
        Ok(HeadFile {
            file,
            generation: 1,
        })
    }

    /// Sets the synced mark to `seq` (see [`SYNCED_AT`]); synced only if
    /// `sync`.
    pub fn mark_synced(&mut self, seq: u64, sync: bool) -> io::Result<()> {
        self.file
            .write_all_at(&encode_synced(seq, false), SYNCED_AT)?;
        if sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Sets the synced mark to `seq`, the last record, saying the server
    /// stopped cleanly with every change it took synced; synced.
    pub fn mark_stopped(&mut self, seq: u64) -> io::Result<()> {
        self.file
            .write_all_at(&encode_synced(seq, true), SYNCED_AT)?;
        self.file.sync_data()
    }

    /// Says `head`, synced: written over the older copy.
    pub fn write(&mut self, head: &Head) -> io::Result<()> {
        let generation = self.generation + 1;
        let at = HEAD_SLOTS[(generation % 2) as usize];
        self.file.write_all_at(&encode_head(head, generation), at)?;
        self.file.sync_data()?;
        self.generation = generation;
        Ok(())
    }
}

/// The name a file with a bad header is set aside under by `--salvage`:
/// out of the series, so that no later file takes its name and no
/// compaction removes it; never over an earlier one.
pub fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let mut to = path.with_file_name(format!("{name}.damaged"));
    let mut n = 1;
    while to.exists() {
        n += 1;
        to = path.with_file_name(format!("{name}.damaged.{n}"));
    }
    fs::rename(path, &to)?;
    Ok(to)
}

/// The size of a page of the page cache.
const PAGE: usize = 4096;

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
            // A page at a time: the page cache keeps a file in pieces the
            // size of the writes that brought them in (on kernels with
            // large folios, such as 6.18 with ext4), and with `-f` or `-F`
            // the log file is written through a mapping, where the first
            // write to each page after a sync costs the work of its whole
            // piece. Measured by hand (a mapped 8 MiB file, a page written
            // at a time, a sync every 16 pages): 6.25 µs a page in a file
            // zero-filled by 1 MiB writes, 2.22 µs in one zero-filled by
            // 4 KiB writes.
            let zeros = [0u8; PAGE];
            let mut at = 0;
            while at < size {
                let n = (size - at).min(PAGE as u64) as usize;
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
        // Every byte is checked: a flip in the zeros is damage too.
        for at in 12..16 {
            let mut flipped = h;
            flipped[at] ^= 0x10;
            assert!(
                read_header(Kind::Log, &flipped)
                    .unwrap_err()
                    .contains("12 to 15")
            );
        }
        let s = header(Kind::Snapshot, 7, 0);
        assert_eq!(read_header(Kind::Snapshot, &s), Ok((7, 0, VERSION)));
        let mut flipped = s;
        flipped[30] ^= 1;
        assert!(
            read_header(Kind::Snapshot, &flipped)
                .unwrap_err()
                .contains("24 to 31")
        );
    }

    /// A head naming log file `number`.
    fn head(number: u64) -> Head {
        Head {
            number,
            next_key: number * 10,
            file_size: 4096,
        }
    }

    /// A torn write of the head leaves the copy before it, and the
    /// newest whole copy wins, even one naming a lower file (a salvage
    /// lowers it).
    #[test]
    fn the_head_survives_a_torn_write_of_either_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HEAD_FILE);
        let mut file = HeadFile::create(dir.path(), &head(1)).unwrap();
        assert_eq!(read_head(&path), Ok((head(1), 1)));
        file.write(&head(5)).unwrap();
        file.write(&head(3)).unwrap();
        assert_eq!(read_head(&path), Ok((head(3), 3)));
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEAD_SLOTS[1] as usize + 30] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_head(&path), Ok((head(5), 2)));
        bytes[HEAD_SLOTS[0] as usize + 30] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert!(read_head(&path).is_err());
    }

    /// The synced mark reads back, with whether a clean stop wrote it,
    /// leaves both copies whole, and reads as 0 (nothing known synced, no
    /// clean stop) when it is missing or damaged.
    #[test]
    fn the_synced_mark_reads_back_and_a_damaged_one_says_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HEAD_FILE);
        let mut file = HeadFile::create(dir.path(), &head(1)).unwrap();
        assert_eq!(read_synced(&path), (0, false), "a new head has no mark");
        file.write(&head(2)).unwrap();
        file.mark_synced(41, false).unwrap();
        file.mark_synced(42, true).unwrap();
        assert_eq!(read_synced(&path), (42, false));
        file.mark_stopped(43).unwrap();
        assert_eq!(read_synced(&path), (43, true));
        assert_eq!(read_head(&path), Ok((head(2), 2)));
        let mut bytes = fs::read(&path).unwrap();
        bytes[SYNCED_AT as usize + 9] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_synced(&path), (0, false));
        assert_eq!(read_head(&path), Ok((head(2), 2)));
    }

    /// The version is part of a head copy's checksum: a flipped version
    /// byte makes the copy damaged (the other one is read); a whole copy of
    /// a version this build does not know is refused by name; a head
    /// written by a build that left the version out of the checksum is
    /// still read.
    #[test]
    fn a_heads_version_is_checked_and_checksummed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(HEAD_FILE);
        let mut file = HeadFile::create(dir.path(), &head(1)).unwrap();
        file.write(&head(2)).unwrap();
        let newest = HEAD_SLOTS[0] as usize;
        assert_eq!(read_head(&path), Ok((head(2), 2)));
        let good = fs::read(&path).unwrap();

        let mut bytes = good.clone();
        bytes[newest + 8] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_head(&path), Ok((head(1), 1)));

        let mut bytes = good.clone();
        let mut copy = encode_head(&head(2), 2);
        copy[8..12].copy_from_slice(&(VERSION + 1).to_le_bytes());
        let crc = head_crc(&copy);
        copy[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes[newest..newest + HEAD_LEN].copy_from_slice(&copy);
        fs::write(&path, &bytes).unwrap();
        let why = read_head(&path).unwrap_err();
        assert!(why.contains(&format!("version {}", VERSION + 1)), "{why}");

        let mut bytes = good;
        let mut old = encode_head(&head(2), 2);
        let crc = crc32c::crc32c(&old[16..]);
        old[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes[newest..newest + HEAD_LEN].copy_from_slice(&old);
        fs::write(&path, &bytes).unwrap();
        assert_eq!(read_head(&path), Ok((head(2), 2)));
    }
}
