//! The wire codec: bytes in, [`Request`]s out; [`Response`]s in, bytes out.
//!
//! Input is bounded: a command line may be at most [`MAX_LINE`] bytes
//! (a JSON line, which carries its body inline, at most [`Limits::json_line`]);
//! a longer one yields one `BAD_FORMAT` and is discarded up to its newline.
//! A `put` body over the job size limit is skipped as it arrives, never held,
//! and then answered with `JOB_TOO_BIG`. Client mistakes are decoded as items
//! (`Request::command` is an `Err`), because a decoder error ends the stream.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use super::ClientError;
use super::command::{Command, Header, Line, MAX_BATCH_LINE, is_batch_line, parse_line};
use super::json;
use super::reply::{Mode, Response};

/// Longest text command line, CRLF included.
pub const MAX_LINE: usize = 1024;

/// Room left in an empty read buffer for the next command: a typical
/// command, `put` with a small body included, arrives in one read.
const NEXT_COMMAND_ROOM: usize = 256;
/// Room left in a read buffer holding part of a command: the client is
/// sending more than the last read took, so read in bigger pieces.
const STREAM_ROOM: usize = 8 * 1024;

/// Leaves room in `buf` for the next read. The framing reads only into the
/// room a buffer has left, and a buffer whose commands were split off has
/// little left at its end: without this, a command would often take two
/// reads, the first only a few bytes. An empty buffer gets its whole
/// allocation back at no cost.
fn make_room(buf: &mut BytesMut) {
    buf.reserve(if buf.is_empty() {
        NEXT_COMMAND_ROOM
    } else {
        STREAM_ROOM
    });
}

/// Size limits the codec enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest job body, in bytes (the `-z` flag).
    pub max_job_size: usize,
}

impl Limits {
    /// Longest JSON command line, CRLF included: room for the largest body
    /// even if every byte of it is written as a six-byte `\uXXXX` escape.
    pub fn json_line(&self) -> usize {
        MAX_LINE + 6 * self.max_job_size
    }
}

/// One decoded request: the command, or what was wrong with it, and the
/// protocol its reply must use.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// Text or JSON.
    pub mode: Mode,
    /// The command, or the client error to answer with.
    pub command: Result<Command, ClientError>,
    /// The error refuses a `put` whose line was good but whose body was not
    /// (too big, or not ended by CRLF): beanstalkd counts such puts in
    /// `cmd-put` all the same.
    pub refused_put: bool,
}

#[derive(Debug)]
enum State {
    /// Waiting for a command line; `scanned` bytes are known to hold no `\n`.
    Line { scanned: usize },
    /// A line was too long: drop bytes through the next `\n`.
    Discard,
    /// A `put` or `schedule` line was read; its body and CRLF come next.
    Body(Header),
    /// A body too big to keep: drop `left` more bytes, then say so; `put`
    /// if it was a `put`'s.
    Skip { left: u64, put: bool },
}

/// The beanstalkd protocol codec, with the JSON-lines extension.
#[derive(Debug)]
pub struct Codec {
    limits: Limits,
    state: State,
    /// A JSON command whose `token` field was handed over first as an
    /// `auth` request: the next request, whatever the buffer holds.
    after_auth: Option<Request>,
}

impl Codec {
    /// A codec enforcing `limits`.
    pub fn new(limits: Limits) -> Codec {
        Codec {
            limits,
            state: State::Line { scanned: 0 },
            after_auth: None,
        }
    }

    fn text(command: Result<Command, ClientError>) -> Option<Request> {
        Some(Request {
            mode: Mode::Text,
            command,
            refused_put: false,
        })
    }

    /// A body refused; `put` if it was a `put`'s (see
    /// [`Request::refused_put`]).
    fn body_refused(error: ClientError, put: bool) -> Option<Request> {
        Some(Request {
            mode: Mode::Text,
            command: Err(error),
            refused_put: put,
        })
    }
}

impl Decoder for Codec {
    type Item = Request;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, Self::Error> {
        if let Some(request) = self.after_auth.take() {
            return Ok(Some(request));
        }
        loop {
            match &mut self.state {
                State::Line { scanned } => {
                    let json = buf.first() == Some(&b'{');
                    let cap = if json {
                        self.limits.json_line()
                    } else if is_batch_line(buf) {
                        MAX_BATCH_LINE
                    } else {
                        MAX_LINE
                    };
                    let Some(nl) = memchr::memchr(b'\n', &buf[*scanned..]).map(|i| i + *scanned)
                    else {
                        if buf.len() >= cap {
                            buf.clear();
                            self.state = State::Discard;
                            return Ok(self.too_long(json));
                        }
                        *scanned = buf.len();
                        make_room(buf);
                        return Ok(None);
                    };
                    self.state = State::Line { scanned: 0 };
                    let raw = buf.split_to(nl + 1);
                    if raw.len() > cap {
                        return Ok(self.too_long(json));
                    }
                    // A bare LF ends a line too, so `nc` without -C works.
                    let line = raw.strip_suffix(b"\n").unwrap_or(&raw);
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    if json {
                        let (token, command) =
                            json::parse_with_token(line, self.limits.max_job_size);
                        let request = Request {
                            mode: Mode::Json,
                            command,
                            refused_put: false,
                        };
                        let Some(token) = token else {
                            return Ok(Some(request));
                        };
                        // The token first, as an `auth` of its own whose
                        // reply is not written; then the command.
                        self.after_auth = Some(request);
                        return Ok(Some(Request {
                            mode: Mode::Quiet,
                            command: Ok(Command::Auth(token)),
                            refused_put: false,
                        }));
                    }
                    // A CR inside the line (protocol.md: a bare CR) makes
                    // it no command, whatever its words would have said: a
                    // put's options are not read for a reply of their own,
                    // nor its data.
                    if memchr::memchr(b'\r', line).is_some() {
                        return Ok(Codec::text(Err(ClientError::BadFormat)));
                    }
                    match parse_line(line) {
                        Ok(Line::Command(cmd)) => return Ok(Codec::text(Ok(cmd))),
                        Err(e) => return Ok(Codec::text(Err(e))),
                        Ok(Line::Body(header)) => {
                            if header.bytes() > header.max_bytes(&self.limits) {
                                self.state = State::Skip {
                                    left: header.bytes().saturating_add(2),
                                    put: header.is_put(),
                                };
                            } else {
                                // Room for a job's body at once; an import
                                // line, up to six times longer, grows the
                                // buffer as it arrives, so a line announced
                                // and never sent holds no more than a put.
                                let room = header.bytes().min(self.limits.max_job_size as u64);
                                buf.reserve(room as usize + 2);
                                self.state = State::Body(header);
                            }
                        }
                    }
                }
                State::Discard => match memchr::memchr(b'\n', buf) {
                    Some(nl) => {
                        buf.advance(nl + 1);
                        self.state = State::Line { scanned: 0 };
                    }
                    None => {
                        buf.clear();
                        return Ok(None);
                    }
                },
                State::Skip { left, put } => {
                    let n = (*left).min(buf.len() as u64) as usize;
                    buf.advance(n);
                    *left -= n as u64;
                    if *left > 0 {
                        return Ok(None);
                    }
                    let put = *put;
                    self.state = State::Line { scanned: 0 };
                    return Ok(Codec::body_refused(ClientError::JobTooBig, put));
                }
                State::Body(header) => {
                    let len = header.bytes() as usize;
                    if buf.len() < len + 2 {
                        return Ok(None);
                    }
                    let State::Body(header) =
                        std::mem::replace(&mut self.state, State::Line { scanned: 0 })
                    else {
                        unreachable!("matched Body above")
                    };
                    if &buf[len..len + 2] != b"\r\n" {
                        buf.advance(len + 2);
                        return Ok(Codec::body_refused(
                            ClientError::ExpectedCrlf,
                            header.is_put(),
                        ));
                    }
                    // Copied out so that a long-lived job does not pin the
                    // whole read buffer it arrived in.
                    let body = Bytes::copy_from_slice(&buf[..len]);
                    buf.advance(len + 2);
                    return Ok(Codec::text(header.with_body(body)));
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Request>, Self::Error> {
        // A partial line or body at EOF is simply dropped: the client is gone
        // and there is no one to answer.
        let item = self.decode(buf)?;
        if item.is_none() {
            buf.clear();
        }
        Ok(item)
    }
}

impl Codec {
    fn too_long(&self, json: bool) -> Option<Request> {
        Some(Request {
            mode: if json { Mode::Json } else { Mode::Text },
            command: Err(ClientError::BadFormat),
            refused_put: false,
        })
    }
}

impl Encoder<Response> for Codec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Response, dst: &mut BytesMut) -> Result<(), Self::Error> {
        item.encode(dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::JobId;

    fn codec() -> Codec {
        Codec::new(Limits { max_job_size: 10 })
    }

    fn decode_all(codec: &mut Codec, input: &[u8]) -> Vec<Result<Command, ClientError>> {
        let mut buf = BytesMut::from(input);
        let mut out = vec![];
        while let Some(req) = codec.decode(&mut buf).unwrap() {
            out.push(req.command);
        }
        out
    }

    fn put(body: &[u8]) -> Result<Command, ClientError> {
        Ok(Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            id: None,
            tube: None,
            body: Bytes::copy_from_slice(body),
            life: None,
        })
    }

    #[test]
    fn pipelined_and_binary() {
        let mut c = codec();
        let got = decode_all(&mut c, b"put 0 0 1 4\r\na\r\n\x00\r\ndelete 1\r\n");
        assert_eq!(
            got,
            vec![put(b"a\r\n\x00"), Ok(Command::Delete(JobId::Server(1)))]
        );
    }

    #[test]
    fn split_at_every_byte() {
        let input = b"put 0 0 1 3\r\nabc\r\npeek-ready\r\n";
        for cut in 0..input.len() {
            let mut c = codec();
            let mut buf = BytesMut::from(&input[..cut]);
            let mut got = vec![];
            while let Some(r) = c.decode(&mut buf).unwrap() {
                got.push(r.command);
            }
            buf.extend_from_slice(&input[cut..]);
            while let Some(r) = c.decode(&mut buf).unwrap() {
                got.push(r.command);
            }
            assert_eq!(
                got,
                vec![put(b"abc"), Ok(Command::PeekReady)],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn long_line_one_error_then_recovers() {
        let mut c = codec();
        let mut input = vec![b'x'; 3000];
        input.extend_from_slice(b"\r\nstats\r\n");
        let mut buf = BytesMut::new();
        let mut got = vec![];
        for chunk in input.chunks(100) {
            buf.extend_from_slice(chunk);
            while let Some(r) = c.decode(&mut buf).unwrap() {
                got.push(r.command);
            }
            assert!(buf.len() <= MAX_LINE + 100);
        }
        assert_eq!(got, vec![Err(ClientError::BadFormat), Ok(Command::Stats)]);
    }

    #[test]
    fn line_of_exactly_the_limit() {
        let mut c = codec();
        let mut line = b"use ".to_vec();
        line.resize(MAX_LINE - 2, b'a');
        line.extend_from_slice(b"\r\n");
        // The tube name is too long for a tube, but the line itself is fine.
        assert_eq!(decode_all(&mut c, &line), vec![Err(ClientError::BadFormat)]);
        let mut over = b"stats".to_vec();
        over.resize(MAX_LINE - 1, b' ');
        over.extend_from_slice(b"\r\nstats\r\n");
        assert_eq!(
            decode_all(&mut c, &over),
            vec![Err(ClientError::BadFormat), Ok(Command::Stats)]
        );
    }

    #[test]
    fn too_big_is_skipped_then_reported() {
        let mut c = codec();
        let mut buf = BytesMut::from(&b"put 0 0 1 11\r\n01234"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        assert!(buf.is_empty());
        buf.extend_from_slice(b"567890\r\nstats\r\n");
        assert_eq!(
            c.decode(&mut buf).unwrap().unwrap().command,
            Err(ClientError::JobTooBig)
        );
        assert_eq!(
            c.decode(&mut buf).unwrap().unwrap().command,
            Ok(Command::Stats)
        );
    }

    #[test]
    fn missing_crlf() {
        let mut c = codec();
        assert_eq!(
            decode_all(&mut c, b"put 0 0 1 3\r\nabcde\r\n"),
            vec![
                Err(ClientError::ExpectedCrlf),
                Err(ClientError::UnknownCommand)
            ]
        );
    }

    /// A bare CR makes any line `BAD_FORMAT`, its data unread, whatever
    /// else is wrong with it (an option, a schedule).
    #[test]
    fn a_bare_cr_is_bad_format_before_anything_else() {
        for line in [
            &b"stats\r\r\n"[..],
            b"put 0 0 60 3 fz-id\rX\r\nabc\r\n",
            b"put 0 0 60 3 fz-id tries=3\rX\r\nabc\r\n",
            b"schedule s1 fz 0 60 3 every 5s\rX\r\nabc\r\n",
            b"schedule s1 fz 0 60 3 cron UTC * * * * *\rX\r\nabc\r\n",
        ] {
            let got = decode_all(&mut codec(), line);
            assert_eq!(got[0], Err(ClientError::BadFormat), "{line:?}");
            // The data, if any, is a line of its own.
            assert!(
                got[1..]
                    .iter()
                    .all(|c| *c == Err(ClientError::UnknownCommand))
            );
        }
    }

    fn decode_in_chunks(input: &[u8], cuts: &[usize]) -> (Vec<Request>, usize) {
        let mut c = codec();
        let mut buf = BytesMut::new();
        let mut out = vec![];
        let mut most = 0;
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
            let cut = cut.clamp(from, input.len());
            buf.extend_from_slice(&input[from..cut]);
            from = cut;
            while let Some(r) = c.decode(&mut buf).unwrap() {
                out.push(r);
            }
            most = most.max(buf.len());
        }
        (out, most)
    }

    use proptest::prelude::*;

    proptest! {
        /// Any byte stream, cut anywhere: no panic, the same requests as when
        /// decoded whole, and never more buffered than one frame can need.
        #[test]
        fn any_bytes_any_cuts(
            input in proptest::collection::vec(
                prop_oneof![
                    Just(b"put 0 0 1 3\r\n".to_vec()),
                    Just(b"put 0 0 1 30\r\n".to_vec()),
                    Just(b"{\"command\":\"pop\",\"topic\":\"t\"}\n".to_vec()),
                    Just(b"\r\n".to_vec()),
                    proptest::collection::vec(any::<u8>(), 0..40),
                    proptest::collection::vec(Just(b'x'), 1000..1100),
                ],
                0..30,
            ).prop_map(|parts| parts.concat()),
            mut cuts in proptest::collection::vec(0usize..40_000, 0..20),
        ) {
            cuts.sort_unstable();
            let (whole, _) = decode_in_chunks(&input, &[]);
            let (pieces, most) = decode_in_chunks(&input, &cuts);
            prop_assert_eq!(whole, pieces);
            let bound = codec().limits.json_line() + 40_000;
            prop_assert!(most <= bound, "buffered {} bytes", most);
        }
    }

    #[test]
    fn json_line_mode() {
        let mut c = codec();
        let mut buf = BytesMut::from(&b"{\"command\":\"finish\",\"id\":\"a:1\"}\r\n{oops\n"[..]);
        let r = c.decode(&mut buf).unwrap().unwrap();
        assert_eq!(r.mode, Mode::Json);
        assert!(matches!(r.command, Ok(Command::Finish(JobId::Client(_)))));
        let r = c.decode(&mut buf).unwrap().unwrap();
        assert_eq!(
            (r.mode, r.command),
            (Mode::Json, Err(ClientError::BadFormat))
        );
    }
}
