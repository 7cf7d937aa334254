//! Appending: the engine's journal for one transition, which takes each
//! record into the shared buffer while the state is locked, after checking
//! there is room for it.
//!
//! Room is accounted for before a record is taken: records go into log files
//! prepared ahead (their blocks allocated), so a write never runs out of
//! room; a put is taken only if, after it, the room left still covers a
//! delete record for every live job (deletes are never refused); when the
//! prepared room runs short, the change is refused here, asks the keeper
//! (`keeper.rs`) for more, and is tried again once it has prepared it
//! (`Wal::wait_for_room`); only when the keeper cannot (a full disk) is the
//! refusal the answer.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::files::{HEADER, Head, Kind, header};
use super::record::{DELETE_LEN, encode_sized, encoded_len, weight};
use super::writer::{Buf, Chunk, Shared};
use crate::error::{StoreError, StoreResult};
use crate::store::memory::journal::{JobImage, Journal, Record, Written};

/// Room the live jobs keep for their deletes: a delete record each, and as
/// the deletes would fill several files, each file's unused end (a record
/// never straddles two files, so at most a delete record's worth a file).
pub(super) fn promised(live_jobs: u64, file_size: u64) -> u64 {
    let deletes = live_jobs * DELETE_LEN as u64;
    let files = deletes / (file_size - HEADER) + 1;
    deletes + files * DELETE_LEN as u64 + 4096
}

/// How many spare files should be ready: enough that the prepared room
/// covers the live jobs' deletes and a whole file more for new records, so
/// that puts find room prepared ahead however many jobs are live (a queue
/// of a million jobs keeps a few dozen megabytes ready for its deletes).
pub(super) fn spares_needed(b: &Buf, file_size: u64) -> usize {
    let per_file = file_size - HEADER;
    let left = file_size.saturating_sub(b.used);
    let wanted = promised(b.live_jobs, file_size) + per_file;
    (wanted.saturating_sub(left).div_ceil(per_file) as usize).max(1)
}

/// How many spare files to keep of those a snapshot frees (and of those
/// found at start): one more than are needed now, because near its end a
/// log file needs two (the live jobs' deletes no longer fit in what is
/// left of it). With none more kept, the keeper zero-filled a new spare
/// then (2 MiB written and synced), and the snapshot after the next begin
/// removed the file it freed, which on a file system mounted with
/// `discard` also sends the disk a discard of 2 MiB: each held up the log's
/// syncs queued behind it for about a millisecond. With one more kept, and
/// a small queue compacted at every begin (see `append`), the files go
/// round: the file a begin ends is freed by the snapshot that follows and
/// becomes a spare, and in the cycle benchmark's steady state the keeper
/// neither zero-fills nor removes a log file (`perf` on the block layer's
/// requests, 3 s: none, against 16 writes of 1 MiB and 12 discards of up
/// to 2 MiB before). It costs the directory a file: 6.68 MiB after the
/// `disk` workload's 300,000 put/delete cycles, against 4.68.
pub(super) fn spares_kept(b: &Buf, file_size: u64) -> usize {
    spares_needed(b, file_size) + 1
}

/// Whether a record of `len` bytes fits in the room prepared (what is left
/// of the current file and the spares) with the live jobs' deletes still
/// covered, counting one more live job for a put.
fn fits(b: &Buf, file_size: u64, len: u64, put: bool) -> bool {
    let left = file_size.saturating_sub(b.used);
    let switch = len > left;
    if switch && b.spares.is_empty() {
        return false;
    }
    let room = left + b.spares.len() as u64 * (file_size - HEADER);
    let cost = if switch { left + len } else { len };
    room >= cost + promised(b.live_jobs + u64::from(put), file_size)
}

/// Which rule a record is taken under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A new job: needs room for itself and for its delete.
    Put,
    /// A change that must be kept or not made.
    Keep,
    /// A change that may be skipped.
    Note,
    /// A delete: always taken.
    Forget,
}

/// The journal of one transition: holds the log's buffer while it lives.
pub struct Appender<'a> {
    buf: MutexGuard<'a, Buf>,
    shared: &'a Shared,
    wrote: bool,
}

impl<'a> Appender<'a> {
    /// Opens the journal for one transition.
    pub fn new(shared: &'a Shared) -> Appender<'a> {
        Appender {
            buf: shared.lock(),
            shared,
            wrote: false,
        }
    }

    fn append(&mut self, record: &Record<'_>, class: Class) -> StoreResult<()> {
        let shared = self.shared;
        let b = &mut *self.buf;
        if let Some(why) = &b.failed {
            return Err(StoreError::Unavailable(format!(
                "the log takes no changes: {why}"
            )));
        }
        let length = encoded_len(record);
        let len = length as u64;
        let size = shared.file_size;
        let switch = len > size.saturating_sub(b.used);
        if class != Class::Forget && !fits(b, size, len, class == Class::Put) {
            // The keeper prepares room ahead for what the live jobs need; a
            // burst can outrun it, so ask it for more.
            b.room_wanted = true;
            shared.chores.notify_one();
            return Err(StoreError::OutOfMemory);
        }
        if switch && let Some(spare) = b.spares.pop_front() {
            // The rest of this file stays unused; the next one begins.
            b.number += 1;
            b.used = HEADER;
            b.files.insert(b.number, b.next_seq);
            let mut bytes = b.free.pop().unwrap_or_default();
            bytes.extend_from_slice(&header(Kind::Log, b.number, b.next_seq));
            b.chunks.push(Chunk {
                number: b.number,
                offset: 0,
                bytes,
                first: b.next_seq,
                opens: Some(spare),
                head: Some(Head {
                    number: b.number,
                    next_key: b.next_key,
                    file_size: size,
                }),
            });
            // Compact once the dead records outweigh both the live ones (so
            // the work is paid for by as many writes as it copies) and half
            // a file. A small queue is then compacted at every begin, so
            // that the file just ended is freed at once and becomes the
            // next spare (see `spares_kept`); with a whole file, as until
            // 2026-12-07, it was compacted at every other begin, freeing
            // two files where only one spare was wanted. The state that is
            // not jobs is live too: counted as dead, a million held client
            // ids made every new file begin a snapshot of them all (a
            // reviewer's put/delete pairs each wrote 6.5 KB).
            let live = b.live_bytes + b.rest_bytes;
            let garbage = (b.appended - b.snapshot_at + b.snapshot_bytes).saturating_sub(live);
            if garbage >= live.max(size / 2) {
                b.compact = true;
            }
            shared.chores.notify_one();
        }
        // (A delete finding no spare goes past the file's nominal end: the
        // room set aside for it is counted against the prepared files, and
        // this is the last resort that keeps deletes from ever failing.)
        if b.chunks.last().is_none_or(|c| c.number != b.number) {
            let bytes = b.free.pop().unwrap_or_default();
            b.chunks.push(Chunk {
                number: b.number,
                offset: b.used,
                bytes,
                first: b.next_seq,
                opens: None,
                head: None,
            });
        }
        let seq = b.next_seq;
        b.next_seq += 1;
        let stamp = shared.synced.load(Ordering::Acquire);
        let chunk = b.chunks.last_mut().expect("a chunk for this file");
        encode_sized(&mut chunk.bytes, seq, stamp, record, length);
        // With -f or -F, into the kernel at once through the mapped file (see
        // `writer::Mapped`), if every record before it is there already.
        if b.in_kernel + 1 == seq
            && let Some(map) = b.map.as_mut().filter(|m| m.number == b.number)
            && map.put(b.used, &chunk.bytes[chunk.bytes.len() - length..])
        {
            b.in_kernel = seq;
            shared.in_kernel.store(seq, Ordering::Release);
        }
        b.used += len;
        b.appended += len;
        if let (Class::Put, Record::Job(job)) = (class, record) {
            if job.meta.key > b.next_key {
                // An import that kept a server id beyond the sequence. Should
                // its record be lost from the end of the log, a start would
                // number from where the records left end, and past at most
                // one id a put record's room (see `recovery`): far short of
                // this id, which the importer holds. So the head file says
                // so before the record is synced.
                let chunk = b.chunks.last_mut().expect("a chunk for this file");
                chunk.head = Some(Head {
                    number: b.number,
                    next_key: job.meta.key + 1,
                    file_size: size,
                });
            }
            b.next_key = b.next_key.max(job.meta.key + 1);
            b.live_jobs += 1;
            b.live_bytes += weight(job) as u64;
            if b.spares.len() < spares_needed(b, size) {
                shared.chores.notify_one();
            }
        }
        self.wrote = true;
        Ok(())
    }
}

impl Journal for Appender<'_> {
    fn keep(&mut self, record: Record<'_>) -> StoreResult<()> {
        let class = match record {
            Record::Job(_) => Class::Put,
            _ => Class::Keep,
        };
        self.append(&record, class)
    }

    fn note(&mut self, record: Record<'_>) {
        let _ = self.append(&record, Class::Note);
    }

    fn has_room_for(&mut self, record: &Record<'_>) -> bool {
        let b = &mut *self.buf;
        // A failed log takes nothing: nothing to wait for.
        if b.failed.is_some()
            || fits(
                b,
                self.shared.file_size,
                encoded_len(record) as u64 + 16,
                false,
            )
        {
            return true;
        }
        b.room_wanted = true;
        self.shared.chores.notify_one();
        false
    }

    fn let_go(&mut self, record: &Record<'_>) {
        // It may have been recorded since the last snapshot, and so not be
        // counted in the rest: then the rest is undercounted, which only
        // brings the next compaction sooner.
        let b = &mut *self.buf;
        let len = encoded_len(record) as u64;
        b.rest_bytes = b.rest_bytes.saturating_sub(len);
        b.rest_gone += len;
    }

    fn refusing(&self) -> Option<StoreError> {
        self.buf
            .failed
            .as_ref()
            .map(|why| StoreError::Unavailable(format!("the log takes no changes: {why}")))
    }

    fn forget(&mut self, job: &JobImage<'_>) {
        if self
            .append(&Record::Delete(job.meta.key), Class::Forget)
            .is_ok()
        {
            let b = &mut *self.buf;
            b.live_jobs = b.live_jobs.saturating_sub(1);
            b.live_bytes = b.live_bytes.saturating_sub(weight(job) as u64);
        }
    }
}

impl Written for Appender<'_> {
    fn written(&self) -> u64 {
        self.buf.next_seq - 1
    }
}

impl Drop for Appender<'_> {
    fn drop(&mut self) {
        let b = &mut *self.buf;
        if self.wrote && b.writer_idle {
            b.writer_idle = false;
            self.shared.wake.notify_one();
        }
    }
}
