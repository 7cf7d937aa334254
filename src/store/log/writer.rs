//! Getting appended records to disk: the shared buffer, and the writer
//! thread.
//!
//! Transitions append their records to a shared buffer while the state is
//! locked ([`Appender`], the engine's journal), which costs a copy into
//! memory. One writer thread takes whatever has gathered, writes it in one
//! go, syncs once, and then lets everyone whose records that covered have
//! their replies (group commit): while it syncs, the next group gathers, so
//! nobody waits for more than the sync in progress and their own.
//!
//! With `-f` or `-F` nobody waits for a sync, only for the kernel to have
//! the records: each is also copied into the log file through a mapping
//! ([`Mapped`]) as it is taken, which puts it in the page cache with no
//! system call, and the reply goes at once; the writer thread writes and
//! syncs on its deadline.
//!
//! Room for each record is checked as it is taken (`append.rs`).
//!
//! A failed write or sync is never retried nor assumed good (the kernel may
//! have dropped the pages): the log stops taking changes and says why.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{error, warn};

use super::files::{Head, HeadFile, log_path};
use crate::metrics::Histogram;

/// When a change counts as safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Synced before its reply (the default).
    Always,
    /// Written before its reply, synced within this long (`-f MS`).
    Every(Duration),
    /// Written before its reply, synced only at a clean stop (`-F`).
    Never,
}

/// How far the log has got, for those waiting on it.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    /// Every record up to this one is written to the files.
    pub written: u64,
    /// Every record up to this one is synced.
    pub synced: u64,
    /// Why the log stopped taking changes, if it did.
    pub failed: Option<Arc<str>>,
}

/// A prepared file, ready to become the next log file.
pub struct Spare {
    /// Where it is now.
    pub path: PathBuf,
    /// It, open for writing.
    pub file: File,
}

/// The log file being appended to, mapped into memory: with `-f` or `-F`
/// a record copied into it is in the kernel's page cache at once, as safe
/// from a kill of the process as after a `pwrite`, with no system call and
/// nothing to wait for. Its records are still written by `pwrite` later
/// (the chunks), before each sync: a file system turned read-only takes
/// writes to a mapping without a word, and the `pwrite` fails whether or
/// not the kernel at hand also fails the `fdatasync` of such pages (6.18
/// does, with ext4).
pub(super) struct Mapped {
    /// The log file's number.
    pub number: u64,
    map: memmap2::MmapMut,
}

impl Mapped {
    /// Maps log file `number`, `file`, whole; `None` if it cannot be mapped
    /// (its records then reach the kernel by `pwrite` alone).
    pub fn new(file: &File, number: u64) -> Option<Mapped> {
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        // SAFETY: the data directory is locked by this process, and nothing
        // shortens a log file while it is written, so the mapped pages stay
        // within the file. The bytes are only ever written through a raw
        // pointer (`put`), so no Rust reference covers the bytes that a
        // `pwrite` of this process writes at the same time.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(len)
                .populate()
                .map_mut(file)
        };
        map.ok().map(|map| Mapped { number, map })
    }

    /// Copies `bytes` to `offset` of the file; false (and nothing copied)
    /// if they do not fit in the mapping.
    pub fn put(&mut self, offset: u64, bytes: &[u8]) -> bool {
        let Some(end) = usize::try_from(offset)
            .ok()
            .and_then(|at| at.checked_add(bytes.len()))
        else {
            return false;
        };
        if end > self.map.len() {
            return false;
        }
        // SAFETY: `offset..end` lies within the mapping (checked above),
        // and the buffer's lock, held by the caller, keeps any other copy
        // into it out; `bytes` cannot overlap the mapping, as it is a
        // chunk's own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(end - bytes.len()),
                bytes.len(),
            );
        }
        true
    }
}

/// Bytes to write into one log file at one offset.
pub(super) struct Chunk {
    /// The log file's number.
    pub number: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
    /// The number of its first record (the next record's, when it was
    /// begun).
    pub first: u64,
    /// The spare that becomes this log file (the chunk starts its header).
    pub opens: Option<Spare>,
    /// What the head file says once it has (with `opens`), or once its
    /// records are written (a server id an import kept: see `append`).
    pub head: Option<Head>,
}

/// What the appenders, the writer and the keeper share, under one lock.
pub struct Buf {
    /// The number the next record gets.
    pub next_seq: u64,
    pub(super) chunks: Vec<Chunk>,
    /// Emptied byte buffers, kept for the next chunks.
    pub(super) free: Vec<Vec<u8>>,
    /// The log file being appended to, and the bytes used in it.
    pub number: u64,
    pub used: u64,
    /// Prepared files, oldest first.
    pub spares: VecDeque<Spare>,
    /// Each kept log file's number and first record.
    pub files: BTreeMap<u64, u64>,
    /// A server id above every one in the records taken (for the head
    /// file: see `files::Head`).
    pub next_key: u64,
    /// Live jobs, and the bytes of their put records.
    pub live_jobs: u64,
    pub live_bytes: u64,
    /// Bytes appended since start, ever.
    pub appended: u64,
    /// `appended` when the last snapshot began, and the snapshot's size.
    pub snapshot_at: u64,
    pub snapshot_bytes: u64,
    /// Bytes of the state that is not jobs (held client ids, tube
    /// settings, schedules, pauses), as the last snapshot (or the start)
    /// found it: live, like the jobs' bytes, not garbage to compact away.
    pub rest_bytes: u64,
    /// Bytes of such state let go since start (a window ended), ever: a
    /// snapshot taken meanwhile may have copied some of it.
    pub rest_gone: u64,
    /// The keeper should take a snapshot.
    pub compact: bool,
    /// A change was refused for want of prepared room: the keeper should
    /// prepare another file even if the live jobs' count does not ask for it.
    pub room_wanted: bool,
    /// The keeper could not prepare a file (the disk is full, or another
    /// error): room is not coming until it can.
    pub short_of_disk: bool,
    /// Why the log stopped taking changes.
    pub failed: Option<Arc<str>>,
    /// With `-f` or `-F`, the log file being appended to, mapped (see
    /// [`Mapped`]); `None` under the default policy, where every reply waits
    /// for the writer anyway.
    pub(super) map: Option<Mapped>,
    /// Every record up to this one is in the kernel, in a named log file
    /// (written, or copied into the mapping). A record is copied into the
    /// mapping only if it is the next: should one be in the kernel and one
    /// before it not, a kill would leave a hole, and recovery would cut the
    /// answered record off behind it as a torn tail.
    pub(super) in_kernel: u64,
    /// The writer sleeps until woken: a transition that appends wakes it.
    pub(super) writer_idle: bool,
    /// The server is stopping: write what is left, sync, stop.
    pub stopping: bool,
}

/// What the appenders, the writer thread and the keeper thread share.
pub struct Shared {
    /// The buffer and the accounting.
    pub buf: Mutex<Buf>,
    /// Wakes the writer.
    pub(super) wake: Condvar,
    /// Wakes the keeper (spares wanted, a snapshot wanted, stopping).
    pub chores: Condvar,
    /// Published by the writer.
    pub marks: watch::Sender<Marks>,
    /// The last record synced, for stamping records (a copy of the marks').
    pub(super) synced: AtomicU64,
    /// A copy of `Buf::in_kernel`, read without the lock.
    pub(super) in_kernel: AtomicU64,
    /// The data directory.
    pub dir: PathBuf,
    /// The data directory, held open for syncing it: a log file's begin
    /// must not need a descriptor, which a server holding as many clients
    /// as its limit allows may not have to spare (the log would fail).
    pub dir_file: File,
    /// When a change counts as safe.
    pub policy: SyncPolicy,
    /// The size of a log file.
    pub file_size: u64,
    /// The log file being written, and its number, locked by whoever
    /// writes into it (the writer thread, or with `-f`/`-F` a connection
    /// settling its change), so that records reach it in order.
    file: Mutex<(u64, Arc<File>)>,
    /// The head file, rewritten as each log file begins (`None`: it could
    /// not be made, and this run keeps none).
    pub(super) head: Mutex<Option<HeadFile>>,
    /// Figures for `stats`.
    pub records_written: AtomicU64,
    /// Records rewritten by snapshots.
    pub records_migrated: AtomicU64,
    /// Syncs of the log file.
    pub syncs: AtomicU64,
    /// How long they took: the disk's part of every synced change's wait,
    /// and the first figure to look at when replies slow down.
    pub sync_times: Histogram,
    /// Told when the keeper has prepared room (a spare file).
    pub room: tokio::sync::Notify,
}

impl Shared {
    /// A fresh shared state, appending to log file `number` at `used`,
    /// with `next_seq` the next record's number.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dir: PathBuf,
        policy: SyncPolicy,
        file_size: u64,
        next_seq: u64,
        number: u64,
        used: u64,
        files: BTreeMap<u64, u64>,
        current: File,
        dir_file: File,
    ) -> Shared {
        let synced = next_seq - 1;
        Shared {
            buf: Mutex::new(Buf {
                next_seq,
                chunks: Vec::new(),
                free: Vec::new(),
                number,
                used,
                spares: VecDeque::new(),
                files,
                next_key: 1,
                live_jobs: 0,
                live_bytes: 0,
                appended: 0,
                snapshot_at: 0,
                snapshot_bytes: 0,
                rest_bytes: 0,
                rest_gone: 0,
                compact: false,
                room_wanted: false,
                short_of_disk: false,
                failed: None,
                map: None,
                in_kernel: synced,
                writer_idle: false,
                stopping: false,
            }),
            wake: Condvar::new(),
            chores: Condvar::new(),
            marks: watch::Sender::new(Marks {
                written: synced,
                synced,
                failed: None,
            }),
            synced: AtomicU64::new(synced),
            in_kernel: AtomicU64::new(synced),
            dir,
            dir_file,
            policy,
            file_size,
            file: Mutex::new((number, Arc::new(current))),
            head: Mutex::new(None),
            records_written: AtomicU64::new(0),
            records_migrated: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            sync_times: Histogram::default(),
            room: tokio::sync::Notify::new(),
        }
    }

    /// Writes every record gathered so far into the log file and publishes
    /// the written mark; false if there was nothing to write, or the log
    /// has failed.
    pub fn flush(&self) -> bool {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken with the file locked, so that groups are written in order.
        let (chunks, upto) = {
            let mut b = self.lock();
            if b.failed.is_some() {
                b.chunks.clear();
                return false;
            }
            (std::mem::take(&mut b.chunks), b.next_seq - 1)
        };
        if chunks.is_empty() {
            return false;
        }
        let records = written_records(self, upto);
        let mut emptied = Vec::new();
        let opened = match write(self, &mut file.1, chunks, upto, &mut emptied) {
            Ok(opened) => {
                if let Some(number) = opened {
                    file.0 = number;
                }
                opened
            }
            Err((what, e)) => {
                drop(file);
                self.fail(what, &e);
                return false;
            }
        };
        // The file just begun is mapped only now that it has its name: a
        // record copied into it before would not survive a kill.
        let map = opened
            .filter(|_| self.policy != SyncPolicy::Always)
            .map(|number| Mapped::new(&file.1, number));
        let unmapped = {
            let mut b = self.lock();
            b.free.append(&mut emptied);
            // Flushes are in order (the file's lock), so every record up to
            // `upto` is now in the kernel.
            if b.in_kernel < upto {
                b.in_kernel = upto;
                self.in_kernel.store(upto, Ordering::Release);
            }
            map.and_then(|map| std::mem::replace(&mut b.map, map))
        };
        // Unmapped outside the lock: it flushes the processor's address
        // translations, which takes a while.
        drop(unmapped);
        self.records_written.fetch_add(records, Ordering::Relaxed);
        // Under the default policy nobody waits for a write alone: the
        // mark moves without waking the relay, which would only wake the
        // runtime for nothing, once per group.
        let tell = !matches!(self.policy, SyncPolicy::Always);
        self.marks.send_if_modified(|m| {
            m.written = m.written.max(upto);
            tell
        });
        true
    }

    /// Syncs what is written.
    fn sync(&self) -> Result<(), ()> {
        // The records written so far are in this file, or in files synced
        // before it was begun; holding the file itself (not its lock) lets
        // writes go on while it syncs, and takes no descriptor, which a
        // server at its open-file limit may not have.
        let (number, handle, upto) = {
            let file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            (file.0, Arc::clone(&file.1), self.marks.borrow().written)
        };
        let start = Instant::now();
        if let Err(e) = handle.sync_data() {
            self.fail("fdatasync", &e);
            return Err(());
        }
        self.sync_times.observe(start.elapsed());
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.publish_synced(number, &handle, upto)
    }

    /// Says that every record up to `upto` is synced, now that a sync of
    /// log file `number` (`handle`), the file they end in, is over.
    fn publish_synced(&self, number: u64, handle: &File, upto: u64) -> Result<(), ()> {
        // A log file removed under a running server (its directory
        // deleted, say) takes writes and syncs as before, but nothing in it
        // would survive a restart: no change written to it may be answered
        // as made. One look at its link count a sync (see `unlinked`). But
        // the log may have moved on to the next file during the sync, and a
        // snapshot removed this one, as it may once its records are all in
        // the snapshot (synced, with its name on disk): those records are
        // safe, and the file is no longer among those the log keeps.
        if unlinked(handle) && self.keeps(number) {
            self.removed();
            return Err(());
        }
        // Nor is anything answered once the log has failed (the file
        // before a new one was found removed, say).
        if self.marks.borrow().failed.is_some() {
            return Err(());
        }
        self.synced.fetch_max(upto, Ordering::Release);
        self.marks.send_modify(|m| m.synced = m.synced.max(upto));
        Ok(())
    }

    /// Whether log file `number` is among those the log keeps (a snapshot
    /// lets go of a file before it removes it).
    fn keeps(&self, number: u64) -> bool {
        self.lock().files.contains_key(&number)
    }

    /// Locks the buffer.
    pub fn lock(&self) -> MutexGuard<'_, Buf> {
        self.buf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops taking changes, for good, and says why: a write or sync
    /// failed.
    fn fail(&self, what: &str, e: &io::Error) {
        self.stop_changes(
            format!("{what} failed: {e}"),
            "they could not be made safe",
            "Restart it once the cause is fixed: the log is recovered up to the last \
             record that reached the disk",
        );
    }

    /// The same when the log file is no longer in the directory.
    fn removed(&self) {
        self.stop_changes(
            format!(
                "the log file was removed from {} while delayq ran",
                self.dir.display()
            ),
            "a restart would not find them",
            "The jobs are still served from memory: save them with `delayq export` \
             before a restart, and put them back with `delayq import`",
        );
    }

    /// Stops taking changes for `why`, which `because` and `next` explain
    /// to whoever reads the log.
    fn stop_changes(&self, why: String, because: &str, next: &str) {
        let why: Arc<str> = Arc::from(why);
        error!(
            error = %why,
            "THE LOG FAILED: delayq takes no more changes ({because}); reads go on. {next}"
        );
        self.lock().failed = Some(why.clone());
        self.marks.send_modify(|m| m.failed = Some(why));
    }

    /// Asks the writer to write what is left, sync and stop.
    pub fn stop(&self) {
        self.lock().stopping = true;
        self.wake.notify_all();
        self.chores.notify_all();
    }
}

/// The writer thread: writes what gathers, syncs as the policy says,
/// publishes how far it got; stops once told to and everything is synced.
///
/// Under the default policy it writes and syncs what has gathered as soon
/// as the last sync is over, without waiting for more to come. Until
/// 2026-12-06 it let the next group gather after a sync under load (for
/// half the sync, or until as many records as the last group had), which
/// made groups larger and a disk's syncs fewer; with the server on one
/// runtime thread it cost more than it saved. In four alternated `compare`
/// runs of `cycle` (3 rounds of 5 s each, beside beanstalkd `-b`), with no
/// wait: 0.89, 0.82, 0.84 and 0.76 × beanstalkd `-b`, cycle p99 1.12 to
/// 1.36 ×; with it: 0.66, 0.60, 0.54 and 0.70 ×, p99 1.44 to 1.56 ×.
pub fn run(shared: Arc<Shared>) {
    super::not_preempting();
    let mut last_sync = Instant::now();
    // The head file's synced mark as last written (recovery wrote it), and
    // when to write it again if nothing comes meanwhile.
    let mut marked = shared.marks.borrow().synced;
    let mut mark_at: Option<Instant> = None;
    loop {
        let unsynced = |shared: &Shared| {
            let m = shared.marks.borrow();
            m.written > m.synced
        };
        // With -F, when the records gathering are to be written (see
        // `LINGER`).
        let mut linger: Option<Instant> = None;
        let stopping = {
            let mut b = shared.lock();
            loop {
                if b.stopping {
                    break;
                }
                let gathered = !b.chunks.is_empty();
                // Under the default policy the records are this thread's to
                // write at once. With -f or -F they are in the kernel
                // already, copied into the mapped log file as they were
                // taken (or, around the start of a new file, written by the
                // connection waiting on them): this thread writes them by
                // `pwrite` only at its deadline, which is how a failed file
                // system shows, before it syncs. Woken as soon as any
                // gathered, it would wake for every change under load (on
                // -f 50 the cycle benchmark once counted 1,000 to 2,400
                // futex calls and 1,100 to 2,100 context switches a second
                // in the server; 110 to 130 and 200 to 270 without). (Under
                // the default policy the keeper may write them too, before
                // a snapshot: then they are written but not synced, and
                // still this thread's.)
                if shared.policy == SyncPolicy::Always && (gathered || unsynced(&shared)) {
                    break;
                }
                let deadline = match shared.policy {
                    SyncPolicy::Always => None,
                    SyncPolicy::Every(every) if gathered || unsynced(&shared) => {
                        Some(last_sync + every)
                    }
                    SyncPolicy::Every(_) => None,
                    // Once set, kept even if the connections wrote what
                    // had gathered: woken for every record, and finding it
                    // written already, this thread would wake and sleep
                    // for each.
                    SyncPolicy::Never if gathered => {
                        Some(*linger.get_or_insert_with(|| Instant::now() + LINGER))
                    }
                    SyncPolicy::Never => linger,
                };
                // A writer that will wake by itself (with -f to sync once
                // something is unsynced, with -F to write what lingers)
                // needs no wake-up per record: nobody waits for it.
                b.writer_idle = deadline.is_none();
                // Nothing to do until woken: once that has lasted
                // `MARK_AFTER`, the synced mark catches up (under load the
                // next group comes first, and its stamps say as much).
                let synced = shared.marks.borrow().synced;
                if deadline.is_none() && synced > marked {
                    let at = *mark_at.get_or_insert_with(|| Instant::now() + MARK_AFTER);
                    let now = Instant::now();
                    if now >= at {
                        drop(b);
                        mark_synced(&shared, synced, false);
                        (marked, mark_at) = (synced, None);
                        b = shared.lock();
                    } else {
                        b = shared
                            .wake
                            .wait_timeout(b, at - now)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    b.writer_idle = false;
                    continue;
                }
                b = match deadline {
                    None => shared.wake.wait(b).unwrap_or_else(PoisonError::into_inner),
                    Some(at) => {
                        let now = Instant::now();
                        if now >= at {
                            break;
                        }
                        shared
                            .wake
                            .wait_timeout(b, at - now)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                    }
                };
                b.writer_idle = false;
            }
            if b.failed.is_some() {
                // Nothing more reaches the files; wait to be stopped.
                b.chunks.clear();
                if b.stopping {
                    return;
                }
                drop(shared.wake.wait(b));
                continue;
            }
            b.stopping
        };
        mark_at = None;
        shared.flush();
        let sync_now = unsynced(&shared)
            && match shared.policy {
                SyncPolicy::Always => true,
                SyncPolicy::Every(every) => stopping || last_sync.elapsed() >= every,
                SyncPolicy::Never => stopping,
            };
        if sync_now {
            if shared.sync().is_err() {
                continue;
            }
            last_sync = Instant::now();
        }
        if stopping && !unsynced(&shared) && shared.lock().chunks.is_empty() {
            // Every change taken is synced: the next start may number new
            // jobs from the last one found (see `files::SYNCED_AT`).
            mark_synced(&shared, shared.marks.borrow().synced, true);
            return;
        }
    }
}

/// Whether `file` has no name left in any directory.
///
/// Asks for the link count alone. Linux 6.13 and later keep a file's
/// timestamps coarse (a clock tick) until someone asks for them; then the
/// next write stamps the time to the nanosecond, so that the asker sees it
/// change. A full `fstat` after every sync asked each time, so every group
/// changed the file's modification time, and on ext4 every `fdatasync`
/// then also wrote the inode, and waited for it: three requests to the
/// disk a sync instead of two (the records, then the flush), measured on
/// the block layer's own trace: 20 inode writes in 20 syncs with `fstat`,
/// 2 with the link count alone.
fn unlinked(file: &File) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: all zeros is a valid `statx`, which the call fills in.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: an empty path with `AT_EMPTY_PATH` names the open
        // descriptor itself; `stx` is a valid place for the answer.
        let r = unsafe {
            libc::statx(
                file.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_NLINK,
                &mut stx,
            )
        };
        if r == 0 && stx.stx_mask & libc::STATX_NLINK != 0 {
            return stx.stx_nlink == 0;
        }
    }
    file.metadata().is_ok_and(|m| m.nlink() == 0)
}

/// How long the writer is idle before it writes the synced mark.
const MARK_AFTER: Duration = Duration::from_millis(1);

/// Sets the head file's synced mark to `synced`; if `stopped`, synced and
/// saying the server stopped cleanly. A failure only leaves the mark lower
/// than it could be, or the clean stop unsaid, which recovery reads as
/// less known.
fn mark_synced(shared: &Shared, synced: u64, stopped: bool) {
    let mut head = shared.head.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(file) = head.as_mut() {
        let written = if stopped {
            file.mark_stopped(synced)
        } else {
            file.mark_synced(synced, false)
        };
        if let Err(e) = written {
            warn!(error = %e, "cannot write the head file's synced mark");
        }
    }
}

/// With -F, how long records appended may wait for the writer thread's
/// `pwrite`. They reach the kernel before their replies without it (the
/// mapped file), and woken at every append, as under the default policy,
/// it would cost a wake-up of a thread per change (the cycle benchmark
/// once showed a fifth fewer cycles than with -f 50, which waits so
/// already).
const LINGER: Duration = Duration::from_millis(50);

/// Waits on `cv` while `waiting` holds, until `until` at the latest;
/// gives the lock back either way.
pub(super) fn wait_while<'a>(
    cv: &Condvar,
    mut b: MutexGuard<'a, Buf>,
    until: Instant,
    waiting: impl Fn(&Buf) -> bool,
) -> MutexGuard<'a, Buf> {
    while waiting(&b) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        b = cv
            .wait_timeout(b, until - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    b
}

/// How many records a write up to `upto` covers beyond those already
/// written.
fn written_records(shared: &Shared, upto: u64) -> u64 {
    upto.saturating_sub(shared.marks.borrow().written)
}

/// Writes `chunks` in order; a chunk that opens a log file first finishes
/// the current one (synced), then makes the spare the next log file: its
/// header and records written and synced, then its new name, then the
/// directory synced, so a log file's name never outlives its data; then
/// the head file names it, only now that the name is on disk, so the head
/// never names a file a crash could leave unnamed. Records are published
/// as synced as soon as they are safe: those in the old file once it is
/// synced, those in the new one once it is named (`upto` is the last
/// record in `chunks`).
///
/// Returns the number of the last log file it began, if it began one.
fn write(
    shared: &Shared,
    current: &mut Arc<File>,
    chunks: Vec<Chunk>,
    upto: u64,
    emptied: &mut Vec<Vec<u8>>,
) -> Result<Option<u64>, (&'static str, io::Error)> {
    let mut opened = None;
    let mut chunks = chunks.into_iter().peekable();
    while let Some(mut chunk) = chunks.next() {
        // Its last record: the one before the next chunk's first, or for
        // the last chunk the last record taken.
        let end = chunks.peek().map_or(upto, |next| next.first - 1);
        match chunk.opens.take() {
            None => {
                current
                    .write_all_at(&chunk.bytes, chunk.offset)
                    .map_err(|e| ("write", e))?;
                // Raised past a server id an import kept (see `append`).
                if let Some(says) = chunk.head {
                    let mut head = shared.head.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(file) = head.as_mut() {
                        file.write(&says).map_err(|e| ("head file write", e))?;
                    }
                }
            }
            Some(spare) => {
                current.sync_data().map_err(|e| ("fdatasync", e))?;
                // The records before this file are safe now: their replies
                // need not wait for the three syncs that follow (the new
                // file's, the directory's and the head file's).
                // (If the old file was removed, the log has failed, and
                // nothing more is answered.)
                let before = chunk.first - 1;
                if shared.synced.load(Ordering::Acquire) < before {
                    let _ = shared.publish_synced(chunk.number - 1, current, before);
                }
                spare
                    .file
                    .write_all_at(&chunk.bytes, chunk.offset)
                    .map_err(|e| ("write", e))?;
                spare.file.sync_data().map_err(|e| ("fdatasync", e))?;
                fs::rename(&spare.path, log_path(&shared.dir, chunk.number))
                    .map_err(|e| ("rename", e))?;
                shared
                    .dir_file
                    .sync_all()
                    .map_err(|e| ("directory sync", e))?;
                *current = Arc::new(spare.file);
                opened = Some(chunk.number);
                {
                    let mut head = shared.head.lock().unwrap_or_else(PoisonError::into_inner);
                    if let (Some(file), Some(says)) = (head.as_mut(), chunk.head) {
                        file.write(&says).map_err(|e| ("head file write", e))?;
                    }
                }
                // The new file's records are synced and it has its name on
                // disk: they are safe, without the sync of the writer's
                // next turn (about 0.1 ms more for every begin's replies).
                let _ = shared.publish_synced(chunk.number, current, end);
            }
        }
        chunk.bytes.clear();
        if emptied.len() < 4 {
            emptied.push(chunk.bytes);
        }
    }
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_file_is_unlinked_once_its_last_name_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let file = File::create(&path).unwrap();
        assert!(!unlinked(&file));
        fs::hard_link(&path, dir.path().join("other")).unwrap();
        fs::remove_file(&path).unwrap();
        assert!(!unlinked(&file), "it still has a name");
        fs::remove_file(dir.path().join("other")).unwrap();
        assert!(unlinked(&file));
    }

    /// A log whose current file is log file 1 of `dir`, which the log keeps
    /// if `kept`.
    fn log_in(dir: &std::path::Path, kept: bool) -> Shared {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(log_path(dir, 1))
            .unwrap();
        let files = if kept {
            BTreeMap::from([(1, 1)])
        } else {
            BTreeMap::new()
        };
        let dir_file = File::open(dir).unwrap();
        let shared = Shared::new(
            dir.to_path_buf(),
            SyncPolicy::Always,
            4096,
            1,
            1,
            0,
            files,
            file,
            dir_file,
        );
        shared.marks.send_modify(|m| m.written = 1);
        shared
    }

    /// The file being synced is gone from the directory: a failure if the
    /// log still keeps it (someone else removed it), not if a snapshot let
    /// go of it (the log had moved on to the next file, and the snapshot
    /// holds its records). A reviewer's server stopped taking changes when
    /// a snapshot removed the file a sync had just begun on.
    #[test]
    fn a_sync_of_a_removed_file_fails_only_if_the_log_still_keeps_it() {
        for kept in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let shared = log_in(dir.path(), kept);
            fs::remove_file(log_path(dir.path(), 1)).unwrap();
            assert_eq!(shared.sync().is_err(), kept, "kept: {kept}");
            let marks = shared.marks.borrow().clone();
            assert_eq!(marks.failed.is_some(), kept, "kept: {kept}");
            assert_eq!(marks.synced, if kept { 0 } else { 1 }, "kept: {kept}");
        }
    }

    /// Queues records 1 and 2 at the start of log file 1, and record 3
    /// opening log file 2 in a spare; `gone` removes the spare's name
    /// (its rename then fails) or log file 1's.
    fn begin_with(dir: &std::path::Path, gone: Option<&str>) -> Shared {
        let shared = log_in(dir, true);
        let path = dir.join("spare.1");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        {
            let mut b = shared.lock();
            b.next_seq = 4;
            let chunk = |number, first, opens| Chunk {
                number,
                offset: 0,
                bytes: b"records".to_vec(),
                first,
                opens,
                head: None,
            };
            b.chunks.push(chunk(1, 1, None));
            b.chunks.push(chunk(2, 3, Some(Spare { path, file })));
        }
        if let Some(gone) = gone {
            fs::remove_file(dir.join(gone)).unwrap();
        }
        shared
    }

    /// A begun log file's records are synced, and its name is on disk,
    /// before the write is over: they are answered then, with no sync
    /// after it.
    #[test]
    fn records_in_a_new_log_file_are_safe_once_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let shared = begin_with(dir.path(), None);
        assert!(shared.flush());
        let marks = shared.marks.borrow().clone();
        assert!(marks.failed.is_none());
        assert_eq!((marks.written, marks.synced), (3, 3));
        assert!(log_path(dir.path(), 2).exists());
    }

    /// Beginning a new log file takes three syncs after the old file's;
    /// the records in the old file are answered as safe once it is synced,
    /// not after those, nor never if the new file cannot be begun.
    #[test]
    fn records_before_a_new_log_file_are_safe_once_the_old_file_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let shared = begin_with(dir.path(), Some("spare.1"));
        assert!(!shared.flush(), "the new file cannot be named");
        let marks = shared.marks.borrow().clone();
        assert!(marks.failed.is_some_and(|why| why.contains("rename")));
        assert_eq!(marks.synced, 2);
    }

    /// But not if the old file was removed from the directory meanwhile:
    /// then nothing written to it is answered as safe, even once the new
    /// file is synced.
    #[test]
    fn records_in_a_log_file_removed_before_a_new_one_began_are_not_answered() {
        let dir = tempfile::tempdir().unwrap();
        let shared = begin_with(dir.path(), Some(&format!("log.{:016x}", 1)));
        assert!(shared.flush());
        assert!(shared.sync().is_err());
        let marks = shared.marks.borrow().clone();
        assert!(marks.failed.is_some_and(|why| why.contains("removed")));
        assert_eq!(marks.synced, 0);
    }
}
