//! The bytes of one record: a frame with a length, a CRC-32C checksum, a
//! sequence number and a stamp, around the engine's [`Record`] encoded
//! field by field: fixed-size fields little-endian, numbers that are
//! usually small (ids, priorities, delays, counters, lengths) as LEB128
//! varints, which keeps a job with a 100-byte body near 165 bytes instead
//! of 200.
//!
//! ```text
//! 0   len    u32  bytes after the checksum: seq..end of payload
//! 4   crc    u32  CRC-32C of the len field and those bytes
//! 8   seq    u64  the record's number; each is the one before plus one
//! 16  gap    u32  seq minus the highest number known synced when this was
//!                 written (the stamp), at most u32::MAX
//! 20  kind   u8   then the payload of that kind
//! ```
//!
//! The stamp lets recovery tell a torn tail from damage: after a crash, the
//! records written since the last sync may reach the disk in any order, so
//! a hole can sit before a record that did arrive; that record's stamp says
//! the hole was never synced, so it is the tail, cut off. A hole before a
//! record stamped after it was synced is damage. A gap too large for its
//! field (four billion records never synced, possible only with `-F`)
//! is written as the largest it can hold: the stamp read back is then
//! older than the truth, which can only make recovery take damage for a
//! torn tail, never the reverse.
//!
//! A length of zero is the end of the data (a preallocated file is zeros).

use std::time::Duration;

use super::super::memory::journal::{JobImage, Meta, Record, Round, Stored};
use crate::job::{Backoff, JobCounters, Lifecycle};

/// Bytes before a record's kind.
pub const FRAME_HEAD: usize = 20;
/// The most bytes a varint takes.
const MAX_VARINT: usize = 10;
/// The most bytes a delete record takes (its job's key is a varint).
pub const DELETE_LEN: usize = FRAME_HEAD + 1 + MAX_VARINT;

const JOB: u8 = 1;
const META: u8 = 2;
const DELETE: u8 = 3;
const PAUSE: u8 = 4;
const SEQUENCES: u8 = 5;
/// The last record of a snapshot, with how many came before it.
const END: u8 = 6;
/// A job with options or tries: a `JOB`, then its round and its options.
const JOB_LIFE: u8 = 7;
/// A `META`, then the job's round.
const META_LIFE: u8 = 8;
/// A tube's settings: its name and the options.
const SETTINGS: u8 = 9;
/// A gone job's client id, taken until a time.
const TAKEN: u8 = 10;
/// A schedule: its name and what the stores keep of it (none: removed).
const SCHEDULE: u8 = 11;

/// The most bytes a round takes: its start and the dead flag.
const ROUND_MAX: usize = 5 + 1;

/// The most bytes a [`Meta`] takes: key, pri, delay, state (kind and
/// value), five counters.
const META_MAX: usize = MAX_VARINT + 5 + MAX_VARINT + 1 + MAX_VARINT + 5 * 5;

/// What a frame holds: one of the engine's records, or a snapshot's end.
// Items are read one at a time and handed on at once: boxing the record
// would cost recovery an allocation per record to save a few stack bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A record.
    Record(Record<'a>),
    /// The end of a snapshot, after this many records.
    End(u64),
}

/// A frame read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// The highest sequence number known synced when it was written.
    pub stamp: u64,
    /// What it holds.
    pub item: Item<'a>,
    /// Its length in bytes, head included.
    pub len: usize,
}

/// Why the bytes at an offset are not a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bad {
    /// Zeros: the end of the data.
    End,
    /// Fewer bytes left than the frame says it has.
    Short,
    /// The checksum does not match.
    Checksum,
    /// The checksum matches but the contents make no sense (an unknown
    /// kind, lengths that do not add up).
    Malformed,
}

impl Bad {
    /// What went wrong, for an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Bad::End => "end of data",
            Bad::Short => "a record cut short",
            Bad::Checksum => "a checksum mismatch",
            Bad::Malformed => "a record that cannot be read",
        }
    }
}

/// The bytes a record will take.
pub fn encoded_len(record: &Record<'_>) -> usize {
    FRAME_HEAD
        + 1
        + match record {
            Record::Job(job) => {
                meta_len(&job.meta)
                    + unchanging_len(job)
                    + if has_life(job) {
                        round_len(&job.meta.round) + options_len(&job.options)
                    } else {
                        0
                    }
            }
            Record::Meta(meta) => {
                meta_len(meta)
                    + if meta.round == Round::default() {
                        0
                    } else {
                        round_len(&meta.round)
                    }
            }
            Record::Delete(key) => varint_len(*key),
            Record::Pause { tube, .. } => 1 + tube.len() + 16,
            Record::Settings { tube, options } => 1 + tube.len() + options_len(options),
            Record::Taken { name, .. } => 1 + name.len() + 8,
            Record::Schedule { name, encoded } => {
                1 + name.len() + varint_len(encoded.len() as u64) + encoded.len()
            }
            Record::Sequences { .. } => 16,
        }
}

/// The bytes of a job's record that no change of the job alters: all but
/// its meta and its round.
fn unchanging_len(job: &JobImage<'_>) -> usize {
    varint_len(job.ttr)
        + 8
        + 1
        + job.tube.len()
        + 1
        + job.name.map_or(0, str::len)
        + varint_len(job.body.len() as u64)
        + job.body.len()
}

/// Whether a job's record carries its round and options (`JOB_LIFE`):
/// only one with options can have a round that is not the first.
fn has_life(job: &JobImage<'_>) -> bool {
    !job.options.is_empty() || job.meta.round != Round::default()
}

fn round_len(r: &Round) -> usize {
    varint_len(r.start.into()) + 1
}

fn options_len(o: &Lifecycle) -> usize {
    1 + o.tries.map_or(0, |n| varint_len(n.into()))
        + o.backoff.map_or(0, |b| 1 + varint_len(backoff_ms(b).1))
        + o.backoff_max
            .map_or(0, |d| varint_len(d.as_millis() as u64))
        + o.jitter.map_or(0, |_| 1)
        + o.ttl.map_or(0, |d| varint_len(d.as_millis() as u64))
        + o.unique.map_or(0, |d| varint_len(d.as_millis() as u64))
        + o.rate.map_or(0, |n| varint_len(n.into()))
}

fn backoff_ms(b: Backoff) -> (u8, u64) {
    match b {
        Backoff::Fixed(d) => (0, d.as_millis() as u64),
        Backoff::Exponential(d) => (1, d.as_millis() as u64),
    }
}

/// What a live job counts for in the log's accounting of live bytes: its
/// record's length as if its meta took the most it can, so that the figure
/// added when the job is put and taken away when it goes are the same,
/// however its priority, state and counters changed in between.
pub fn weight(job: &JobImage<'_>) -> usize {
    // Worked out from the parts that do not change, which costs less than
    // the record's length less its meta (a restart weighs every live job).
    FRAME_HEAD
        + 1
        + META_MAX
        + unchanging_len(job)
        + if has_life(job) {
            ROUND_MAX + options_len(&job.options)
        } else {
            0
        }
}

fn meta_len(m: &Meta) -> usize {
    let value = match m.state {
        Stored::Ready | Stored::Reserved => 0,
        Stored::Delayed(v) | Stored::Buried(v) => varint_len(v),
    };
    let c = &m.counters;
    varint_len(m.key)
        + varint_len(m.pri.into())
        + varint_len(m.delay)
        + 1
        + value
        + varint_len(c.reserves.into())
        + varint_len(c.timeouts.into())
        + varint_len(c.releases.into())
        + varint_len(c.buries.into())
        + varint_len(c.kicks.into())
}

fn varint_len(n: u64) -> usize {
    // Nearly every number a record holds is small (counters, priorities,
    // most keys and delays), so the comparisons come first: measured over
    // an array of counters, the compiler turned the count of leading zeros
    // below into a vectorised bit count of 150 instructions, 740 a cycle
    // of the benchmark.
    if n < 1 << 7 {
        1
    } else if n < 1 << 14 {
        2
    } else if n < 1 << 21 {
        3
    } else {
        // Seven bits a byte.
        (64 - n.leading_zeros() as usize).div_ceil(7)
    }
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Appends `record` framed with `seq` and `stamp` to `out`.
pub fn encode(out: &mut Vec<u8>, seq: u64, stamp: u64, record: &Record<'_>) {
    encode_sized(out, seq, stamp, record, encoded_len(record));
}

/// [`encode`], given the record's [`encoded_len`]: appending measures each
/// record for room first, and working the length out again was a tenth of
/// the log's cost per change on the cycle benchmark.
pub fn encode_sized(out: &mut Vec<u8>, seq: u64, stamp: u64, record: &Record<'_>, len: usize) {
    let start = out.len();
    out.reserve(len);
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&seq.to_le_bytes());
    let gap = u32::try_from(seq.saturating_sub(stamp)).unwrap_or(u32::MAX);
    out.extend_from_slice(&gap.to_le_bytes());
    match record {
        Record::Job(job) => {
            let life = has_life(job);
            out.push(if life { JOB_LIFE } else { JOB });
            put_meta(out, &job.meta);
            put_varint(out, job.ttr);
            out.extend_from_slice(&job.created.to_le_bytes());
            put_short(out, job.tube.as_bytes());
            put_short(out, job.name.unwrap_or("").as_bytes());
            put_varint(out, job.body.len() as u64);
            out.extend_from_slice(job.body);
            if life {
                put_round(out, &job.meta.round);
                put_options(out, &job.options);
            }
        }
        Record::Meta(meta) => {
            let life = meta.round != Round::default();
            out.push(if life { META_LIFE } else { META });
            put_meta(out, meta);
            if life {
                put_round(out, &meta.round);
            }
        }
        Record::Settings { tube, options } => {
            out.push(SETTINGS);
            put_short(out, tube.as_bytes());
            put_options(out, options);
        }
        Record::Taken { name, until } => {
            out.push(TAKEN);
            put_short(out, name.as_bytes());
            out.extend_from_slice(&until.to_le_bytes());
        }
        Record::Schedule { name, encoded } => {
            out.push(SCHEDULE);
            put_short(out, name.as_bytes());
            put_varint(out, encoded.len() as u64);
            out.extend_from_slice(encoded);
        }
        Record::Delete(key) => {
            out.push(DELETE);
            put_varint(out, *key);
        }
        Record::Pause {
            tube,
            length,
            until,
        } => {
            out.push(PAUSE);
            put_short(out, tube.as_bytes());
            out.extend_from_slice(&length.to_le_bytes());
            out.extend_from_slice(&until.to_le_bytes());
        }
        Record::Sequences { next_key, bury_seq } => {
            out.push(SEQUENCES);
            out.extend_from_slice(&next_key.to_le_bytes());
            out.extend_from_slice(&bury_seq.to_le_bytes());
        }
    }
    seal(out, start);
    debug_assert_eq!(out.len() - start, len, "{record:?}");
}

/// Appends a snapshot's end frame.
pub fn encode_end(out: &mut Vec<u8>, seq: u64, count: u64) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(END);
    out.extend_from_slice(&count.to_le_bytes());
    seal(out, start);
}

/// Fills in the length and checksum of the frame that starts at `start`.
fn seal(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start - 8).expect("a record under 4 GiB");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), &out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn put_short(out: &mut Vec<u8>, bytes: &[u8]) {
    // Names are at most 200 bytes (checked where they enter).
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn put_meta(out: &mut Vec<u8>, m: &Meta) {
    put_varint(out, m.key);
    put_varint(out, m.pri.into());
    put_varint(out, m.delay);
    let (kind, value) = match m.state {
        Stored::Ready => (0u8, None),
        Stored::Delayed(due) => (1, Some(due)),
        Stored::Reserved => (2, None),
        Stored::Buried(seq) => (3, Some(seq)),
    };
    out.push(kind);
    if let Some(value) = value {
        put_varint(out, value);
    }
    let c = &m.counters;
    for n in [c.reserves, c.timeouts, c.releases, c.buries, c.kicks] {
        put_varint(out, n.into());
    }
}

fn put_round(out: &mut Vec<u8>, r: &Round) {
    put_varint(out, r.start.into());
    out.push(u8::from(r.dead));
}

fn put_options(out: &mut Vec<u8>, o: &Lifecycle) {
    let flags = u8::from(o.tries.is_some())
        | u8::from(o.backoff.is_some()) << 1
        | u8::from(o.backoff_max.is_some()) << 2
        | u8::from(o.jitter.is_some()) << 3
        | u8::from(o.ttl.is_some()) << 4
        | u8::from(o.unique.is_some()) << 5
        | u8::from(o.rate.is_some()) << 6;
    out.push(flags);
    if let Some(n) = o.tries {
        put_varint(out, n.into());
    }
    if let Some(b) = o.backoff {
        let (kind, ms) = backoff_ms(b);
        out.push(kind);
        put_varint(out, ms);
    }
    if let Some(d) = o.backoff_max {
        put_varint(out, d.as_millis() as u64);
    }
    if let Some(j) = o.jitter {
        out.push(j);
    }
    if let Some(d) = o.ttl {
        put_varint(out, d.as_millis() as u64);
    }
    if let Some(d) = o.unique {
        put_varint(out, d.as_millis() as u64);
    }
    if let Some(n) = o.rate {
        put_varint(out, n.into());
    }
}

/// Reads the frame at the start of `bytes`, written in format `version`
/// (1: every number fixed-size, the stamp whole; 2: as this module says).
pub fn decode(bytes: &[u8], version: u32) -> Result<Frame<'_>, Bad> {
    let Some(head) = bytes.get(..8) else {
        return Err(if bytes.iter().all(|&b| b == 0) {
            Bad::End
        } else {
            Bad::Short
        });
    };
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        return Err(Bad::End);
    }
    let Some(body) = bytes.get(8..8 + len) else {
        return Err(Bad::Short);
    };
    if crc32c::crc32c_append(crc32c::crc32c(&head[..4]), body) != crc {
        return Err(Bad::Checksum);
    }
    let mut r = Reader(body, version == 1);
    let seq = r.u64()?;
    let stamp = if r.1 {
        r.u64()?
    } else {
        seq.saturating_sub(r.u32()?.into())
    };
    let item = match r.u8()? {
        kind @ (JOB | JOB_LIFE) => {
            let mut meta = r.meta()?;
            let (ttr, created) = (r.number()?, r.u64()?);
            let tube = r.text()?;
            let name = r.text()?;
            let body_len = usize::try_from(r.number32()?).map_err(|_| Bad::Malformed)?;
            let body = r.take(body_len)?;
            let mut options = Lifecycle::default();
            if kind == JOB_LIFE {
                meta.round = r.round()?;
                options = r.options()?;
            }
            Item::Record(Record::Job(JobImage {
                meta,
                name: (!name.is_empty()).then_some(name),
                tube,
                ttr,
                created,
                body,
                options,
            }))
        }
        META => Item::Record(Record::Meta(r.meta()?)),
        META_LIFE => {
            let mut meta = r.meta()?;
            meta.round = r.round()?;
            Item::Record(Record::Meta(meta))
        }
        SETTINGS => Item::Record(Record::Settings {
            tube: r.text()?,
            options: r.options()?,
        }),
        TAKEN => Item::Record(Record::Taken {
            name: r.text()?,
            until: r.u64()?,
        }),
        SCHEDULE => {
            let name = r.text()?;
            let len = usize::try_from(r.number32()?).map_err(|_| Bad::Malformed)?;
            Item::Record(Record::Schedule {
                name,
                encoded: r.take(len)?,
            })
        }
        DELETE => Item::Record(Record::Delete(r.number()?)),
        PAUSE => Item::Record(Record::Pause {
            tube: r.text()?,
            length: r.u64()?,
            until: r.u64()?,
        }),
        SEQUENCES => Item::Record(Record::Sequences {
            next_key: r.u64()?,
            bury_seq: r.u64()?,
        }),
        END => Item::End(r.u64()?),
        _ => return Err(Bad::Malformed),
    };
    if !r.0.is_empty() {
        return Err(Bad::Malformed);
    }
    Ok(Frame {
        seq,
        stamp,
        item,
        len: 8 + len,
    })
}

/// Reads fields off the front of a frame's bytes; the flag says the frame
/// is in format 1 (fixed-size numbers).
struct Reader<'a>(&'a [u8], bool);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.0.len() < n {
            return Err(Bad::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    // Inlined: a record holds a dozen, and a call passed each through
    // memory (the reader's slice and the result).
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, Bad> {
        // Most are a byte: counters, priorities, small lengths.
        if let Some((&b, rest)) = self.0.split_first()
            && b < 0x80
        {
            self.0 = rest;
            return Ok(b.into());
        }
        // A number of up to 8 bytes (56 bits, which covers every key,
        // priority, delay and time in microseconds) is read in one word
        // with no branch per byte: byte by byte, the varints were a tenth
        // of a restart's time, mostly mispredicted loop exits.
        if let Some(word) = self.0.first_chunk::<8>() {
            let word = u64::from_le_bytes(*word);
            let ends = !word & 0x8080_8080_8080_8080;
            if ends != 0 {
                let len = (ends.trailing_zeros() / 8 + 1) as usize;
                let mask = if len == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * len)) - 1
                };
                let x = word & mask & 0x7f7f_7f7f_7f7f_7f7f;
                // Squeeze out the top bit of every byte: 7 bits a byte
                // become 14 a pair, 28 a half, 56 in all.
                let x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
                let x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
                let x = ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff);
                self.0 = &self.0[len..];
                return Ok(x);
            }
        }
        let mut n = 0u64;
        for (i, &b) in self.0.iter().take(MAX_VARINT).enumerate() {
            let bits = u64::from(b & 0x7f);
            // The tenth byte holds only the top bit of a u64.
            if i == MAX_VARINT - 1 && bits > 1 {
                return Err(Bad::Malformed);
            }
            n |= bits << (7 * i);
            if b & 0x80 == 0 {
                self.0 = &self.0[i + 1..];
                return Ok(n);
            }
        }
        Err(Bad::Malformed)
    }

    /// A number that format 1 kept in 8 bytes.
    fn number(&mut self) -> Result<u64, Bad> {
        if self.1 { self.u64() } else { self.varint() }
    }

    /// A number that format 1 kept in 4 bytes.
    fn number32(&mut self) -> Result<u32, Bad> {
        if self.1 {
            self.u32()
        } else {
            u32::try_from(self.varint()?).map_err(|_| Bad::Malformed)
        }
    }

    fn text(&mut self) -> Result<&'a str, Bad> {
        let n = self.u8()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| Bad::Malformed)
    }

    fn meta(&mut self) -> Result<Meta, Bad> {
        let (key, pri, delay) = (self.number()?, self.number32()?, self.number()?);
        let kind = self.u8()?;
        // Format 1 gave every state a value, zero where it has none.
        let value = if self.1 || matches!(kind, 1 | 3) {
            self.number()?
        } else {
            0
        };
        let state = match kind {
            0 => Stored::Ready,
            1 => Stored::Delayed(value),
            2 => Stored::Reserved,
            3 => Stored::Buried(value),
            _ => return Err(Bad::Malformed),
        };
        let counters = JobCounters {
            reserves: self.number32()?,
            timeouts: self.number32()?,
            releases: self.number32()?,
            buries: self.number32()?,
            kicks: self.number32()?,
        };
        Ok(Meta {
            key,
            pri,
            delay,
            state,
            counters,
            round: Round::default(),
        })
    }

    fn round(&mut self) -> Result<Round, Bad> {
        let start = u32::try_from(self.varint()?).map_err(|_| Bad::Malformed)?;
        let dead = match self.u8()? {
            0 => false,
            1 => true,
            _ => return Err(Bad::Malformed),
        };
        Ok(Round { start, dead })
    }

    fn options(&mut self) -> Result<Lifecycle, Bad> {
        let flags = self.u8()?;
        if flags >> 7 != 0 {
            return Err(Bad::Malformed);
        }
        let ms = |r: &mut Self| r.varint().map(Duration::from_millis);
        let mut o = Lifecycle::default();
        if flags & 1 != 0 {
            o.tries = Some(u32::try_from(self.varint()?).map_err(|_| Bad::Malformed)?);
        }
        if flags & 2 != 0 {
            o.backoff = Some(match self.u8()? {
                0 => Backoff::Fixed(ms(self)?),
                1 => Backoff::Exponential(ms(self)?),
                _ => return Err(Bad::Malformed),
            });
        }
        if flags & 4 != 0 {
            o.backoff_max = Some(ms(self)?);
        }
        if flags & 8 != 0 {
            o.jitter = Some(self.u8()?);
        }
        if flags & 16 != 0 {
            o.ttl = Some(ms(self)?);
        }
        if flags & 32 != 0 {
            o.unique = Some(ms(self)?);
        }
        if flags & 64 != 0 {
            o.rate = Some(u32::try_from(self.varint()?).map_err(|_| Bad::Malformed)?);
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::super::files::VERSION;
    use super::*;

    fn job<'a>(name: Option<&'a str>, body: &'a [u8]) -> Record<'a> {
        Record::Job(JobImage {
            meta: Meta {
                key: 7,
                pri: 1024,
                delay: 5_000_000,
                state: Stored::Delayed(1_700_000_000_000_000),
                counters: JobCounters {
                    reserves: 1,
                    timeouts: 2,
                    releases: 3,
                    buries: 4,
                    kicks: 5,
                },
                round: Round::default(),
            },
            name,
            tube: "orders",
            ttr: 60_000_000,
            created: 1_699_999_999_000_000,
            body,
            options: Lifecycle::default(),
        })
    }

    fn options() -> Lifecycle {
        Lifecycle {
            tries: Some(5),
            backoff: Some(Backoff::Exponential(Duration::from_secs(10))),
            backoff_max: Some(Duration::from_millis(600_001)),
            jitter: Some(20),
            ttl: Some(Duration::from_secs(86_400)),
            unique: Some(Duration::from_secs(3_600)),
            rate: None,
        }
    }

    fn job_with_life<'a>(body: &'a [u8]) -> Record<'a> {
        let Record::Job(mut image) = job(Some("refund:88"), body) else {
            unreachable!()
        };
        image.options = options();
        image.meta.round = Round {
            start: 3,
            dead: true,
        };
        Record::Job(image)
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let records = [
            job(None, b"hello"),
            job(Some("order-close:4711"), &[0, 13, 10, 255]),
            Record::Meta(Meta {
                key: 9,
                pri: 0,
                delay: 0,
                state: Stored::Buried(12),
                counters: JobCounters::default(),
                round: Round::default(),
            }),
            Record::Delete(u64::MAX),
            job_with_life(b"refund"),
            Record::Meta(Meta {
                key: 9,
                pri: 0,
                delay: 0,
                state: Stored::Buried(12),
                counters: JobCounters::default(),
                round: Round {
                    start: 70_000,
                    dead: true,
                },
            }),
            Record::Settings {
                tube: "refunds",
                options: options(),
            },
            Record::Taken {
                name: "order-close:4711",
                until: 1_700_000_000_000_000,
            },
            Record::Schedule {
                name: "nightly-report",
                encoded: b"1\nnightly-report\n\0\r\n",
            },
            Record::Schedule {
                name: "nightly-report",
                encoded: b"",
            },
            Record::Settings {
                tube: "refunds",
                options: Lifecycle {
                    jitter: Some(0),
                    rate: Some(50),
                    ..Lifecycle::default()
                },
            },
            Record::Pause {
                tube: "default",
                length: 3,
                until: 4,
            },
            Record::Sequences {
                next_key: 10,
                bury_seq: 12,
            },
        ];
        let mut out = Vec::new();
        for (i, r) in records.iter().enumerate() {
            let before = out.len();
            encode(&mut out, i as u64 + 1, i as u64, r);
            assert_eq!(out.len() - before, encoded_len(r), "{r:?}");
        }
        encode_end(&mut out, 7, 6);
        let mut at = 0;
        for (i, r) in records.iter().enumerate() {
            let frame = decode(&out[at..], VERSION).unwrap();
            assert_eq!(
                (frame.seq, frame.stamp, frame.item),
                (i as u64 + 1, i as u64, Item::Record(*r))
            );
            at += frame.len;
        }
        assert_eq!(decode(&out[at..], VERSION).unwrap().item, Item::End(6));
        assert_eq!(decode(&[0; 40], VERSION), Err(Bad::End));
        assert_eq!(decode(&[], VERSION), Err(Bad::End));
    }

    #[test]
    fn a_changed_byte_or_a_cut_is_seen() {
        let mut out = Vec::new();
        encode(&mut out, 1, 0, &job(Some("x"), b"body"));
        for at in 0..out.len() {
            let mut bad = out.clone();
            bad[at] ^= 0x40;
            assert!(
                decode(&bad, VERSION).is_err(),
                "byte {at} flipped went unseen"
            );
            assert!(
                decode(&out[..at], VERSION).is_err(),
                "cut at {at} went unseen"
            );
        }
        assert_eq!(decode(&out[..10], VERSION), Err(Bad::Short));
    }

    #[test]
    fn a_delete_takes_at_most_what_the_room_set_aside_for_it() {
        for key in [0, 1, 127, 128, 1 << 35, u64::MAX] {
            let mut out = Vec::new();
            encode(&mut out, u64::MAX, 0, &Record::Delete(key));
            assert!(out.len() <= DELETE_LEN, "{key}: {}", out.len());
            assert_eq!(out.len(), encoded_len(&Record::Delete(key)));
        }
        let mut out = Vec::new();
        encode(&mut out, 1, 0, &Record::Delete(u64::MAX));
        assert_eq!(out.len(), DELETE_LEN);
    }

    /// A record as format 1 wrote it: every number fixed-size, the stamp
    /// whole, every state with a value.
    fn encode_v1(out: &mut Vec<u8>, seq: u64, stamp: u64, record: &Record<'_>) {
        let start = out.len();
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&stamp.to_le_bytes());
        let meta = |out: &mut Vec<u8>, m: &Meta| {
            out.extend_from_slice(&m.key.to_le_bytes());
            out.extend_from_slice(&m.pri.to_le_bytes());
            out.extend_from_slice(&m.delay.to_le_bytes());
            let (kind, value) = match m.state {
                Stored::Ready => (0u8, 0u64),
                Stored::Delayed(due) => (1, due),
                Stored::Reserved => (2, 0),
                Stored::Buried(seq) => (3, seq),
            };
            out.push(kind);
            out.extend_from_slice(&value.to_le_bytes());
            let c = &m.counters;
            for n in [c.reserves, c.timeouts, c.releases, c.buries, c.kicks] {
                out.extend_from_slice(&n.to_le_bytes());
            }
        };
        match record {
            Record::Job(job) => {
                out.push(JOB);
                meta(out, &job.meta);
                out.extend_from_slice(&job.ttr.to_le_bytes());
                out.extend_from_slice(&job.created.to_le_bytes());
                put_short(out, job.tube.as_bytes());
                put_short(out, job.name.unwrap_or("").as_bytes());
                out.extend_from_slice(&(job.body.len() as u32).to_le_bytes());
                out.extend_from_slice(job.body);
            }
            Record::Meta(m) => {
                out.push(META);
                meta(out, m);
            }
            Record::Delete(key) => {
                out.push(DELETE);
                out.extend_from_slice(&key.to_le_bytes());
            }
            other => panic!("not needed here: {other:?}"),
        }
        seal(out, start);
    }

    #[test]
    fn format_1_records_read_back() {
        let records = [
            job(Some("order-close:4711"), &[0, 13, 10, 255]),
            Record::Meta(Meta {
                key: 9,
                pri: 7,
                delay: 0,
                state: Stored::Buried(12),
                counters: JobCounters::default(),
                round: Round::default(),
            }),
            Record::Meta(Meta {
                key: 9,
                pri: 7,
                delay: 0,
                state: Stored::Ready,
                counters: JobCounters::default(),
                round: Round::default(),
            }),
            Record::Delete(u64::MAX),
        ];
        for (i, r) in records.iter().enumerate() {
            let mut out = Vec::new();
            encode_v1(&mut out, 100 + i as u64, 99, r);
            let frame = decode(&out, 1).unwrap();
            assert_eq!(
                (frame.seq, frame.stamp, frame.item),
                (100 + i as u64, 99, Item::Record(*r))
            );
            assert_eq!(frame.len, out.len());
            // Read as the current format, the same bytes are not a record.
            assert!(
                decode(&out, VERSION).is_err()
                    || decode(&out, VERSION).unwrap().item != Item::Record(*r)
            );
        }
    }

    #[test]
    fn varints_read_back_at_every_length() {
        let mut n = 1u64;
        for shift in 0..64 {
            for v in [n - 1, n, n | (n >> 1), u64::MAX >> (63 - shift)] {
                let mut out = Vec::new();
                put_varint(&mut out, v);
                assert_eq!(out.len(), varint_len(v), "{v}");
                let mut r = Reader(&out, false);
                assert_eq!(r.varint(), Ok(v));
                assert!(r.0.is_empty());
                // Followed by other fields (bytes with and without the top
                // bit), as in a record: read a word at a time when 8 bytes
                // are there, byte by byte when not.
                for tail in [&[0xab; 9][..], &[0x00; 9], &[0x81, 0x01], &[0x7f]] {
                    let mut framed = out.clone();
                    framed.extend_from_slice(tail);
                    let mut r = Reader(&framed, false);
                    assert_eq!(r.varint(), Ok(v), "{v} before {tail:?}");
                    assert_eq!(r.0, tail, "{v} before {tail:?}");
                }
            }
            n = n.wrapping_shl(1).max(1);
        }
        // Eleven bytes, or a tenth byte beyond 64 bits, is not a number.
        assert_eq!(Reader(&[0x80; 11], false).varint(), Err(Bad::Malformed));
        let mut too_big = vec![0xff; 9];
        too_big.push(0x02);
        assert_eq!(Reader(&too_big, false).varint(), Err(Bad::Malformed));
    }

    #[test]
    fn a_stamp_reads_back_and_a_huge_gap_reads_as_older() {
        let mut out = Vec::new();
        encode(&mut out, 10, 7, &Record::Delete(1));
        assert_eq!(decode(&out, VERSION).unwrap().stamp, 7);
        let mut out = Vec::new();
        let seq = u64::from(u32::MAX) * 3;
        encode(&mut out, seq, 1, &Record::Delete(1));
        assert!(decode(&out, VERSION).unwrap().stamp <= 1 + seq - u64::from(u32::MAX));
    }

    #[test]
    fn a_job_weighs_the_same_whatever_its_meta() {
        let (a, b) = (job(None, b"x"), job(None, b"x"));
        let (Record::Job(a), Record::Job(mut b)) = (a, b) else {
            unreachable!()
        };
        b.meta.state = Stored::Reserved;
        b.meta.counters.reserves = 1 << 30;
        b.meta.pri = u32::MAX;
        assert_eq!(weight(&a), weight(&b));
        assert!(weight(&a) >= encoded_len(&Record::Job(a)));
        let Record::Job(c) = job_with_life(b"x") else {
            unreachable!()
        };
        let mut d = c;
        d.meta.round = Round {
            start: u32::MAX,
            dead: false,
        };
        assert_eq!(weight(&c), weight(&d));
        assert!(weight(&d) >= encoded_len(&Record::Job(d)));
        // A named job with a longer body: still its record's length with
        // the most its meta can take, whatever the meta is now.
        let Record::Job(named) = job(Some("order-close:4711"), &[7; 300]) else {
            unreachable!()
        };
        let mut changed = named;
        changed.meta.state = Stored::Buried(u64::MAX);
        changed.meta.key = u64::MAX;
        assert_eq!(weight(&named), weight(&changed));
        assert!(weight(&changed) >= encoded_len(&Record::Job(changed)));
    }
}
