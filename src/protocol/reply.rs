//! Replies, and the only place their wire words are spelled.
//!
//! A [`Reply`] is the same whichever protocol asked; [`Response`] pairs it with
//! the mode of the request so the encoder writes a text line or a JSON object.

use std::fmt::Write as _;
use std::io::Write;

use bytes::{BufMut, BytesMut};
use serde_json::json;

use super::ClientError;
use super::export::Page;
use super::options::show_duration;
use crate::job::JobBody;
use crate::names::{JobId, Tube};
use crate::schedule::{Schedule, When, show_moment};
use crate::store::TubeList;

/// Which protocol a request came in, and so which one its reply goes out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// beanstalkd's text protocol.
    Text,
    /// One JSON object per line.
    Json,
    /// Nothing is written: the reply to the `auth` that a JSON command's
    /// `token` field stands for (`json::parse_with_token`). The command's
    /// own reply says how it went: a failed token leaves the connection
    /// unauthenticated, so it is `UNAUTHORIZED`.
    Quiet,
}

/// Everything the server can answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `INSERTED <id>`.
    Inserted(JobId),
    /// `EXISTS <id>`: a put with a client id that is already taken.
    Exists(JobId),
    /// `USING <tube>`.
    Using(Tube),
    /// `RESERVED <id> <bytes>` and the body.
    Reserved(JobBody),
    /// `RESERVED_BATCH <count>`, then each job as `RESERVED` gives it
    /// (extension).
    Batch(Vec<JobBody>),
    /// `DELETED <count>` or `FINISHED <count>`: how many of a batch went
    /// (extension).
    Removed {
        /// `FINISHED` rather than `DELETED`.
        finish: bool,
        /// How many went.
        count: u64,
    },
    /// `DEADLINE_SOON`.
    DeadlineSoon,
    /// `TIMED_OUT`.
    TimedOut,
    /// `DELETED`.
    Deleted(JobId),
    /// `FINISHED` (extension).
    Finished(JobId),
    /// `NOT_FOUND`.
    NotFound,
    /// `RELEASED`.
    Released,
    /// `BURIED`.
    Buried,
    /// `TOUCHED`.
    Touched,
    /// `WATCHING <count>`.
    Watching(usize),
    /// `NOT_IGNORED`.
    NotIgnored,
    /// `FOUND <id> <bytes>` and the body.
    Found(JobBody),
    /// `KICKED <count>`.
    Kicked(u64),
    /// `KICKED`, the answer to `kick-job`.
    KickedJob,
    /// `OK <bytes>` and a YAML document.
    Yaml(String),
    /// `OK <bytes>` and a YAML list of tubes (`list-tubes`,
    /// `list-tubes-watched`), made a few hundred names at a time as the
    /// client takes it; in JSON, `{"success":true,"tubes":[...]}`.
    Tubes(TubeList),
    /// `PAUSED`.
    Paused,
    /// `SET`: a tube's settings were set (extension).
    Set,
    /// `SCHEDULED <moment>`: a schedule was registered; it fires first at
    /// that moment (extension).
    Scheduled(u64),
    /// `UNSCHEDULED`: a schedule was removed (extension).
    Unscheduled,
    /// `OK <bytes>` and a YAML list of the schedules, or in JSON their
    /// array; with the time they were listed at (extension).
    Schedules(Vec<Schedule>, u64),
    /// `DRAINING`: the server takes no new jobs.
    Draining,
    /// `OUT_OF_MEMORY`.
    OutOfMemory,
    /// `INTERNAL_ERROR`: the server's fault, logged where it happened.
    InternalError,
    /// `EXPORTED <cursor> <bytes>` and a page of an export, one JSON line
    /// per job (extension); the cursor is `0` when the export is complete.
    Exported {
        /// Where the next page begins.
        next: String,
        /// The page's lines.
        page: Page,
    },
    /// `IMPORTED <id>`: `import` inserted the job, under this id; or
    /// `IMPORTED settings <tube>`, `IMPORTED schedule <name>` (extension).
    Imported(String),
    /// `AUTHENTICATED`: `auth` accepted the token (extension).
    Authenticated,
    /// `UNAUTHORIZED`: tokens are on and the client has not authenticated,
    /// or `auth` refused its token (extension).
    Unauthorized,
    /// `FORBIDDEN`: the client's token does not allow the command, or not
    /// on that tube (extension).
    Forbidden,
    /// A client error word.
    Client(ClientError),
}

impl From<ClientError> for Reply {
    fn from(e: ClientError) -> Self {
        Reply::Client(e)
    }
}

impl Reply {
    /// The failure word for replies that are not a success, as used both on
    /// the text wire and in JSON `error` fields.
    fn word(&self) -> &'static str {
        match self {
            Reply::Inserted(_) => "INSERTED",
            Reply::Exported { .. } => "EXPORTED",
            Reply::Imported(_) => "IMPORTED",
            Reply::Exists(_) => "EXISTS",
            Reply::Using(_) => "USING",
            Reply::Reserved(_) => "RESERVED",
            Reply::Batch(_) => "RESERVED_BATCH",
            Reply::Removed { finish: true, .. } => "FINISHED",
            Reply::Removed { finish: false, .. } => "DELETED",
            Reply::DeadlineSoon => "DEADLINE_SOON",
            Reply::TimedOut => "TIMED_OUT",
            Reply::Deleted(_) => "DELETED",
            Reply::Finished(_) => "FINISHED",
            Reply::NotFound => "NOT_FOUND",
            Reply::Released => "RELEASED",
            Reply::Buried => "BURIED",
            Reply::Touched => "TOUCHED",
            Reply::Watching(_) => "WATCHING",
            Reply::NotIgnored => "NOT_IGNORED",
            Reply::Found(_) => "FOUND",
            Reply::Kicked(_) | Reply::KickedJob => "KICKED",
            Reply::Yaml(_) | Reply::Tubes(_) => "OK",
            Reply::Paused => "PAUSED",
            Reply::Draining => "DRAINING",
            Reply::OutOfMemory => "OUT_OF_MEMORY",
            Reply::InternalError => "INTERNAL_ERROR",
            Reply::Authenticated => "AUTHENTICATED",
            Reply::Unauthorized => "UNAUTHORIZED",
            Reply::Forbidden => "FORBIDDEN",
            Reply::Client(ClientError::BadFormat) => "BAD_FORMAT",
            Reply::Client(ClientError::UnknownCommand) => "UNKNOWN_COMMAND",
            Reply::Client(ClientError::ExpectedCrlf) => "EXPECTED_CRLF",
            Reply::Client(ClientError::JobTooBig) => "JOB_TOO_BIG",
            Reply::Client(ClientError::BadOption) => "BAD_OPTION",
            Reply::Client(ClientError::BadSchedule(_)) => "BAD_SCHEDULE",
            Reply::Set => "SET",
            Reply::Scheduled(_) => "SCHEDULED",
            Reply::Unscheduled => "UNSCHEDULED",
            Reply::Schedules(..) => "OK",
        }
    }

    /// Writes the text-protocol form.
    pub fn encode_text(&self, dst: &mut BytesMut) {
        for piece in 0..self.text_pieces() {
            let _counted = self.text_piece(piece, dst);
        }
    }

    /// How many pieces the text form is written in (see
    /// [`Response::pieces`]): a batch a job at a time, an export page a
    /// line at a time, a list of tubes a few hundred names at a time, any
    /// other YAML document in chunks.
    fn text_pieces(&self) -> usize {
        match self {
            Reply::Batch(jobs) => 1 + jobs.len(),
            // Its lines counted, for the length said first, then written.
            Reply::Exported { page, .. } => 2 + 2 * page.lines(),
            Reply::Yaml(doc) => 2 + doc.len().div_ceil(CHUNK),
            Reply::Tubes(tubes) => 2 + tubes.len().div_ceil(TUBES_A_PIECE),
            _ => 1,
        }
    }

    /// Writes piece `piece` of the text form; returns the bytes it made
    /// without writing them (an export line counted).
    fn text_piece(&self, piece: usize, dst: &mut BytesMut) -> usize {
        let word = self.word();
        match self {
            Reply::Batch(jobs) => match piece.checked_sub(1) {
                None => line(dst, format_args!("{word} {}", jobs.len())),
                Some(i) => {
                    if let Some(job) = jobs.get(i) {
                        job_text(dst, "RESERVED", job);
                    }
                }
            },
            Reply::Exported { next, page } => {
                let lines = page.lines();
                if piece < lines {
                    return page.count(piece);
                } else if piece == lines {
                    line(dst, format_args!("{word} {next} {}", page.bytes()));
                } else if piece <= 2 * lines {
                    page.write(piece - lines - 1, &mut dst.writer());
                } else {
                    dst.put_slice(b"\r\n");
                }
            }
            Reply::Tubes(tubes) => match piece.checked_sub(1) {
                None => {
                    // `---\n`, then `- <name>\n` for each.
                    let len: usize = 4 + tubes.iter().map(|t| t.as_str().len() + 3).sum::<usize>();
                    line(dst, format_args!("{word} {len}"));
                    dst.put_slice(b"---\n");
                }
                Some(i) => match tubes.chunks(TUBES_A_PIECE).nth(i) {
                    Some(some) => {
                        for tube in some {
                            dst.put_slice(b"- ");
                            dst.put_slice(tube.as_str().as_bytes());
                            dst.put_u8(b'\n');
                        }
                    }
                    None => dst.put_slice(b"\r\n"),
                },
            },
            Reply::Yaml(doc) => match piece.checked_sub(1) {
                None => line(dst, format_args!("{word} {}", doc.len())),
                Some(i) => match doc.as_bytes().chunks(CHUNK).nth(i) {
                    Some(chunk) => dst.put_slice(chunk),
                    None => dst.put_slice(b"\r\n"),
                },
            },
            _ => self.encode_text_whole(dst),
        }
        0
    }

    /// Writes the text form of a reply that is written whole.
    fn encode_text_whole(&self, dst: &mut BytesMut) {
        let word = self.word();
        match self {
            Reply::Inserted(id) | Reply::Exists(id) => {
                put_word(dst, word);
                put_id(dst, id);
                dst.put_slice(b"\r\n");
            }
            Reply::Imported(what) => line(dst, format_args!("{word} {what}")),
            Reply::Using(tube) => line(dst, format_args!("{word} {tube}")),
            Reply::Watching(n) => line(dst, format_args!("{word} {n}")),
            Reply::Kicked(n) => line(dst, format_args!("{word} {n}")),
            Reply::Reserved(job) | Reply::Found(job) => job_text(dst, word, job),
            Reply::Removed { count, .. } => line(dst, format_args!("{word} {count}")),
            Reply::Scheduled(at) => line(dst, format_args!("{word} {}", show_moment(*at))),
            Reply::Client(ClientError::BadSchedule(why)) => {
                line(dst, format_args!("{word} {why}"));
            }
            // Without the bodies (their lengths only), so 1,000 schedules,
            // the most a store keeps, make a few hundred KB.
            Reply::Schedules(all, now) => {
                let doc = schedules_yaml(all, *now);
                line(dst, format_args!("{word} {}", doc.len()));
                dst.put_slice(doc.as_bytes());
                dst.put_slice(b"\r\n");
            }
            _ => {
                dst.put_slice(word.as_bytes());
                dst.put_slice(b"\r\n");
            }
        }
    }

    /// Writes the JSON-lines form: `{"success":true,...}` or
    /// `{"success":false,"error":WORD}`.
    pub fn encode_json(&self, dst: &mut BytesMut) {
        for piece in 0..self.json_pieces() {
            self.json_piece(piece, dst);
        }
        dst.put_slice(b"\r\n");
    }

    /// How many pieces the JSON form is written in (see
    /// [`Response::pieces`]): a batch a job at a time, the schedules one at
    /// a time; the same bytes as [`Reply::to_json`] gives. (An export is
    /// asked for in the text protocol only.)
    pub fn json_pieces(&self) -> usize {
        match self {
            Reply::Batch(jobs) => 2 + jobs.len(),
            Reply::Schedules(all, _) => 2 + all.len(),
            Reply::Tubes(tubes) => 2 + tubes.len().div_ceil(TUBES_A_PIECE),
            _ => 1,
        }
    }

    /// Writes piece `piece` of the JSON form, without the line's end.
    pub fn json_piece(&self, piece: usize, dst: &mut BytesMut) {
        match self {
            Reply::Batch(jobs) => json_list_piece(dst, piece, "jobs", jobs, job_json),
            Reply::Schedules(all, now) => {
                json_list_piece(dst, piece, "schedules", all, |s| schedule_json(s, *now));
            }
            Reply::Tubes(tubes) => match piece.checked_sub(1) {
                None => dst.put_slice(b"{\"success\":true,\"tubes\":["),
                Some(i) => match tubes.chunks(TUBES_A_PIECE).nth(i) {
                    Some(some) => {
                        for (j, tube) in some.iter().enumerate() {
                            if i > 0 || j > 0 {
                                dst.put_u8(b',');
                            }
                            // Serializing a string into memory cannot fail.
                            let _ = serde_json::to_writer(dst.writer(), tube.as_str());
                        }
                    }
                    None => dst.put_slice(b"]}"),
                },
            },
            _ => write_json(dst, &self.to_json()),
        }
    }

    /// The JSON form, as JSON lines and the HTTP API give it:
    /// `{"success":true,...}` or `{"success":false,"error":WORD}`.
    ///
    /// The replies only text commands get have their JSON form too, for
    /// the HTTP API: a release or a bury says whether the job ended up
    /// buried (a release buries a job that has used up its tries), a kick
    /// how many jobs it kicked. A YAML document has no form here: the HTTP
    /// API shapes it (see [`super::stats::document_json`]).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Reply::Inserted(id) | Reply::Deleted(id) | Reply::Finished(id) => {
                json!({"success": true, "id": id.to_string()})
            }
            Reply::Imported(what) => json!({"success": true, "imported": what}),
            Reply::Exported { next, page } => {
                let mut data = Vec::with_capacity(page.bytes());
                for i in 0..page.lines() {
                    page.write(i, &mut data);
                }
                json!({
                    "success": true,
                    "next": next,
                    "data": String::from_utf8_lossy(&data),
                })
            }
            Reply::Reserved(job) | Reply::Found(job) => {
                let mut value = json!({"success": true});
                if let (Some(out), serde_json::Value::Object(fields)) =
                    (value.as_object_mut(), job_json(job))
                {
                    out.extend(fields);
                }
                value
            }
            Reply::Batch(jobs) => json!({
                "success": true,
                "jobs": jobs.iter().map(job_json).collect::<Vec<_>>(),
            }),
            Reply::Removed { count, .. } => json!({"success": true, "count": count}),
            Reply::Scheduled(at) => json!({"success": true, "next": show_moment(*at)}),
            Reply::Unscheduled => json!({"success": true}),
            Reply::Tubes(tubes) => json!({
                "success": true,
                "tubes": tubes.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
            }),
            Reply::Schedules(all, now) => json!({
                "success": true,
                "schedules": all.iter().map(|s| schedule_json(s, *now)).collect::<Vec<_>>(),
            }),
            Reply::Client(ClientError::BadSchedule(why)) => {
                json!({"success": false, "error": self.word(), "reason": why})
            }
            Reply::Exists(id) => {
                json!({"success": false, "error": self.word(), "id": id.to_string()})
            }
            Reply::Released => json!({"success": true, "buried": false}),
            Reply::Buried => json!({"success": true, "buried": true}),
            Reply::Kicked(count) => json!({"success": true, "count": count}),
            Reply::Watching(count) => json!({"success": true, "count": count}),
            Reply::Using(tube) => json!({"success": true, "topic": tube.as_str()}),
            Reply::Touched
            | Reply::KickedJob
            | Reply::Paused
            | Reply::Set
            | Reply::Authenticated => {
                json!({"success": true})
            }
            other => json!({"success": false, "error": other.word()}),
        }
    }
}

/// A job as `RESERVED` and `FOUND` give it: the word, id and length, the body.
fn job_text(dst: &mut BytesMut, word: &str, job: &JobBody) {
    dst.reserve(job.body.len() + 64);
    put_word(dst, word);
    put_id(dst, &job.id);
    dst.put_u8(b' ');
    dst.put_slice(itoa::Buffer::new().format(job.body.len()).as_bytes());
    dst.put_slice(b"\r\n");
    dst.put_slice(&job.body);
    dst.put_slice(b"\r\n");
}

// The replies of every cycle (`INSERTED`, `RESERVED`) are written without
// `std::fmt`: through it, their two numbers cost about 1,500 instructions
// a cycle, a twentieth of the memory-only engine's (callgrind).

/// The reply's word and the space after it.
fn put_word(dst: &mut BytesMut, word: &str) {
    dst.put_slice(word.as_bytes());
    dst.put_u8(b' ');
}

/// A job id as the protocol writes it.
fn put_id(dst: &mut BytesMut, id: &JobId) {
    match id {
        JobId::Server(n) => dst.put_slice(itoa::Buffer::new().format(*n).as_bytes()),
        JobId::Client(name) => dst.put_slice(name.as_bytes()),
    }
}

/// A job as JSON gives it.
fn job_json(job: &JobBody) -> serde_json::Value {
    json!({
        "id": job.id.to_string(),
        "topic": job.tube.as_str(),
        // JSON strings are Unicode: a body that is not UTF-8 comes out with
        // U+FFFD in place of the invalid bytes (see protocol.md).
        "value": String::from_utf8_lossy(&job.body),
    })
}

/// Piece `piece` of `{"success":true,"<key>":[...]}`: the opening, an
/// item, or the closing.
fn json_list_piece<T>(
    dst: &mut BytesMut,
    piece: usize,
    key: &str,
    items: &[T],
    json: impl Fn(&T) -> serde_json::Value,
) {
    match piece.checked_sub(1) {
        None => {
            dst.put_slice(b"{\"success\":true,\"");
            dst.put_slice(key.as_bytes());
            dst.put_slice(b"\":[");
        }
        Some(i) => match items.get(i) {
            Some(item) => {
                if i > 0 {
                    dst.put_u8(b',');
                }
                write_json(dst, &json(item));
            }
            None => dst.put_slice(b"]}"),
        },
    }
}

fn write_json(dst: &mut BytesMut, value: &serde_json::Value) {
    // Serializing a Value into memory cannot fail.
    let _ = serde_json::to_writer(dst.writer(), value);
}

/// The schedules as `list-schedules` shows them: a YAML list of maps.
fn schedules_yaml(all: &[Schedule], now: u64) -> String {
    let mut doc = String::from("---\n");
    for s in all {
        let _ = writeln!(doc, "- name: {}", s.name);
        let _ = writeln!(doc, "  tube: {}", s.tube);
        let _ = writeln!(doc, "  pri: {}", s.pri);
        let _ = writeln!(doc, "  ttr: {}", s.ttr.as_secs());
        match &s.when {
            When::Every(p) => {
                let _ = writeln!(doc, "  every: {}", show_duration(*p));
            }
            When::Cron { expr, zone, .. } => {
                // Quoted: a cron expression may start with `*` or `@`,
                // which YAML reads otherwise; a JSON string is a YAML one.
                let _ = writeln!(doc, "  cron: {}", json!(&**expr));
                let _ = writeln!(doc, "  zone: {}", zone.name());
            }
        }
        if let Some(next) = s.when.next_after(now) {
            let _ = writeln!(doc, "  next: {}", show_moment(next));
        }
        let _ = writeln!(doc, "  registered: {}", show_moment(s.since));
        let _ = writeln!(doc, "  body-bytes: {}", s.body.len());
    }
    doc
}

/// A schedule as JSON `schedules` gives it.
fn schedule_json(s: &Schedule, now: u64) -> serde_json::Value {
    let mut v = json!({
        "name": &*s.name,
        "topic": s.tube.as_str(),
        "priority": s.pri,
        "ttr": s.ttr.as_secs(),
        "next": s.when.next_after(now).map(show_moment),
        "registered": show_moment(s.since),
        "body": String::from_utf8_lossy(&s.body),
    });
    if let Some(fields) = v.as_object_mut() {
        match &s.when {
            When::Every(p) => {
                fields.insert("every".into(), json!(show_duration(*p)));
            }
            When::Cron { expr, zone, .. } => {
                fields.insert("cron".into(), json!(&**expr));
                fields.insert("zone".into(), json!(zone.name()));
            }
        }
    }
    v
}

fn line(dst: &mut BytesMut, args: std::fmt::Arguments<'_>) {
    let mut w = dst.writer();
    // Writing into a BytesMut cannot fail.
    let _ = w.write_fmt(args);
    w.get_mut().put_slice(b"\r\n");
}

/// A reply together with the protocol it must be written in.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Text or JSON.
    pub mode: Mode,
    /// What to say.
    pub reply: Reply,
}

/// The most of a YAML document written as one piece.
const CHUNK: usize = 64 << 10;

/// Tubes a piece of a list of tubes: at most 256 × 203 bytes.
const TUBES_A_PIECE: usize = 256;

impl Response {
    /// Writes the reply in its mode's wire form.
    pub fn encode(&self, dst: &mut BytesMut) {
        match self.mode {
            Mode::Text => self.reply.encode_text(dst),
            Mode::Json => self.reply.encode_json(dst),
            Mode::Quiet => {}
        }
    }

    /// How many pieces the reply is written in, in order. A reply that may
    /// be large (a batch of jobs, the schedules in JSON, an export page, a
    /// YAML document)
    /// has one piece for each of its parts, so that a connection can send
    /// what it has written before writing more: it then holds a piece at a
    /// time, not the whole reply (1,000 schedules with 64 KiB bodies of
    /// control bytes, each escaped in six, are 393 MB of JSON, once held
    /// whole by each client that asked and did not read).
    pub fn pieces(&self) -> usize {
        match self.mode {
            Mode::Text => self.reply.text_pieces(),
            Mode::Json => self.reply.json_pieces(),
            Mode::Quiet => 0,
        }
    }

    /// Writes piece `piece` (of [`Response::pieces`]) in its mode's form.
    /// Returns the bytes the piece made, written or only counted (an
    /// export page's lines are counted before they are written), so that
    /// the writer can measure its work by them.
    pub fn encode_piece(&self, piece: usize, dst: &mut BytesMut) -> usize {
        let before = dst.len();
        let counted = match self.mode {
            Mode::Text => self.reply.text_piece(piece, dst),
            Mode::Json => {
                self.reply.json_piece(piece, dst);
                if piece + 1 == self.reply.json_pieces() {
                    dst.put_slice(b"\r\n");
                }
                0
            }
            Mode::Quiet => 0,
        };
        dst.len() - before + counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn text(r: Reply) -> String {
        let mut b = BytesMut::new();
        r.encode_text(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    }

    #[test]
    fn text_words() {
        assert_eq!(text(Reply::Inserted(JobId::Server(3))), "INSERTED 3\r\n");
        assert_eq!(text(Reply::KickedJob), "KICKED\r\n");
        assert_eq!(text(Reply::Kicked(2)), "KICKED 2\r\n");
        assert_eq!(
            text(Reply::Client(ClientError::JobTooBig)),
            "JOB_TOO_BIG\r\n"
        );
        assert_eq!(text(Reply::Yaml("---\n".into())), "OK 4\r\n---\n\r\n");
        let job = JobBody {
            id: JobId::Server(1),
            tube: Tube::default_tube(),
            body: Bytes::from_static(b"a\r\nb"),
        };
        assert_eq!(text(Reply::Reserved(job)), "RESERVED 1 4\r\na\r\nb\r\n");
    }

    #[test]
    fn ids_and_lengths_are_written_as_display_writes_them() {
        let client = JobId::Client("order-close:4711".into());
        let ids = [0, 1, 9, 10, 4711, u64::from(u32::MAX), u64::MAX]
            .map(JobId::Server)
            .into_iter()
            .chain([client]);
        for id in ids {
            assert_eq!(
                text(Reply::Inserted(id.clone())),
                format!("INSERTED {id}\r\n")
            );
            assert_eq!(text(Reply::Exists(id.clone())), format!("EXISTS {id}\r\n"));
            for body in [&b""[..], b"x", &[7; 1000]] {
                let job = JobBody {
                    id: id.clone(),
                    tube: Tube::default_tube(),
                    body: Bytes::copy_from_slice(body),
                };
                let head = format!("FOUND {id} {}\r\n", body.len());
                let mut want = head.into_bytes();
                want.extend_from_slice(body);
                want.extend_from_slice(b"\r\n");
                let mut got = BytesMut::new();
                Reply::Found(job).encode_text(&mut got);
                assert_eq!(&got[..], &want[..], "{id}");
            }
        }
    }

    #[test]
    fn replies_written_in_pieces_are_what_they_would_be_whole() {
        let tube = Tube::parse(b"orders").unwrap();
        let job = |n, body: &[u8]| JobBody {
            id: JobId::Server(n),
            tube: tube.clone(),
            body: Bytes::copy_from_slice(body),
        };
        // Control bytes, bytes that are not UTF-8, quotes and emoji: what
        // escaping and the lossy reading of a body must get the same.
        let bodies: [&[u8]; 4] = [b"plain", b"\x01\x1f\"\\", b"\xff\xfe x", "é😀".as_bytes()];
        let jobs: Vec<_> = (1..).zip(bodies).map(|(n, b)| job(n, b)).collect();
        let schedule = |name: &str, body: &[u8]| Schedule {
            name: Arc::from(name),
            when: When::every(std::time::Duration::from_secs(60)).unwrap(),
            tube: tube.clone(),
            pri: 5,
            ttr: std::time::Duration::from_secs(30),
            body: Bytes::copy_from_slice(body),
            since: 1_764_125_340_000,
        };
        let schedules: Vec<_> = ["a", "b", "c", "d"]
            .into_iter()
            .zip(bodies)
            .map(|(name, body)| schedule(name, body))
            .collect();
        let now = 1_764_125_400_000;
        for reply in [
            Reply::Batch(jobs.clone()),
            Reply::Batch(vec![]),
            Reply::Schedules(schedules, now),
            Reply::Schedules(vec![], now),
        ] {
            let response = Response {
                mode: Mode::Json,
                reply: reply.clone(),
            };
            let mut got = BytesMut::new();
            for piece in 0..response.pieces() {
                response.encode_piece(piece, &mut got);
            }
            let mut want = serde_json::to_vec(&reply.to_json()).unwrap();
            want.extend_from_slice(b"\r\n");
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want)
            );
        }
        let response = Response {
            mode: Mode::Text,
            reply: Reply::Batch(jobs.clone()),
        };
        assert_eq!(response.pieces(), 1 + jobs.len());
        let mut want = b"RESERVED_BATCH 4\r\n".to_vec();
        for job in &jobs {
            let mut one = BytesMut::new();
            Reply::Reserved(job.clone()).encode_text(&mut one);
            want.extend_from_slice(&one);
        }
        let mut got = BytesMut::new();
        response.encode(&mut got);
        assert_eq!(&got[..], &want[..]);
        // A document over a few chunks, one not whole.
        let doc = "- tube\n".repeat(3 * CHUNK / 7 + 100);
        let response = Response {
            mode: Mode::Text,
            reply: Reply::Yaml(doc.clone()),
        };
        assert_eq!(response.pieces(), 2 + 4);
        let mut got = BytesMut::new();
        response.encode(&mut got);
        assert_eq!(got, format!("OK {}\r\n{doc}\r\n", doc.len()).as_bytes());
    }

    /// A list of tubes comes out as the whole YAML document did, in both
    /// modes, whether its names fill a piece, more than one or none.
    #[test]
    fn a_list_of_tubes_in_pieces_is_the_whole_list() {
        for count in [
            0,
            1,
            TUBES_A_PIECE,
            TUBES_A_PIECE + 1,
            3 * TUBES_A_PIECE + 7,
        ] {
            let names: Vec<String> = (0..count)
                .map(|i| format!("{}{i}", "t".repeat(i % 200 / 2 + 1)))
                .collect();
            let tubes: TubeList = names
                .iter()
                .map(|n| Tube::parse(n.as_bytes()).expect("a tube name"))
                .collect();
            let mut doc = String::from("---\n");
            for n in &names {
                doc.push_str(&format!("- {n}\n"));
            }
            let text = Response {
                mode: Mode::Text,
                reply: Reply::Tubes(tubes.clone()),
            };
            assert_eq!(text.pieces(), 2 + count.div_ceil(TUBES_A_PIECE));
            let mut got = BytesMut::new();
            text.encode(&mut got);
            assert_eq!(
                String::from_utf8_lossy(&got),
                format!("OK {}\r\n{doc}\r\n", doc.len())
            );
            let json = Response {
                mode: Mode::Json,
                reply: Reply::Tubes(tubes),
            };
            let mut got = BytesMut::new();
            for piece in 0..json.pieces() {
                json.encode_piece(piece, &mut got);
            }
            let want = json!({"success": true, "tubes": names});
            assert_eq!(
                String::from_utf8_lossy(&got),
                format!("{want}\r\n"),
                "{count} tubes"
            );
        }
    }

    #[test]
    fn json_shapes() {
        let mut b = BytesMut::new();
        Reply::NotFound.encode_json(&mut b);
        assert_eq!(&b[..], b"{\"success\":false,\"error\":\"NOT_FOUND\"}\r\n");
        assert_eq!(
            Reply::Released.to_json(),
            json!({"success": true, "buried": false})
        );
        assert_eq!(
            Reply::Buried.to_json(),
            json!({"success": true, "buried": true})
        );
        assert_eq!(
            Reply::Kicked(3).to_json(),
            json!({"success": true, "count": 3})
        );
        assert_eq!(Reply::Touched.to_json(), json!({"success": true}));
        assert_eq!(
            Reply::TimedOut.to_json(),
            json!({"success": false, "error": "TIMED_OUT"})
        );
    }
}
