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
//!   warning, and everything before it is served; records at or below the
//!   head file's synced mark were synced, whatever their stamps say;
//! * past the last record of an older file, a file recycled as a spare
//!   keeps its old records' remains: when the next file begins with the
//!   record that was next, nothing is missing and they are not damage;
//! * damage anywhere else stops the start with a message naming the file and
//!   the offset; with `salvage` the damaged records are skipped instead (the
//!   next valid record is searched for), and how many were lost is said;
//! * a file whose header is bad (or names another number) is damage too;
//!   with `salvage` it is skipped whole, its records lost, and set aside
//!   (renamed `*.damaged`) once the start succeeds;
//! * the head file (`files.rs`) names the newest log file begun: a newest
//!   file below it means the newest files are missing, which the series
//!   alone cannot show. With `salvage` the start goes on, and the server
//!   ids go on past any the lost files could have handed out.
//! * server ids go on past any that lost records could have handed out:
//!   records skipped, a tail cut off, and after a run that did not stop
//!   cleanly, whatever the rest of the newest file had room for.
//!
//! A body is only ever served from a record whose checksum matched.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::files::{HEAD_FILE, HEADER, Head, Kind, Listing, VERSION, read_header};
use super::record::{Bad, FRAME_HEAD, Frame, Item, decode};
use crate::store::memory::State;
use crate::store::memory::journal::Record;
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
    /// Files whose damaged rest was skipped (only with salvage): how many
    /// records it held cannot be told, so `skipped` does not count them.
    pub rests_skipped: u64,
    /// The bytes of those rests.
    pub bytes_skipped: u64,
    /// A torn tail was cut off the newest log file.
    pub tail_cut: bool,
    /// Log files wholly before the snapshot, and older snapshots, left by
    /// a compaction cut short: needless, to be removed once the start has
    /// succeeded.
    pub leftovers: Vec<PathBuf>,
    /// Files whose header is bad, skipped with salvage: to be set aside
    /// once the start has succeeded.
    pub damaged: Vec<PathBuf>,
    /// The head file names a log file that is not here (salvaged): it must
    /// be lowered before a log file of a number up to it is made, or the
    /// next start would take that file for the newest and miss the rest.
    pub head_lowered: bool,
    /// The start skipped damage (`--salvage`): the damaged files are to be
    /// compacted away at once, or the next start would refuse them again.
    pub salvaged: bool,
}

/// The fewest bytes a put's record takes (its frame, its kind and its
/// fixed-size creation time; the rest only adds): a log file of `size`
/// bytes holds fewer puts than `size / MIN_PUT`.
const MIN_PUT: u64 = FRAME_HEAD as u64 + 1 + 8;

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
/// `file_size` is the size new log files are made with: the newest file
/// may have been as large, should the head file not say.
pub fn recover(
    listing: &Listing,
    state: &mut State,
    salvage: bool,
    file_size: u64,
) -> Result<Recovered, String> {
    let mut out = Recovered {
        next_seq: 1,
        log_end: 1,
        current: None,
        files: BTreeMap::new(),
        snapshot_bytes: 0,
        replayed_bytes: 0,
        records: 0,
        skipped: 0,
        rests_skipped: 0,
        bytes_skipped: 0,
        tail_cut: false,
        leftovers: Vec::new(),
        damaged: Vec::new(),
        head_lowered: false,
        salvaged: false,
    };
    let head = match &listing.head {
        Some(Ok((head, _))) => Some(*head),
        Some(Err(why)) => {
            let why = format!("the head file is damaged ({why})");
            if !salvage {
                return Err(damage(&listing.dir.join(HEAD_FILE), 0, &why));
            }
            warn!(
                "{why}; going on without it (--salvage): missing newest log files cannot be told"
            );
            None
        }
        None => None,
    };
    let mut start = 1;
    let mut have_snapshot = false;
    let mut buf = Vec::new();
    if let Some((first, path)) = listing.snapshots.last() {
        match snapshot_header(path, *first) {
            Ok(()) => {
                start = *first;
                have_snapshot = true;
                out.snapshot_bytes = load_snapshot(path, *first, state, salvage, &mut out)?;
                // Older snapshots are left by a stop between the naming of
                // this one and their removal: needless, as the log files
                // wholly before it are (a reviewer's kills near compactions
                // left two of 10.6 MB for hundreds of thousands of changes).
                let older = &listing.snapshots[..listing.snapshots.len() - 1];
                out.leftovers.extend(older.iter().map(|(_, p)| p.clone()));
            }
            Err(why) if salvage => {
                warn!(file = %path.display(), "{why}: skipped whole, its jobs are lost (--salvage)");
                out.damaged.push(path.clone());
            }
            Err(why) => return Err(damage(path, 0, &why)),
        }
    }
    out.next_seq = start;
    let mut headers = Vec::new();
    for (number, path) in &listing.logs {
        let mut head = [0u8; HEADER as usize];
        let read = File::open(path).and_then(|f| f.read_exact_at(&mut head, 0));
        let checked = read
            .map_err(|e| format!("bad header ({e})"))
            .and_then(|()| {
                read_header(Kind::Log, &head).map_err(|why| format!("bad header ({why})"))
            })
            .and_then(|(n, first, version)| match (n == *number, first) {
                (false, _) => Err(format!("its header says it is file {n}")),
                // Records are numbered from 1.
                (true, 0) => Err("its header says it begins at record 0".to_string()),
                (true, _) => Ok((n, first, version)),
            });
        match checked {
            Ok((n, first, version)) => headers.push((n, first, version, path.clone())),
            Err(why) if salvage => {
                warn!(
                    file = %path.display(),
                    "{why}: skipped whole, its records are lost; set aside as *.damaged (--salvage)"
                );
                out.damaged.push(path.clone());
            }
            Err(why) => return Err(damage(path, 0, &why)),
        }
    }
    // The files to replay: from the last one that begins at or before the
    // snapshot's start (older ones are leftovers of a compaction cut short,
    // removed once the start has succeeded). Without a snapshot there are
    // none: a later file that says it begins at or before the first record
    // has a damaged header, and taken at its word it would have the files
    // before it, and every job in them, removed as leftovers.
    let from = loop {
        let from = headers.iter().rposition(|&(_, first, _, _)| first <= start);
        let Some(i) = from.filter(|&i| i > 0 && !have_snapshot) else {
            break from;
        };
        let (_, first, _, ref path) = headers[i];
        let why = format!(
            "it begins at record {first}, though log file {} before it begins at record {} \
             and there is no snapshot",
            log_name(headers[0].0),
            headers[0].1
        );
        if !salvage {
            return Err(damage(path, 0, &why));
        }
        warn!(
            file = %path.display(),
            "{why}: skipped whole, its records are lost; set aside as *.damaged (--salvage)"
        );
        out.damaged.push(path.clone());
        headers.remove(i);
    };
    // Bytes of the newest log file after its last valid record, as large
    // as the file was made (a file cut short may have held more).
    let mut newest_rest = 0;
    let replay = match from {
        Some(i) => {
            // Taken at the word of the header of the file after them: a
            // leftover must hold no record the snapshot lacks, or a damaged
            // header would have it removed with those records.
            let mut whole = true;
            for (_, _, version, path) in &headers[..i] {
                if let Some(seq) = first_record_from(path, *version, start)? {
                    let why = format!(
                        "it holds record {seq}, which the snapshot (from record {start}) \
                         lacks, though the header of the log file after it says it \
                         begins by then"
                    );
                    if !salvage {
                        return Err(damage(path, 0, &why));
                    }
                    warn!(file = %path.display(), "{why}; kept, not replayed (--salvage)");
                    out.skipped += 1;
                    whole = false;
                }
            }
            if whole {
                out.leftovers
                    .extend(headers[..i].iter().map(|h| h.3.clone()));
            }
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
        // Only the newest two files can hold records written after their
        // last sync: a log file is synced before the next one begins.
        let from_disk = i + 2 >= replay.len();
        let used = replay_file(
            path,
            *version,
            newest,
            next_first,
            from_disk,
            listing.synced,
            start,
            state,
            salvage,
            &mut out,
            &mut buf,
        )?;
        if newest {
            let len = fs::metadata(path).map_or(0, |m| m.len());
            let made = head.map_or(file_size, |h| h.file_size).max(file_size);
            newest_rest = len.max(made).saturating_sub(used);
        }
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
    if let Some(head) = head {
        missing_newest(listing, &head, &headers, state, salvage, &mut out)?;
    }
    out.log_end = out.next_seq;
    out.salvaged =
        out.skipped > 0 || out.rests_skipped > 0 || !out.damaged.is_empty() || out.head_lowered;
    if out.salvaged {
        // New records begin a new file, so that a snapshot taken now lies
        // wholly after the damaged files, and they go with the rest.
        out.current = None;
    }
    if out.next_seq < start && listing.synced >= out.next_seq {
        // Not what a power cut leaves (records the head file's synced mark
        // says were synced are gone): a damaged log, or a log file's header
        // that says it begins long before the snapshot, its records lost.
        let path = replay
            .last()
            .map_or_else(|| listing.dir.join(HEAD_FILE), |h| h.3.clone());
        let why = format!(
            "the log ends at record {}, before the snapshot begins (record {start}), \
             though records up to {} were synced",
            out.next_seq - 1,
            listing.synced
        );
        if !salvage {
            return Err(damage(&path, 0, &why));
        }
        warn!(file = %path.display(), "{why}; going on with the snapshot (--salvage)");
        out.skipped += listing.synced.min(start - 1) + 1 - out.next_seq;
        out.salvaged = true;
    }
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
    // Puts the log lost may have handed out server ids that clients hold,
    // where a `delete` of one must not find a new job: new jobs are
    // numbered past all of them. Each record skipped held at most one put,
    // and each `MIN_PUT` bytes skipped unread, or cut off as a torn tail.
    // So did each record the head file's synced mark says was synced and
    // the log no longer holds (cut or zeroed from its end since). If the
    // last run did not stop cleanly, the newest file may also have lost
    // records from its end without a trace: under -f or -F a power cut
    // takes changes already answered, and a truncated or zeroed tail
    // whatever it held.
    let mut lost_puts =
        out.skipped + out.bytes_skipped / MIN_PUT + listing.synced.saturating_sub(out.log_end - 1);
    if !listing.stopped || out.tail_cut {
        lost_puts += newest_rest / MIN_PUT;
    }
    if lost_puts > 0 {
        let next_key = state.next_key().saturating_add(lost_puts);
        info!(
            next_id = next_key,
            stopped_cleanly = listing.stopped,
            "new server ids go on past any that the records the log may have \
             lost could have handed out"
        );
        state.apply(Record::Sequences {
            next_key,
            bury_seq: 0,
        });
    }
    Ok(out)
}

/// The first valid record numbered `start` or higher in log file `path`,
/// if any (read up to its first bad or missing record).
fn first_record_from(path: &Path, version: u32, start: u64) -> Result<Option<u64>, String> {
    let data = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut at = HEADER as usize;
    while let Some(Ok(f)) = data.get(at..).map(|rest| decode(rest, version)) {
        if f.seq >= start {
            return Ok(Some(f.seq));
        }
        at += f.len;
    }
    Ok(None)
}

/// Checks the newest log file against the head file, which names the
/// newest begun; and, as it may, raises the next server id to what the
/// head says was handed out before that file began (a snapshot or records
/// lost to a salvage may have held the highest).
fn missing_newest(
    listing: &Listing,
    head: &Head,
    headers: &[(u64, u64, u32, PathBuf)],
    state: &mut State,
    salvage: bool,
    out: &mut Recovered,
) -> Result<(), String> {
    let mut next_key = head.next_key;
    let newest = headers.last().map_or(0, |h| h.0);
    if head.number > newest {
        // With none here, the files before the newest may have gone to a
        // snapshot, as they should: only the newest is surely missing.
        let lost = match head.number - newest {
            _ if newest == 0 => format!("log file {} is missing", log_name(head.number)),
            1 => format!("log file {} is missing", log_name(head.number)),
            _ => format!(
                "log files {} to {} are missing",
                log_name(newest + 1),
                log_name(head.number)
            ),
        };
        let why = format!(
            "{lost} (the head file says log files up to {} were begun; the newest here is {})",
            log_name(head.number),
            match newest {
                0 => "none".to_string(),
                n => log_name(n),
            }
        );
        if !salvage {
            return Err(format!(
                "{} is damaged: {why}. delayq will not start on a damaged log (the jobs \
                 in those files would be lost, and their server ids handed out again); \
                 put the files back, or start it with --salvage to serve the rest \
                 without them",
                listing.dir.display()
            ));
        }
        // Every server id the lost files may have handed out: those before
        // the newest of them began, then at most one a put record in it.
        next_key = next_key.saturating_add(head.file_size.saturating_sub(HEADER) / MIN_PUT);
        warn!(
            "{why}: their records are lost; going on without them, server ids \
             from {next_key} on (--salvage)"
        );
        out.head_lowered = true;
    }
    state.apply(Record::Sequences {
        next_key,
        bury_seq: 0,
    });
    Ok(())
}

fn log_name(n: u64) -> String {
    format!("log.{n:016x}")
}

/// Checks a snapshot's header: the error says what is wrong with it.
fn snapshot_header(path: &Path, start: u64) -> Result<(), String> {
    let mut head = [0u8; HEADER as usize];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut head, 0))
        .map_err(|e| format!("bad header ({e})"))?;
    match read_header(Kind::Snapshot, &head) {
        Ok((s, _, _)) if s == start => Ok(()),
        Ok((s, _, _)) => Err(format!("its header says it starts at {s}")),
        Err(why) => Err(format!("bad header ({why})")),
    }
}

/// Replays one log file; returns the offset its data ends at. With
/// `from_disk`, its bytes are read from the disk itself (see
/// [`read_from_disk`]).
#[allow(clippy::too_many_arguments)]
fn replay_file(
    path: &PathBuf,
    version: u32,
    newest: bool,
    next_first: Option<u64>,
    from_disk: bool,
    synced: u64,
    start: u64,
    state: &mut State,
    salvage: bool,
    out: &mut Recovered,
    buf: &mut Vec<u8>,
) -> Result<u64, String> {
    // One buffer for every file: a fresh one per file would leave the heap
    // scattered with file-sized holes after the start.
    buf.clear();
    let file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if from_disk {
        read_from_disk(&file).map_err(|e| {
            format!(
                "cannot sync {} ({e}): the disk did not take what was written to it; \
                 start again once the disk is sound",
                path.display()
            )
        })?;
    }
    std::io::Read::read_to_end(&mut &file, buf)
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
        // A bad record with valid ones after it is a torn tail only if
        // none of them was synced: no later record's stamp says so, nor
        // the head file's synced mark (which covers the last group before
        // a stop, where no stamp comes after).
        let torn = next.is_none()
            || (out.next_seq > synced && !synced_after(data, version, at + 1, out.next_seq));
        if newest && torn {
            warn!(
                file = %path.display(), offset = at, reason = %why,
                "cut off a torn tail of the log (what a crash mid-write leaves); \
                 everything before it is served"
            );
            zero_from(path, at as u64, data.len() as u64)?;
            out.tail_cut = true;
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
                    "skipped the damaged rest of a log file (--salvage); how many \
                     records it held cannot be told");
                out.rests_skipped += 1;
                out.bytes_skipped += (data.len() - at) as u64;
                return Ok(data.len() as u64);
            }
        }
    }
}

/// Makes the reads of `file` that follow come from the disk, not from the
/// kernel's cache of it. After a failed write-back the cache may keep
/// pages that never reached the disk, marked clean (the kernel does not
/// try them again): records read from them would be served now, and gone
/// after the next reboot, with the records written after them left
/// beyond a hole that the start after that would call damage. So what is
/// dirty is written first (a failure stops the start), and then the cached
/// pages are dropped, which leaves out only such pages.
fn read_from_disk(file: &File) -> std::io::Result<()> {
    file.sync_data()?;
    // Advice only: where the pages cannot be dropped (a file system with
    // no disk under it, such as tmpfs), its cache is all there is.
    // SAFETY: a system call on a descriptor that `file` keeps open.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    Ok(())
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
                    "skipped the damaged rest of a snapshot (--salvage); how many \
                     records it held cannot be told");
                out.rests_skipped += 1;
                out.bytes_skipped += (data.len() - at) as u64;
                return Ok(data.len() as u64);
            }
        }
    }
}
