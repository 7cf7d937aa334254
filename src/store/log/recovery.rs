//! Recovery: the newest snapshot, then the log after it, into the state.
//!
//! The rules:
//! * every record's checksum is checked, and its number must be the one
//!   before plus one, across files; every file's header is checked (magic,
//!   format version, number), and the log files must follow each other with
//!   no number missing;
//! * a torn tail (the newest file's last record cut short or failing its
//!   checksum, with nothing valid after it, or only records written after
//!   the last sync, which a crash may leave in any order) is cut off with a
//!   warning, and everything before it is served;
//! * past the last record of an older file, a file recycled as a spare
//!   keeps its old records' remains: when the next file begins with the
//!   record that was next, nothing is missing and they are not damage;
//! * damage anywhere else stops the start with a message naming the file and
//!   the offset; with `salvage` the damaged records are skipped instead (the
//!   next valid record is searched for), and how many were lost is said.
//!
//! A body is only ever served from a record whose checksum matched.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::files::{HEADER, Kind, Listing, VERSION, read_header};
use super::record::{Bad, Frame, Item, decode};
use crate::store::memory::State;
use crate::store::memory::replay::Applied;

/// What recovery found, for the writer to go on from.
pub struct Recovered {
    /// The number the next record gets.
    pub next_seq: u64,
    /// The number after the last record found in the log: `next_seq`,
    /// unless the log ends before the snapshot begins.
    pub log_end: u64,
    /// The newest log file's number, the file, and the bytes in use in it
    /// (`None` if there is none yet).
    pub current: Option<(u64, File, u64)>,
    /// Each log file's number and first record.
    pub files: BTreeMap<u64, u64>,
    /// The snapshot used, if any: its size.
    pub snapshot_bytes: u64,
    /// Bytes of log records replayed after the snapshot.
    pub replayed_bytes: u64,
    /// Records replayed from the snapshot and the log.
    pub records: u64,
    /// Records skipped as damaged (only with salvage).
    pub skipped: u64,
    /// Log files wholly before the snapshot, left by a compaction cut
    /// short: needless, to be removed once the start has succeeded.
    pub leftovers: Vec<PathBuf>,
}

/// Where a damaged record was, and what was wrong.
fn damage(path: &Path, offset: usize, why: &str) -> String {
    format!(
        "{} is damaged at offset {offset}: {why}. delayq will not start on a damaged log \
         (jobs could be missing); start it with --salvage to skip the damaged records \
         and serve the rest",
        path.display()
    )
}

/// The first offset after `from` where a valid frame numbered `at_least` or
/// higher begins.
fn continuation(
    data: &[u8],
    version: u32,
    from: usize,
    at_least: u64,
) -> Option<(usize, Frame<'_>)> {
    (from..data.len()).find_map(|at| match decode(&data[at..], version) {
        Ok(f) if f.seq >= at_least => Some((at, f)),
        _ => None,
    })
}

/// Whether a valid record from `from` on, numbered `seq` or higher, was
/// written once record `seq` was synced (its stamp says so). Every such
/// record counts, not only the first: the records of one group share the
/// stamp of the sync before them, so the damaged record's own group says
/// nothing either way, and only a later group tells that it was synced.
fn synced_after(data: &[u8], version: u32, from: usize, seq: u64) -> bool {
    let mut at = from;
    while let Some((found, f)) = continuation(data, version, at, seq) {
        if f.stamp >= seq {
            return true;
        }
        at = found + f.len;
    }
    false
}

/// Replays the snapshot and log files of `listing` into `state`.
pub fn recover(listing: &Listing, state: &mut State, salvage: bool) -> Result<Recovered, String> {
    let mut out = Recovered {
        next_seq: 1,
        log_end: 1,
        current: None,
        files: BTreeMap::new(),
        snapshot_bytes: 0,
        replayed_bytes: 0,
        records: 0,
        skipped: 0,
        leftovers: Vec::new(),
    };
    let mut start = 1;
    let mut buf = Vec::new();
    if let Some((first, path)) = listing.snapshots.last() {
        start = *first;
        out.snapshot_bytes = load_snapshot(path, *first, state, salvage, &mut out)?;
    }
    out.next_seq = start;
    let mut headers = Vec::new();
    for (number, path) in &listing.logs {
        let mut head = [0u8; HEADER as usize];
        let read = File::open(path).and_then(|f| f.read_exact_at(&mut head, 0));
        let (n, first, version) = match read
            .map_err(|e| e.to_string())
            .and_then(|()| read_header(Kind::Log, &head))
        {
            Ok(h) => h,
            Err(why) => return Err(damage(path, 0, &format!("bad header ({why})"))),
        };
        if n != *number {
            return Err(damage(path, 0, &format!("its header says it is file {n}")));
        }
        headers.push((n, first, version, path.clone()));
    }
    // The files to replay: from the last one that begins at or before the
    // snapshot's start (older ones are leftovers of a compaction cut short).
    let from = headers.iter().rposition(|&(_, first, _, _)| first <= start);
    let replay = match from {
        Some(i) => {
            out.leftovers = headers[..i].iter().map(|h| h.3.clone()).collect();
            &headers[i..]
        }
        None => &headers[..],
    };
    if let Some(&(_, first, _, ref path)) = replay.first()
        && first > start
    {
        let why = format!("records {start} to {} are missing before it", first - 1);
        if !salvage {
            return Err(damage(path, 0, &why));
        }
        warn!(file = %path.display(), "{why}; skipped (--salvage)");
        out.skipped += first - start;
    }
    for (i, (number, first, version, path)) in replay.iter().enumerate() {
        if i > 0 {
            let before = replay[i - 1].0;
            if *number != before + 1 {
                let why = format!("log files {} to {} are missing", before + 1, number - 1);
                if !salvage {
                    return Err(damage(path, 0, &why));
                }
                warn!("{why}; going on (--salvage)");
            }
        }
        if i == 0 {
            out.next_seq = *first;
        } else if *first != out.next_seq {
            let why = format!(
                "it begins at record {first} where record {} was next",
                out.next_seq
            );
            if !salvage || *first < out.next_seq {
                return Err(damage(path, 0, &why));
            }
            warn!(file = %path.display(), "{why}; skipped the missing records (--salvage)");
            out.skipped += first - out.next_seq;
            out.next_seq = *first;
        }
        out.files.insert(*number, *first);
        let newest = i + 1 == replay.len();
        let next_first = replay.get(i + 1).map(|&(_, first, _, _)| first);
        let used = replay_file(
            path, *version, newest, next_first, start, state, salvage, &mut out, &mut buf,
        )?;
        // A file of an older format is read, never appended to: the next
        // records begin a new file.
        if newest && *version == VERSION {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            out.current = Some((*number, file, used));
        }
    }
    out.log_end = out.next_seq;
    if out.next_seq < start {
        // The log ends before the snapshot begins: the records in between
        // never reached the disk (the server stopped after the snapshot was
        // in place, before the log caught up), and the snapshot holds their
        // changes. Numbering goes on from the snapshot's start, in a new
        // file; from where the log ends, the next start would take every
        // record below the snapshot's start for one the snapshot holds, and
        // skip it.
        warn!(
            log_ends = out.next_seq - 1,
            snapshot_starts = start,
            "the log ends before the snapshot begins; the snapshot holds what is between"
        );
        out.next_seq = start;
        out.current = None;
    }
    Ok(out)
}

/// Replays one log file; returns the offset its data ends at.
#[allow(clippy::too_many_arguments)]
fn replay_file(
    path: &PathBuf,
    version: u32,
    newest: bool,
    next_first: Option<u64>,
    start: u64,
    state: &mut State,
    salvage: bool,
    out: &mut Recovered,
    buf: &mut Vec<u8>,
) -> Result<u64, String> {
    // One buffer for every file: a fresh one per file would leave the heap
    // scattered with file-sized holes after the start.
    buf.clear();
    File::open(path)
        .and_then(|mut f| std::io::Read::read_to_end(&mut f, buf))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let data = &buf[..];
    let mut at = HEADER as usize;
    loop {
        let why = match decode(&data[at..], version) {
            Ok(f) if f.seq == out.next_seq => {
                if f.seq >= start {
                    let Item::Record(record) = f.item else {
                        return Err(damage(path, at, "a snapshot's end in a log file"));
                    };
                    if state.apply(record) == Applied::Invalid {
                        return Err(damage(path, at, "a record naming an invalid tube or id"));
                    }
                    out.records += 1;
                    out.replayed_bytes += f.len as u64;
                }
                out.next_seq += 1;
                at += f.len;
                continue;
            }
            // A record of the file's life before it was recycled.
            Ok(f) if f.seq < out.next_seq => return Ok(at as u64),
            Ok(f) => format!("record {} where record {} was next", f.seq, out.next_seq),
            // Zeros to the end of the file: the unused rest of a
            // preallocated file.
            Err(Bad::End) if data[at..].iter().all(|&b| b == 0) => return Ok(at as u64),
            // Zeros where a record should begin, with bytes after them: a
            // block that never reached the disk, or one zeroed since. It is
            // the end of the data only if nothing synced follows it, which
            // the stamps of what follows tell, as for any other hole.
            Err(Bad::End) => "zeros where a record should begin, with data after them".to_string(),
            Err(bad) => bad.describe().to_string(),
        };
        let next = continuation(data, version, at + 1, out.next_seq);
        // A file recycled from an old one keeps the old records' remains
        // past the end of its own: when the next file begins with the very
        // record this one was to have next, nothing is missing and those
        // bytes are that unused end, not damage.
        if next.is_none() && next_first == Some(out.next_seq) {
            return Ok(at as u64);
        }
        if newest && !synced_after(data, version, at + 1, out.next_seq) {
            warn!(
                file = %path.display(), offset = at, reason = %why,
                "cut off a torn tail of the log (what a crash mid-write leaves); \
                 everything before it is served"
            );
            zero_from(path, at as u64, data.len() as u64)?;
            return Ok(at as u64);
        }
        if !salvage {
            return Err(damage(path, at, &why));
        }
        match next {
            Some((to, f)) => {
                warn!(
                    file = %path.display(), offset = at, reason = %why,
                    lost = f.seq - out.next_seq, "skipped damaged records (--salvage)"
                );
                out.skipped += f.seq - out.next_seq;
                out.next_seq = f.seq;
                at = to;
            }
            None => {
                warn!(file = %path.display(), offset = at, reason = %why,
                    "skipped the damaged rest of a log file (--salvage)");
                return Ok(data.len() as u64);
            }
        }
    }
}

/// Overwrites a cut-off tail with zeros, synced, so that what is written
/// there next is not read together with the remains of the torn record.
fn zero_from(path: &Path, from: u64, to: u64) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot clear the torn tail of {}: {e}", path.display());
    let file = OpenOptions::new().write(true).open(path).map_err(fail)?;
    let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at).map_err(fail)?;
        at += n as u64;
    }
    file.sync_data().map_err(fail)
}

/// Loads a snapshot; returns its size.
fn load_snapshot(
    path: &Path,
    start: u64,
    state: &mut State,
    salvage: bool,
    out: &mut Recovered,
) -> Result<u64, String> {
    let data = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let version = match read_header(Kind::Snapshot, &data) {
        Ok((s, _, version)) if s == start => version,
        Ok((s, _, _)) => {
            return Err(damage(
                path,
                0,
                &format!("its header says it starts at {s}"),
            ));
        }
        Err(why) => return Err(damage(path, 0, &format!("bad header ({why})"))),
    };
    let mut at = HEADER as usize;
    let mut expected = 1;
    loop {
        let why = match decode(&data[at..], version) {
            Ok(f) if f.seq == expected => match f.item {
                Item::End(count) if count + 1 == expected => {
                    info!(file = %path.display(), records = count, "snapshot loaded");
                    return Ok(data.len() as u64);
                }
                Item::End(_) => "a count at its end that does not match".to_string(),
                Item::Record(record) => {
                    if state.apply(record) == Applied::Invalid {
                        "a record naming an invalid tube or id".to_string()
                    } else {
                        out.records += 1;
                        expected += 1;
                        at += f.len;
                        continue;
                    }
                }
            },
            Ok(f) => format!("record {} where record {expected} was next", f.seq),
            Err(Bad::End) => "no end: it was cut short".to_string(),
            Err(bad) => bad.describe().to_string(),
        };
        if !salvage {
            return Err(damage(path, at, &why));
        }
        match continuation(&data, version, at + 1, expected) {
            Some((to, f)) => {
                warn!(file = %path.display(), offset = at, reason = %why,
                    lost = f.seq - expected, "skipped damaged snapshot records (--salvage)");
                out.skipped += f.seq - expected;
                expected = f.seq;
                at = to;
            }
            None => {
                warn!(file = %path.display(), offset = at, reason = %why,
                    "skipped the damaged rest of a snapshot (--salvage)");
                return Ok(data.len() as u64);
            }
        }
    }
}
