//! The commands a client can send, parsed once at the edge into one enum.
//!
//! Text commands come from [`parse_line`]; JSON-lines commands (see `json.rs`)
//! map onto the same variants, so dispatch has one `match` for both.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

use super::ClientError;
use super::{export, options};
use crate::job::{ExportCursor, Lifecycle, WholeJob};
use crate::names::{JobId, Tube, client_id, parse_u32, parse_u64};
use crate::rules::MAX_BATCH;
use crate::schedule::{Schedule, When, now_ms, valid_name};

/// One parsed command, with every argument validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `put`, or JSON `add`. `tube: None` means the connection's used tube.
    Put {
        /// Lower is more urgent.
        pri: u32,
        /// Seconds before the job becomes ready.
        delay: u32,
        /// Seconds a reserver has before the job comes back.
        ttr: u32,
        /// The client-chosen id, if any.
        id: Option<Arc<str>>,
        /// The tube to put into instead of the used one (JSON `topic`).
        tube: Option<Tube>,
        /// The job's body.
        body: Bytes,
        /// Its options (extension); `None` when none is set (see
        /// [`Lifecycle::boxed`]).
        life: Option<Box<Lifecycle>>,
    },
    /// `use <tube>`.
    Use(Tube),
    /// `reserve`, `reserve-with-timeout`, or JSON `pop`.
    Reserve {
        /// Seconds to wait; `None` waits for as long as it takes.
        timeout: Option<u32>,
        /// Reserve from this tube only instead of the watch list (JSON `topic`).
        tube: Option<Tube>,
    },
    /// `reserve-batch <count> [<timeout>]` (extension), or JSON `pop` with
    /// a `count`: waits as `reserve` does, then takes what is ready, up to
    /// `count` jobs.
    ReserveBatch {
        /// The most jobs to take.
        count: usize,
        /// Seconds to wait; `None` waits for as long as it takes.
        timeout: Option<u32>,
        /// Reserve from this tube only instead of the watch list (JSON `topic`).
        tube: Option<Tube>,
    },
    /// `reserve-job <id>`.
    ReserveJob(JobId),
    /// `delete-batch <id>...` or `finish-batch <id>...` (extension), or
    /// JSON `delete` or `finish` with `ids`.
    RemoveBatch {
        /// The jobs.
        ids: Vec<JobId>,
        /// Finish (only jobs this connection holds) rather than delete.
        finish: bool,
    },
    /// `delete <id>`.
    Delete(JobId),
    /// `finish <id>` (extension): delete a job this connection has reserved.
    Finish(JobId),
    /// `release <id> <pri> <delay>`.
    Release {
        /// The job.
        id: JobId,
        /// Its new priority.
        pri: u32,
        /// Seconds before it is ready again.
        delay: u32,
    },
    /// `bury <id> <pri>`.
    Bury {
        /// The job.
        id: JobId,
        /// Its new priority.
        pri: u32,
    },
    /// `touch <id>`.
    Touch(JobId),
    /// `watch <tube>`.
    Watch(Tube),
    /// `ignore <tube>`.
    Ignore(Tube),
    /// `peek <id>`.
    Peek(JobId),
    /// `peek-ready`.
    PeekReady,
    /// `peek-delayed`.
    PeekDelayed,
    /// `peek-buried`.
    PeekBuried,
    /// `kick <bound>`.
    Kick(u64),
    /// `kick-job <id>`.
    KickJob(JobId),
    /// `stats-job <id>`.
    StatsJob(JobId),
    /// `stats-tube <tube>`.
    StatsTube(Tube),
    /// `stats`.
    Stats,
    /// `list-tubes`.
    ListTubes,
    /// `list-tube-used`.
    ListTubeUsed,
    /// `list-tubes-watched`.
    ListTubesWatched,
    /// `pause-tube <tube> <delay>`.
    PauseTube(Tube, u32),
    /// `tube-set <tube> <option>=<value>...` (extension).
    TubeSet(Tube, Box<Lifecycle>),
    /// `tube-settings <tube>` (extension).
    TubeSettings(Tube),
    /// `schedule ...` (extension), or JSON `schedule`: register or replace
    /// a periodic job.
    Schedule(Box<NewSchedule>),
    /// `unschedule <name>` (extension), or JSON `unschedule`.
    Unschedule(Arc<str>),
    /// `list-schedules` (extension), or JSON `schedules`.
    ListSchedules,
    /// `quit`.
    Quit,
    /// `auth <token>` (extension), or JSON `auth`: authenticate with an
    /// access token (see `crate::auth`).
    Auth(Bytes),
    /// `export <cursor> <count>` (extension): a page of whole jobs.
    Export {
        /// Where the page begins.
        from: ExportCursor,
        /// The most jobs it may hold (the server may give fewer).
        max: usize,
    },
    /// `import <bytes>` (extension) with a line of an export as its body:
    /// insert a whole job.
    Import(Box<WholeJob>),
    /// `import` of a tube's settings line.
    ImportSettings(Tube, Box<Lifecycle>),
    /// `import` of a schedule line.
    ImportSchedule(Box<Schedule>),
}

impl Command {
    /// Whether it reads what other connections' hang-ups change (their
    /// counts, the jobs they held), so that it waits for those first (see
    /// `ServerStats::after_hangups`).
    pub fn looks_at_others(&self) -> bool {
        matches!(
            self,
            Command::Stats
                | Command::StatsTube(_)
                | Command::StatsJob(_)
                | Command::ListTubes
                | Command::Peek(_)
                | Command::PeekReady
                | Command::PeekDelayed
                | Command::PeekBuried
        )
    }
}

/// A schedule as a client registers it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Its name.
    pub name: Arc<str>,
    /// Where its jobs go.
    pub tube: Tube,
    /// Their priority.
    pub pri: u32,
    /// Their time to run, in seconds.
    pub ttr: u32,
    /// When it fires.
    pub when: When,
    /// Their body.
    pub body: Bytes,
}

/// The header of a `schedule` line: the body follows on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleHeader {
    /// Length of the body that follows, without its CRLF.
    pub bytes: u64,
    /// The rest, or why it was refused: the reply waits until the body has
    /// been read, so that it is not taken for a command.
    pub parts: Result<NewSchedule, ClientError>,
}

/// A command line whose body follows on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum Header {
    /// `put`.
    Put(PutHeader),
    /// `schedule`.
    Schedule(ScheduleHeader),
    /// `import`: the length of the export line that follows.
    Import(u64),
}

impl Header {
    /// Length of the body that follows, without its CRLF.
    pub fn bytes(&self) -> u64 {
        match self {
            Header::Put(h) => h.bytes,
            Header::Schedule(h) => h.bytes,
            Header::Import(bytes) => *bytes,
        }
    }

    /// Whether this is a `put`'s header.
    pub fn is_put(&self) -> bool {
        matches!(self, Header::Put(_))
    }

    /// The longest body this header may announce under `limits`: a job's
    /// body, or for `import` a whole export line, as long as a JSON command
    /// line may be (its body may be written with every byte escaped).
    pub fn max_bytes(&self, limits: &super::codec::Limits) -> u64 {
        match self {
            Header::Put(_) | Header::Schedule(_) => limits.max_job_size as u64,
            Header::Import(_) => limits.json_line() as u64,
        }
    }

    /// Completes the command once the body has been read.
    pub fn with_body(self, body: Bytes) -> Result<Command, ClientError> {
        match self {
            Header::Put(h) => h.with_body(body),
            Header::Schedule(h) => {
                let mut parts = h.parts?;
                parts.body = body;
                Ok(Command::Schedule(Box::new(parts)))
            }
            // The body's own size is checked against the limit where the
            // command runs.
            Header::Import(_) => Ok(
                match export::read_any(&body, SystemTime::now(), usize::MAX)? {
                    export::Line::Job(job) => Command::Import(job),
                    export::Line::Settings(tube, options) => {
                        Command::ImportSettings(tube, Box::new(options))
                    }
                    export::Line::Schedule(schedule) => Command::ImportSchedule(schedule),
                },
            ),
        }
    }
}

/// The header of a `put` line: the body follows on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct PutHeader {
    /// Priority.
    pub pri: u32,
    /// Delay in seconds.
    pub delay: u32,
    /// Time to run in seconds.
    pub ttr: u32,
    /// Length of the body that follows, without its CRLF.
    pub bytes: u64,
    /// Client-chosen id, if given.
    pub id: Option<Arc<str>>,
    /// The options, or why they were refused: the reply waits until the
    /// body has been read, so that it is not taken for a command.
    pub life: Result<Lifecycle, ClientError>,
}

impl PutHeader {
    /// Completes the command once the body has been read.
    pub fn with_body(self, body: Bytes) -> Result<Command, ClientError> {
        Ok(Command::Put {
            pri: self.pri,
            delay: self.delay,
            ttr: self.ttr,
            id: self.id,
            tube: None,
            body,
            life: self.life?.boxed(),
        })
    }
}

/// What a text command line turned out to be.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A complete command.
    Command(Command),
    /// A `put` or `schedule` line; its body comes next.
    Body(Header),
}

/// Parses one command line (without its line ending).
///
/// Arguments are separated by single spaces, as beanstalkd's own clients send
/// them. Which error a malformed line gets follows beanstalkd 1.12, which
/// recognises a command by prefix: `name ` for commands with arguments, the
/// bare name for the others. So `delete` alone is `UNKNOWN_COMMAND`, while
/// `stats-job` alone (which starts with `stats`) or `statsx` is `BAD_FORMAT`,
/// and anything starting with `quit` quits. A line holding a NUL byte is
/// `BAD_FORMAT` whatever it says, as beanstalkd checks before anything.
pub fn parse_line(line: &[u8]) -> Result<Line, ClientError> {
    if memchr::memchr(0, line).is_some() {
        return Err(ClientError::BadFormat);
    }
    if let Some(sp) = memchr::memchr(b' ', line) {
        let (name, rest) = (&line[..sp], &line[sp + 1..]);
        if WITH_ARGS.contains(&name) {
            // Most commands have a few arguments: those are split on the
            // stack, sparing every command an allocation; a batch's many
            // ids go to the heap.
            let mut few: [&[u8]; FEW_ARGS] = [&[]; FEW_ARGS];
            let mut many = Vec::new();
            let mut n = 0;
            for arg in rest.split(|&b| b == b' ') {
                if arg.is_empty() {
                    return Err(ClientError::BadFormat);
                }
                if n < FEW_ARGS {
                    few[n] = arg;
                } else {
                    if many.is_empty() {
                        many.extend_from_slice(&few);
                    }
                    many.push(arg);
                }
                n += 1;
            }
            let args = if n <= FEW_ARGS { &few[..n] } else { &many[..] };
            return with_args(name, args);
        }
    }
    let bare = BARE
        .iter()
        .find(|(name, _)| line.starts_with(name))
        .ok_or(ClientError::UnknownCommand)?;
    match bare {
        (name, Some(cmd)) if line == *name => Ok(Line::Command(cmd.clone())),
        (_, Some(Command::Quit)) => Ok(Line::Command(Command::Quit)),
        _ => Err(ClientError::BadFormat),
    }
}

/// How many arguments a command line splits into without allocating.
const FEW_ARGS: usize = 8;

/// Commands that take arguments, recognised by `name` followed by a space.
const WITH_ARGS: &[&[u8]] = &[
    b"put",
    b"use",
    b"reserve-with-timeout",
    b"reserve-job",
    b"delete",
    b"finish",
    b"release",
    b"bury",
    b"touch",
    b"watch",
    b"ignore",
    b"peek",
    b"kick",
    b"kick-job",
    b"stats-job",
    b"stats-tube",
    b"pause-tube",
    b"tube-set",
    b"tube-settings",
    b"reserve-batch",
    b"delete-batch",
    b"finish-batch",
    b"schedule",
    b"unschedule",
    b"auth",
    b"export",
    b"import",
];

/// Commands recognised by prefix, longest first so that `list-tubes-watched`
/// is not taken for `list-tubes`. `pause-tube` is here too because beanstalkd
/// matches it without its space, so a bare `pause-tube` is `BAD_FORMAT`
/// (`None`: recognised, but never complete without arguments).
const BARE: &[(&[u8], Option<Command>)] = &[
    (b"list-tubes-watched", Some(Command::ListTubesWatched)),
    (b"list-tube-used", Some(Command::ListTubeUsed)),
    (b"list-tubes", Some(Command::ListTubes)),
    (b"list-schedules", Some(Command::ListSchedules)),
    (b"peek-delayed", Some(Command::PeekDelayed)),
    (b"peek-buried", Some(Command::PeekBuried)),
    (b"peek-ready", Some(Command::PeekReady)),
    (b"pause-tube", None),
    (
        b"reserve",
        Some(Command::Reserve {
            timeout: None,
            tube: None,
        }),
    ),
    (b"stats", Some(Command::Stats)),
    (b"quit", Some(Command::Quit)),
];

/// A body's byte count: 32 bits, as beanstalkd reads it. A larger one is a
/// malformed line, not a body to read and throw away: a count of 2^64 - 1
/// would take everything the connection ever sends after it.
fn body_len(bytes: &[u8]) -> Result<u64, ClientError> {
    num32(bytes).map(u64::from)
}

fn with_args(name: &[u8], args: &[&[u8]]) -> Result<Line, ClientError> {
    let cmd = match (name, args) {
        (b"put", [pri, delay, ttr, bytes, rest @ ..]) => {
            // An id has no `=`; every word after it must be an option.
            let (id, opts) = match rest {
                [id, opts @ ..] if !id.contains(&b'=') => (Some(id), opts),
                opts => (None, opts),
            };
            if opts.iter().any(|o| !o.contains(&b'=')) {
                return Err(ClientError::BadFormat);
            }
            return Ok(Line::Body(Header::Put(PutHeader {
                pri: num32(pri)?,
                delay: num32(delay)?,
                ttr: num32(ttr)?,
                bytes: body_len(bytes)?,
                id: match id {
                    Some(id) => Some(client_id(id).ok_or(ClientError::BadFormat)?),
                    None => None,
                },
                life: options::parse_job(opts),
            })));
        }
        (b"schedule", [name, tube, pri, ttr, bytes, when @ ..]) => {
            let bytes = body_len(bytes)?;
            return Ok(Line::Body(Header::Schedule(ScheduleHeader {
                bytes,
                parts: schedule_parts(name, tube, pri, ttr, when),
            })));
        }
        (b"unschedule", [name]) => Command::Unschedule(schedule_name(name)?),
        (b"export", [cursor, count]) => Command::Export {
            from: export::parse_cursor(cursor).ok_or(ClientError::BadFormat)?,
            max: match parse_u64(count) {
                Some(n @ 1..) => usize::try_from(n).unwrap_or(usize::MAX),
                _ => return Err(ClientError::BadFormat),
            },
        },
        (b"import", [bytes]) => {
            return Ok(Line::Body(Header::Import(body_len(bytes)?)));
        }
        (b"auth", [token]) => Command::Auth(Bytes::copy_from_slice(token)),
        (b"use", [tube]) => Command::Use(tube_arg(tube)?),
        (b"reserve-with-timeout", [secs]) => Command::Reserve {
            timeout: Some(num32(secs)?),
            tube: None,
        },
        (b"reserve-job", [id]) => Command::ReserveJob(id_arg(id)?),
        (b"reserve-batch", [count, rest @ ..]) if rest.len() <= 1 => Command::ReserveBatch {
            count: batch_size(count)?,
            timeout: rest.first().map(|t| num32(t)).transpose()?,
            tube: None,
        },
        (b"delete-batch" | b"finish-batch", ids) if ids.len() <= MAX_BATCH => {
            Command::RemoveBatch {
                ids: ids.iter().map(|id| id_arg(id)).collect::<Result<_, _>>()?,
                finish: name == b"finish-batch",
            }
        }
        (b"delete", [id]) => Command::Delete(id_arg(id)?),
        (b"finish", [id]) => Command::Finish(id_arg(id)?),
        (b"release", [id, pri, delay]) => Command::Release {
            id: id_arg(id)?,
            pri: num32(pri)?,
            delay: num32(delay)?,
        },
        (b"bury", [id, pri]) => Command::Bury {
            id: id_arg(id)?,
            pri: num32(pri)?,
        },
        (b"touch", [id]) => Command::Touch(id_arg(id)?),
        (b"watch", [tube]) => Command::Watch(tube_arg(tube)?),
        (b"ignore", [tube]) => Command::Ignore(tube_arg(tube)?),
        (b"peek", [id]) => Command::Peek(id_arg(id)?),
        (b"kick", [bound]) => Command::Kick(parse_u64(bound).ok_or(ClientError::BadFormat)?),
        (b"kick-job", [id]) => Command::KickJob(id_arg(id)?),
        (b"stats-job", [id]) => Command::StatsJob(id_arg(id)?),
        (b"stats-tube", [tube]) => Command::StatsTube(tube_arg(tube)?),
        (b"pause-tube", [tube, delay]) => Command::PauseTube(tube_arg(tube)?, num32(delay)?),
        (b"tube-set", [tube, opts @ ..]) => {
            let tube = tube_arg(tube)?;
            Command::TubeSet(tube, Box::new(options::parse(opts)?))
        }
        (b"tube-settings", [tube]) => Command::TubeSettings(tube_arg(tube)?),
        _ => return Err(ClientError::BadFormat),
    };
    Ok(Line::Command(cmd))
}

/// A `schedule` line's words after its length: `every <duration>` or
/// `cron <zone> <expression...>`.
fn schedule_parts(
    name: &[u8],
    tube: &[u8],
    pri: &[u8],
    ttr: &[u8],
    when: &[&[u8]],
) -> Result<NewSchedule, ClientError> {
    // The plain arguments first, so a malformed one is `BAD_FORMAT`
    // whatever the schedule says.
    let (name, tube, pri, ttr) = (
        schedule_name(name)?,
        tube_arg(tube)?,
        num32(pri)?,
        num32(ttr)?,
    );
    let when = match when {
        [b"every", period] => {
            let period = options::span(period).ok_or(ClientError::BadSchedule("bad-interval"))?;
            When::every(period)
        }
        [b"cron", zone, expr @ ..] if !expr.is_empty() => {
            let text = |raw: &[u8]| String::from_utf8(raw.to_vec()).ok();
            let zone = text(zone).ok_or(ClientError::BadSchedule("bad-zone"))?;
            let expr = text(&expr.join(&b' ')).ok_or(ClientError::BadSchedule("bad-cron"))?;
            When::cron(&zone, &expr, now_ms())
        }
        _ => return Err(ClientError::BadFormat),
    }
    .map_err(ClientError::BadSchedule)?;
    Ok(NewSchedule {
        name,
        tube,
        pri,
        ttr,
        when,
        body: Bytes::new(),
    })
}

/// A schedule's name: a tube name's characters, short enough for the ids
/// of its firings.
pub fn schedule_name(raw: &[u8]) -> Result<Arc<str>, ClientError> {
    if !valid_name(raw) {
        return Err(ClientError::BadFormat);
    }
    std::str::from_utf8(raw)
        .map(Arc::from)
        .map_err(|_| ClientError::BadFormat)
}

/// A batch's size: 1 to [`MAX_BATCH`].
pub fn batch_size(raw: &[u8]) -> Result<usize, ClientError> {
    parse_u64(raw)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_BATCH).contains(n))
        .ok_or(ClientError::BadFormat)
}

/// Whether a line that is not complete yet is a batch command's, which may
/// be longer than other lines: [`MAX_BATCH`] ids of the longest kind.
pub fn is_batch_line(start: &[u8]) -> bool {
    start.starts_with(b"delete-batch ") || start.starts_with(b"finish-batch ")
}

/// The longest batch command line, line ending included.
pub const MAX_BATCH_LINE: usize = 16 + MAX_BATCH * (crate::names::MAX_NAME_LEN + 1);

fn num32(raw: &[u8]) -> Result<u32, ClientError> {
    parse_u32(raw).ok_or(ClientError::BadFormat)
}

fn id_arg(raw: &[u8]) -> Result<JobId, ClientError> {
    JobId::parse(raw).ok_or(ClientError::BadFormat)
}

fn tube_arg(raw: &[u8]) -> Result<Tube, ClientError> {
    Tube::parse(raw).ok_or(ClientError::BadFormat)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(line: &str) -> Result<Line, ClientError> {
        parse_line(line.as_bytes())
    }

    #[test]
    fn put_header_with_and_without_id() {
        let Ok(Line::Body(Header::Put(h))) = cmd("put 1 2 3 4") else {
            panic!("not a put")
        };
        assert_eq!((h.pri, h.delay, h.ttr, h.bytes, h.id), (1, 2, 3, 4, None));
        let Ok(Line::Body(Header::Put(h))) = cmd("put 0 0 60 5 order-close:4711") else {
            panic!("not a put")
        };
        assert_eq!(h.id.as_deref(), Some("order-close:4711"));
        assert_eq!(cmd("put 0 0 60 5 4711"), Err(ClientError::BadFormat));
        assert_eq!(cmd("put 0 0 60 5 a b"), Err(ClientError::BadFormat));
        let Ok(Line::Body(Header::Put(h))) = cmd("put 0 0 60 5 refund:88 tries=5 backoff=exp:10s")
        else {
            panic!("not a put")
        };
        assert_eq!(h.id.as_deref(), Some("refund:88"));
        assert_eq!(h.life.map(|l| l.tries), Ok(Some(5)));
        let Ok(Line::Body(Header::Put(h))) = cmd("put 0 0 60 5 tries=5") else {
            panic!("not a put")
        };
        assert_eq!((h.id, h.life.map(|l| l.tries)), (None, Ok(Some(5))));
        // A bad option is refused once the body is read, not at the line.
        let Ok(Line::Body(Header::Put(h))) = cmd("put 0 0 60 5 tries=0") else {
            panic!("not a put")
        };
        assert_eq!(h.life, Err(ClientError::BadOption));
        assert_eq!(cmd("put 0 0 60 5 tries=5 a"), Err(ClientError::BadFormat));
        assert_eq!(cmd("put 0 0 60 5 a b tries=5"), Err(ClientError::BadFormat));
        assert_eq!(cmd("put -1 0 60 5"), Err(ClientError::BadFormat));
        assert_eq!(cmd("put 0 0 60 5 "), Err(ClientError::BadFormat));
        assert_eq!(cmd("put 0 0 60"), Err(ClientError::BadFormat));
    }

    #[test]
    fn error_words_match_beanstalkd() {
        assert_eq!(cmd("delete"), Err(ClientError::UnknownCommand));
        assert_eq!(cmd("use"), Err(ClientError::UnknownCommand));
        assert_eq!(cmd("reserve-with-timeout"), Err(ClientError::BadFormat));
        assert_eq!(cmd("stats-job"), Err(ClientError::BadFormat));
        assert_eq!(cmd("stats x"), Err(ClientError::BadFormat));
        assert_eq!(cmd("delete 1 2"), Err(ClientError::BadFormat));
        assert_eq!(cmd("PUT 0 0 0 0"), Err(ClientError::UnknownCommand));
        assert_eq!(cmd(""), Err(ClientError::UnknownCommand));
        assert_eq!(cmd("use a:b"), Err(ClientError::BadFormat));
        assert_eq!(cmd("pause-tube"), Err(ClientError::BadFormat));
        assert_eq!(cmd("pause-tubex"), Err(ClientError::BadFormat));
        assert_eq!(cmd("statsx"), Err(ClientError::BadFormat));
        assert_eq!(cmd("peek-readyx"), Err(ClientError::BadFormat));
        assert_eq!(cmd("foo "), Err(ClientError::UnknownCommand));
        assert_eq!(cmd(" "), Err(ClientError::UnknownCommand));
        assert_eq!(cmd("quit x"), Ok(Line::Command(Command::Quit)));
        for nul in ["\0", "foo\0", "\0stats", "quit\0", "stats\0", "use a\0b"] {
            assert_eq!(cmd(nul), Err(ClientError::BadFormat), "{nul:?}");
        }
        assert_eq!(
            cmd("list-tubes-watched"),
            Ok(Line::Command(Command::ListTubesWatched))
        );
        assert_eq!(cmd("reserve x"), Err(ClientError::BadFormat));
    }

    #[test]
    fn batches() {
        assert_eq!(
            cmd("reserve-batch 100 5"),
            Ok(Line::Command(Command::ReserveBatch {
                count: 100,
                timeout: Some(5),
                tube: None
            }))
        );
        assert!(matches!(
            cmd("reserve-batch 1"),
            Ok(Line::Command(Command::ReserveBatch { timeout: None, .. }))
        ));
        for bad in [
            "reserve-batch 0",
            "reserve-batch 1001",
            "reserve-batch 1000000000",
            "reserve-batch 5 1 1",
            "finish-batch 1 -2",
        ] {
            assert_eq!(cmd(bad), Err(ClientError::BadFormat), "{bad}");
        }
        let Ok(Line::Command(Command::RemoveBatch { ids, finish })) =
            cmd("finish-batch 7 order-close:4711")
        else {
            panic!("not a batch")
        };
        assert!(finish);
        assert_eq!(ids[0], JobId::Server(7));
        let many = format!("delete-batch{}", " 1".repeat(MAX_BATCH + 1));
        assert_eq!(cmd(&many), Err(ClientError::BadFormat));
    }

    #[test]
    fn schedules_read_their_body_before_any_refusal() {
        let Ok(Line::Body(h)) = cmd("schedule beat beats 5 30 4 every 30s") else {
            panic!("not a schedule")
        };
        assert_eq!(h.bytes(), 4);
        let Ok(Command::Schedule(s)) = h.with_body(Bytes::from_static(b"beat")) else {
            panic!("not a schedule")
        };
        assert_eq!(
            (&*s.name, s.tube.as_str(), s.pri, s.ttr),
            ("beat", "beats", 5, 30)
        );
        assert_eq!(s.when, When::Every(std::time::Duration::from_secs(30)));
        let Ok(Line::Body(h)) = cmd("schedule r reports 0 60 1 cron Europe/Berlin 0 2 * * MON-FRI")
        else {
            panic!("not a schedule")
        };
        assert!(matches!(
            h.with_body(Bytes::new()),
            Ok(Command::Schedule(s)) if matches!(&s.when, When::Cron { expr, .. } if &**expr == "0 2 * * MON-FRI")
        ));
        for (line, why) in [
            (
                "schedule b t 0 1 1 every 1ms",
                ClientError::BadSchedule("too-often"),
            ),
            (
                "schedule b t 0 1 1 every x",
                ClientError::BadSchedule("bad-interval"),
            ),
            (
                "schedule b t 0 1 1 cron UTC 0 0 30 2 *",
                ClientError::BadSchedule("never-fires"),
            ),
            (
                "schedule b t 0 1 1 cron Nowhere/X * * * * *",
                ClientError::BadSchedule("bad-zone"),
            ),
            ("schedule b t 0 1 1 cron UTC", ClientError::BadFormat),
            ("schedule b:c t 0 1 1 every 1s", ClientError::BadFormat),
            ("schedule b t -1 1 1 every 1s", ClientError::BadFormat),
            ("schedule b t 0 1 1 weekly 1", ClientError::BadFormat),
        ] {
            let Ok(Line::Body(h)) = cmd(line) else {
                panic!("{line}: the body is not read")
            };
            assert_eq!(h.with_body(Bytes::new()), Err(why), "{line}");
        }
        assert_eq!(
            cmd("schedule b t 0 1 x every 1s"),
            Err(ClientError::BadFormat)
        );
        assert_eq!(cmd("unschedule b:c"), Err(ClientError::BadFormat));
        assert_eq!(
            cmd("list-schedules"),
            Ok(Line::Command(Command::ListSchedules))
        );
        assert_eq!(cmd("list-schedules x"), Err(ClientError::BadFormat));
    }

    #[test]
    fn ids_parse_both_kinds() {
        assert_eq!(
            cmd("delete 7"),
            Ok(Line::Command(Command::Delete(JobId::Server(7))))
        );
        assert!(matches!(
            cmd("kick-job order-close:4711"),
            Ok(Line::Command(Command::KickJob(JobId::Client(_))))
        ));
    }
}
