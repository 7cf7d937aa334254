//! The keeper thread: keeps a spare log file prepared, and compacts the log.
//!
//! Compaction is a snapshot: every live job, read a few at a time from the
//! state (a lock held for a few hundred jobs, never for all of them), is
//! written to a new file, which is synced and renamed into place, the
//! directory synced; only then do the log files wholly before the
//! snapshot's start go (recycled as spares, or removed). Records written
//! while the snapshot was being read are replayed on top of it at recovery
//! (see `store/memory/replay.rs`), so commands never wait for it.
//!
//! It runs when a new log file begins and the bytes held for jobs that no
//! longer exist (the garbage) are at least the live jobs' bytes and half a
//! file (see `append`): the directory then holds the live jobs plus at most
//! as much again, and a restart reads little more than the live jobs.
//!
//! When the disk is full, preparing a spare fails: puts are refused (the
//! writer finds no room), the keeper says so once a second, and tries again
//! until it succeeds, so puts come back by themselves once there is room.
//!
//! A disk that the log itself filled has room only in the log files the
//! next snapshot would free, and a snapshot needs room first. So a file is
//! kept prepared for it (`snapshot-room`, its blocks allocated, taken before
//! any spare): a snapshot that fits is written into it, and the room is
//! prepared again once the snapshot has freed the old files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::append::{spares_kept, spares_needed};
use super::files::{HEADER, Kind, header, log_path, prepare_spare, snapshot_path};
use super::record::{encode, encode_end};
use super::writer::{Buf, Shared, Spare, wait_while};
use crate::store::memory::journal::Record;

/// How long the keeper waits before trying again after a failure.
const RETRY: Duration = Duration::from_secs(1);
/// How often the same reason for failing compactions is said again.
const QUIET: Duration = Duration::from_secs(60);
/// Jobs read per lock of the state while taking a snapshot.
const DUMP_BATCH: usize = 256;
/// The file kept prepared for a snapshot (see the module's doc).
const ROOM: &str = "snapshot-room";
/// Its size at most: a snapshot of the few jobs left once a full disk's
/// jobs are deleted fits (about 3,000 jobs of 100 bytes).
const ROOM_SIZE: u64 = 512 << 10;

/// The engine's state, as the keeper reads it for a snapshot.
pub trait Source: Send + Sync + 'static {
    /// Runs `f` with the state locked, so that no transition is half done
    /// (its record appended but its change not made, or the reverse).
    fn locked(&self, f: &mut dyn FnMut());
    /// Hands `out` up to `max` jobs from slot `from` on; returns where to go
    /// on, or `None` at the end.
    fn dump(&self, from: usize, max: usize, out: &mut dyn FnMut(Record<'_>)) -> Option<usize>;
    /// Hands `out` the records a snapshot ends with.
    fn dump_rest(&self, out: &mut dyn FnMut(Record<'_>));
}

/// What the keeper carries from one chore to the next.
struct Keeper {
    /// The number the next spare's name gets.
    next_spare: u64,
    /// When it last said that it cannot prepare a spare.
    complained: Option<Instant>,
    /// When it last said why a compaction failed, the reason, and how
    /// many failed for it since.
    compaction_failed: Option<(Instant, String, u64)>,
    /// The room kept for a snapshot, if it is prepared.
    room: Option<File>,
    /// The last snapshot, written into a new file, failed: the next goes
    /// into the room (the disk may have filled).
    room_next: bool,
}

impl Keeper {
    /// Says why a compaction failed: at once for a new reason, and once a
    /// minute for the same one (a file-size limit below the snapshot's
    /// size fails every try, every second or two).
    fn compaction_failed(&mut self, e: &io::Error) {
        let why = e.to_string();
        match &mut self.compaction_failed {
            Some((at, said, since)) if *said == why && at.elapsed() < QUIET => *since += 1,
            last => {
                let again = last.as_ref().map_or(0, |(_, _, since)| *since);
                warn!(error = %why, failed_since_last_said = again, "compaction failed; trying again later");
                *last = Some((Instant::now(), why, 0));
            }
        }
    }

    /// Whether a spare is wanted: fewer are prepared than the live jobs'
    /// deletes need, or a change was refused for want of one.
    fn spare_wanted(b: &Buf, file_size: u64) -> bool {
        (b.spares.len() < spares_needed(b, file_size) || b.room_wanted) && b.failed.is_none()
    }

    /// Whether to prepare a spare in the middle of a snapshot: one is
    /// wanted, and none failed for want of disk (the snapshot may be what
    /// frees room).
    fn spare_to_prepare(b: &Buf, file_size: u64) -> bool {
        Keeper::spare_wanted(b, file_size) && !b.short_of_disk
    }

    /// The size of the room kept for a snapshot.
    fn room_size(shared: &Shared) -> u64 {
        shared.file_size.min(ROOM_SIZE)
    }

    /// Prepares the room kept for a snapshot if it is not; quietly, as a
    /// full disk is said by the spares.
    fn keep_room(&mut self, shared: &Shared) {
        if self.room.is_none() {
            let path = shared.dir.join(ROOM);
            self.room = prepare_spare(&path, Keeper::room_size(shared)).ok();
        }
    }

    /// Prepares a spare; false if it could not (the disk is full, or
    /// another error), which it says once a second.
    fn prepare(&mut self, shared: &Shared) -> bool {
        let path = shared.dir.join(format!("spare.{}", self.next_spare));
        self.next_spare += 1;
        match prepare_spare(&path, shared.file_size) {
            Ok(file) => {
                {
                    let mut b = shared.lock();
                    b.spares.push_back(Spare { path, file });
                    b.room_wanted = false;
                    b.short_of_disk = false;
                }
                shared.room.notify_waiters();
                if self.complained.take().is_some() {
                    info!("room on disk again: the next log file is ready");
                }
                true
            }
            Err(e) => {
                shared.lock().short_of_disk = true;
                // Those waiting for room answer OUT_OF_MEMORY now.
                shared.room.notify_waiters();
                if self.complained.is_none_or(|at| at.elapsed() >= RETRY) {
                    self.complained = Some(Instant::now());
                    warn!(
                        dir = %shared.dir.display(), error = %e,
                        "cannot prepare the next log file: puts answer OUT_OF_MEMORY \
                         once the room left is needed for deletes; retrying every second"
                    );
                }
                // The old files a snapshot would free may be the room.
                shared.lock().compact = true;
                false
            }
        }
    }
}

/// Runs the keeper until the log stops.
pub fn run(shared: Arc<Shared>, source: Arc<dyn Source>, next_spare: u64) {
    // A room left by the last run is kept as it is.
    let room = OpenOptions::new()
        .read(true)
        .write(true)
        .open(shared.dir.join(ROOM))
        .ok()
        .filter(|f| {
            f.metadata()
                .is_ok_and(|m| m.len() >= Keeper::room_size(&shared))
        });
    let mut keeper = Keeper {
        next_spare,
        complained: None,
        compaction_failed: None,
        room,
        room_next: false,
    };
    loop {
        let (want_spare, want_snapshot) = {
            let mut b = shared.lock();
            loop {
                if b.stopping {
                    return;
                }
                let want_spare = Keeper::spare_wanted(&b, shared.file_size);
                if want_spare || b.compact {
                    break (want_spare, b.compact);
                }
                b = shared
                    .chores
                    .wait(b)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        // Before any spare: on a disk short of room, the snapshot's room
        // is what lets a snapshot free the rest.
        keeper.keep_room(&shared);
        let no_spare = want_spare && !keeper.prepare(&shared);
        let mut failed = no_spare;
        if want_snapshot {
            shared.lock().compact = false;
            match snapshot(&shared, source.as_ref(), &mut keeper) {
                Ok(()) => keeper.compaction_failed = None,
                Err(e) => {
                    failed = true;
                    // Short of disk, the line about the spare says it
                    // once a second already.
                    if !no_spare {
                        keeper.compaction_failed(&e);
                    }
                }
            }
        }
        if failed {
            // The whole second: every change refused for want of room asks
            // for a spare and wakes this thread, which would otherwise try
            // the full disk again (and fail a snapshot, and say so) at
            // every change.
            let b = wait_while(&shared.chores, shared.lock(), Instant::now() + RETRY, |b| {
                !b.stopping
            });
            if b.stopping {
                return;
            }
        }
    }
}

/// Takes a snapshot, then lets go of what it makes needless.
fn snapshot(shared: &Shared, source: &dyn Source, keeper: &mut Keeper) -> io::Result<()> {
    let mut start = (0, 0, 0);
    source.locked(&mut || {
        let b = shared.lock();
        start = (b.next_seq, b.appended, b.rest_gone);
    });
    let (start, appended_at_start, gone_at_start) = start;
    let tmp = shared.dir.join("snapshot.tmp");
    // Into the room kept for it when the disk may be full (a spare could
    // not be prepared, or the last snapshot failed), if the live jobs fit
    // with a margin (a snapshot's records are about as large as their put
    // records): its blocks are allocated, so a full disk does not stop it.
    // Else into a new file, and the room stays for a later one. Not the
    // room every time: the snapshot ends where its records do, so the rest
    // of the room was cut off (which a file system mounted with `discard`
    // sends to the disk as a discard) and a new room zero-filled, about
    // 1 MiB of work for the disk at every compaction, in front of the log's
    // syncs; a new file costs only the snapshot's own bytes.
    let use_room = {
        let b = shared.lock();
        (b.short_of_disk || keeper.room_next)
            && b.live_bytes + b.rest_bytes + (64 << 10) <= Keeper::room_size(shared)
    };
    let file = match keeper.room.take() {
        Some(room) if use_room => {
            fs::rename(shared.dir.join(ROOM), &tmp)?;
            room
        }
        room => {
            keeper.room = room;
            File::create(&tmp).inspect_err(|_| keeper.room_next = true)?
        }
    };
    // A snapshot of many jobs takes a while, and the puts meanwhile may
    // use up the prepared room: spares are prepared between its batches
    // (and while it syncs), so that they are not refused for want of one
    // while the disk has room.
    let written = write_snapshot(file, start, source, &mut || {
        let wanted = Keeper::spare_to_prepare(&shared.lock(), shared.file_size);
        if wanted {
            keeper.prepare(shared);
        }
    });
    let written = written.and_then(|(file, done)| {
        sync_preparing(shared, keeper, &file)?;
        Ok(done)
    });
    let (records, bytes, rest) = match written {
        Ok(done) => done,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            keeper.room_next = !use_room;
            return Err(e);
        }
    };
    keeper.room_next = false;
    // Every record before the start goes to the log files first (with -f
    // or -F some may still wait in memory): a file the snapshot frees is
    // then on disk under its name to be removed, not still a spare that a
    // pending write would make it later, untracked; and a process killed
    // from here on leaves the log reaching the snapshot's start.
    if shared.flush() {
        // Under the default policy the records just written wait for the
        // writer thread's sync. Told under the buffer's lock, which the
        // writer holds from its look at the marks until it sleeps: it has
        // then either seen them or is asleep to be woken.
        let _b = shared.lock();
        shared.wake.notify_all();
    }
    fs::rename(&tmp, snapshot_path(&shared.dir, start))?;
    shared.dir_file.sync_all()?;
    shared
        .records_migrated
        .fetch_add(records, Ordering::Relaxed);
    // The snapshot is safe: older snapshots and the log files wholly
    // before its start are needless now.
    let (old_files, keep_spares) = {
        let mut b = shared.lock();
        b.snapshot_at = appended_at_start;
        b.snapshot_bytes = bytes;
        // Less what went while it was written, which it may hold.
        b.rest_bytes = rest.saturating_sub(b.rest_gone - gone_at_start);
        let current = b.number;
        let mut old = Vec::new();
        let numbers: Vec<(u64, u64)> = b.files.iter().map(|(&n, &f)| (n, f)).collect();
        for pair in numbers.windows(2) {
            let ((n, _), (_, next_first)) = (pair[0], pair[1]);
            if next_first <= start && n != current {
                old.push(n);
            }
        }
        for n in &old {
            b.files.remove(n);
        }
        (
            old,
            spares_kept(&b, shared.file_size).saturating_sub(b.spares.len()),
        )
    };
    let mut recycled = Vec::new();
    for (i, n) in old_files.iter().enumerate() {
        let path = log_path(&shared.dir, *n);
        if i < keep_spares {
            let spare = shared.dir.join(format!("spare.{}", keeper.next_spare));
            keeper.next_spare += 1;
            fs::rename(&path, &spare)?;
            recycled.push(spare);
        } else {
            fs::remove_file(&path)?;
        }
    }
    for entry in fs::read_dir(&shared.dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(hex) = name.strip_prefix("snapshot.")
            && u64::from_str_radix(hex, 16).is_ok_and(|s| s < start)
        {
            fs::remove_file(&path)?;
        }
    }
    shared.dir_file.sync_all()?;
    keeper.keep_room(shared);
    for path in recycled {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        shared.lock().spares.push_back(Spare { path, file });
        shared.room.notify_waiters();
    }
    Ok(())
}

/// Syncs the snapshot `file` on a thread of its own, and meanwhile
/// prepares the spares that are wanted: the sync of a large snapshot can
/// take seconds, longer than a put waits for room.
fn sync_preparing(shared: &Shared, keeper: &mut Keeper, file: &File) -> io::Result<()> {
    let synced = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let syncing = scope.spawn(|| {
            let done = file.sync_all();
            // Said under the buffer's lock, under which the keeper looks
            // before it sleeps.
            let _b = shared.lock();
            synced.store(true, Ordering::Release);
            shared.chores.notify_all();
            done
        });
        loop {
            let mut b = shared.lock();
            while !synced.load(Ordering::Acquire)
                && !b.stopping
                && !Keeper::spare_to_prepare(&b, shared.file_size)
            {
                b = shared
                    .chores
                    .wait(b)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if synced.load(Ordering::Acquire) || b.stopping {
                break;
            }
            drop(b);
            keeper.prepare(shared);
        }
        syncing
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the snapshot's sync panicked")))
    })
}

/// Writes every job and what follows them into `file`, not yet synced;
/// returns the file, and how many records and bytes it holds. `between`
/// runs after each batch.
fn write_snapshot(
    file: File,
    start: u64,
    source: &dyn Source,
    between: &mut dyn FnMut(),
) -> io::Result<(File, (u64, u64, u64))> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    out.write_all(&header(Kind::Snapshot, start, 0))?;
    let mut bytes = HEADER;
    let mut count = 0u64;
    let mut scratch = Vec::new();
    let mut from = Some(0);
    while let Some(at) = from {
        scratch.clear();
        from = source.dump(at, DUMP_BATCH, &mut |r| {
            count += 1;
            encode(&mut scratch, count, 0, &r);
        });
        out.write_all(&scratch)?;
        bytes += scratch.len() as u64;
        between();
    }
    scratch.clear();
    source.dump_rest(&mut |r| {
        count += 1;
        encode(&mut scratch, count, 0, &r);
    });
    let rest = scratch.len() as u64;
    encode_end(&mut scratch, count + 1, count);
    out.write_all(&scratch)?;
    bytes += scratch.len() as u64;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    // A snapshot written into the room ends where its records do.
    file.set_len(bytes)?;
    Ok((file, (count, bytes, rest)))
}
