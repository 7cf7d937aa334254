//! One client connection: decode, dispatch, encode, until the client leaves
//! or the server shuts down.
//!
//! Replies to pipelined commands are queued and written with one flush once
//! no further command is already waiting in the read buffer. A blocked
//! `reserve` waits on a channel while still reading the socket, so a client
//! that hangs up stops waiting at once and its reservations come back.
//!
//! The connection runs over any [`Transport`]: a plain TCP socket, or a TLS
//! session on one (`crate::tls`). The code is generic rather than over a
//! boxed stream, so the plain path compiles to what it would be if it knew
//! only `TcpStream`.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::time::{Instant, Sleep, sleep_until};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use super::codec::{Codec, Limits, Request};
use super::command::Command;
use super::failure::failed;
use super::hangup::{HangUp, hung_up};
use super::reply::{Reply, Response};
use super::session::{Outcome, Session, Shared, Wanted};
use crate::store::{ConnId, Store, held};

/// A byte stream a client connection runs over: a `TcpStream` or a
/// `UnixStream`, or a TLS session on one. `Send + 'static` because a
/// connection is a task of its own.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The socket under the stream, watched for the client's hang-up while
    /// the connection does not read it ([`HangUp`]).
    fn socket(&self) -> BorrowedFd<'_>;
}

impl Transport for tokio::net::TcpStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

impl Transport for tokio::net::UnixStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

impl<T: Transport> Transport for tokio_rustls::server::TlsStream<T> {
    fn socket(&self) -> BorrowedFd<'_> {
        self.get_ref().0.socket()
    }
}

type Wire<T> = Framed<T, Codec>;

/// Serves one accepted connection from `peer` (none on a Unix domain
/// socket) to its end, and gives the stream back, everything answered
/// already sent: a TLS session is then ended with a close_notify (a plain
/// socket is just dropped).
pub async fn serve<S: Store, T: Transport>(
    socket: T,
    peer: Option<SocketAddr>,
    conn: ConnId,
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
) -> T {
    held::scope(serve_held(socket, peer, conn, shared, shutdown)).await
}

/// [`serve`], inside the scope where a pipelining client's changes are
/// waited for together (`store::held`).
async fn serve_held<S: Store, T: Transport>(
    socket: T,
    peer: Option<SocketAddr>,
    conn: ConnId,
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
) -> T {
    // Taken from the accept rather than the socket: a TLS stream does not
    // say, and the accept's address is the same one.
    debug!(conn, ?peer, "connection opened");
    let limits = Limits {
        max_job_size: shared.config.max_job_size,
    };
    let mut wire = Framed::new(socket, Codec::new(limits));
    // Framed starts both buffers at 8 KiB; most connections never need that
    // much, and ten thousand idle ones would hold 160 MB for nothing.
    *wire.read_buffer_mut() = BytesMut::with_capacity(IDLE_BUFFER);
    *wire.write_buffer_mut() = BytesMut::new();
    let mut session = Session::open(shared, conn);
    session.peer = peer;
    // A panic (a bug) ends the connection, but not before its jobs and tubes
    // are let go of and it is counted out: unwound without that, its
    // reserved jobs waited for their TTR and the stats counted it for ever.
    let talked = AssertUnwindSafe(converse(&mut wire, &mut session, &shutdown))
        .catch_unwind()
        .await;
    // Counted as closing from here until counted out, so that a command
    // that looks at the server waits for it (`ServerStats::after_hangups`).
    let shared = session.shared.clone();
    shared.stats.begin_close();
    match talked {
        // Whatever was answered before a quit or hang-up still goes out.
        Ok(()) => {
            flush_safe(&mut wire).await;
        }
        Err(_) => error!(
            conn,
            ?peer,
            "a command panicked (a bug): the connection is closed, its jobs and tubes let go of"
        ),
    }
    // Nothing answers what closing changes: let it wait as usual.
    held::pipelining(false);
    // A worker that left holding jobs failed them; a server that stops
    // lets go of them for its own reasons.
    Box::pin(session.close(!shutdown.is_cancelled())).await;
    shared.stats.end_close();
    debug!(conn, ?peer, "connection closed");
    wire.into_inner()
}

/// Reads requests and answers them until the client quits or hangs up,
/// the server stops, or a reply cannot be sent.
async fn converse<S: Store, T: Transport>(
    wire: &mut Wire<T>,
    session: &mut Session<S>,
    shutdown: &CancellationToken,
) {
    // A request read ahead while gathering pipelined puts.
    let mut ahead = None;
    // Whether a command ran out of time since the client last waited for
    // its replies: the commands it sent after it, already read, are overdue
    // too, and are given only a moment each (see `OVERDUE_LIMIT`).
    let mut overdue = false;
    loop {
        let request = match ahead.take() {
            Some(request) => request,
            None => match next_request(wire, shutdown, &mut overdue).await {
                Some(request) => request,
                None => break,
            },
        };
        // A client whose next command is already here is pipelining: its
        // changes need not each wait for the disk before the next runs.
        held::pipelining(ahead.is_some() || !wire.read_buffer().is_empty());
        let next = if is_put(&request) {
            match more_puts(wire, request) {
                // A lone put goes the way of every other command: the
                // run's vectors and joined futures cost it five
                // allocations, a fifth of what a put, reserve and delete
                // allocate between them.
                (Puts::One(put), next) if matches!(put.command, Ok(Command::Put { .. })) => {
                    if !answer(wire, session, put, shutdown, &mut overdue).await {
                        break;
                    }
                    next
                }
                (puts, next) => {
                    if !answer_puts(wire, session, puts.into_vec(), &mut overdue).await {
                        break;
                    }
                    next
                }
            }
        } else {
            if !answer(wire, session, request, shutdown, &mut overdue).await {
                break;
            }
            Ahead::Nothing
        };
        match next {
            Ahead::Nothing => {}
            Ahead::Request(request) => ahead = Some(request),
            Ahead::End => break,
        }
    }
}

/// Answers one request; returns `false` when the connection must end.
async fn answer<S: Store, T: Transport>(
    wire: &mut Wire<T>,
    session: &mut Session<S>,
    request: Request,
    shutdown: &CancellationToken,
    overdue: &mut bool,
) -> bool {
    let started = Instant::now();
    let outcome = match request.command {
        Ok(cmd) => {
            let limit = command_limit(session, *overdue);
            let (ran, flushing) = meanwhile_flush(wire, run_within(session, cmd, limit)).await;
            match ran {
                Some((outcome, in_time)) => {
                    *overdue |= !in_time || used_up(started, flushing, limit);
                    outcome
                }
                None => return false,
            }
        }
        Err(e) => {
            if request.refused_put {
                session.count_refused_put(e);
            }
            Outcome::Reply(e.into())
        }
    };
    let reply = match outcome {
        Outcome::Reply(reply) => reply,
        Outcome::Quit => return false,
        Outcome::Wait(wanted) => {
            if !flush_safe(wire).await {
                return false;
            }
            shrink_when_idle(wire);
            match wait(wire, session, wanted, started, shutdown).await {
                Some(reply) => reply,
                None => return false,
            }
        }
    };
    feed_safe(
        wire,
        Response {
            mode: request.mode,
            reply,
        },
    )
    .await
}

/// Carries out one command within the store's time limit: one the store
/// does not answer in time is `INTERNAL_ERROR`. The HTTP front end runs its
/// commands through here too.
pub async fn run<S: Store>(session: &mut Session<S>, cmd: Command) -> Outcome {
    let limit = session.broker().call_limit();
    run_within(session, cmd, limit).await.0
}

/// [`run`] within `limit`; also says whether it ended in time.
async fn run_within<S: Store>(
    session: &mut Session<S>,
    cmd: Command,
    limit: Option<Duration>,
) -> (Outcome, bool) {
    // Outside the store's time limit: a failed attempt's wait is on
    // purpose, and no store call is made.
    if let Command::Auth(token) = &cmd {
        return (Outcome::Reply(session.authenticate(token).await), true);
    }
    let mut watchdog = session.watchdog(limit);
    // Boxed: the command's future is large and short-lived, and a
    // connection blocked in `reserve` should not carry its room.
    let outcome = within(watchdog.as_mut(), Box::pin(session.handle(cmd))).await;
    session.keep_watchdog(watchdog);
    match outcome {
        Some(outcome) => (outcome, true),
        None => (Outcome::Reply(failed(session.id, out_of_time())), false),
    }
}

/// How long a command of a pipelined run behind one that ran out of time
/// may take. Its reply is overdue already: it was sent with the one that
/// ran out of time, whose limit has passed. Given the whole limit, each
/// such command would wait it out in turn while the store does not answer
/// (a reviewer's 100 commands in one write were answered after 160 s, all
/// at once); given this, a hundred are answered within about 2 s more,
/// while a store that answers again still has time to.
const OVERDUE_LIMIT: Duration = Duration::from_millis(20);

/// Whether a command begun at `started` used up most of its `limit`, not
/// counting the time its connection spent `flushing` replies to its client
/// meanwhile (a client slow to read says nothing of the store): it ran out
/// of time, or nearly, before the store answered or gave up on a call, so
/// the commands sent with it are overdue.
fn used_up(started: Instant, flushing: Duration, limit: Option<Duration>) -> bool {
    limit.is_some_and(|limit| started.elapsed().saturating_sub(flushing) >= limit * 3 / 4)
}

/// The time limit of a command (none on an engine that sets none).
fn command_limit<S: Store>(session: &Session<S>, overdue: bool) -> Option<Duration> {
    let limit = session.broker().call_limit()?;
    Some(if overdue {
        limit.min(OVERDUE_LIMIT)
    } else {
        limit
    })
}

/// How long a command may keep the replies queued before it from going
/// out: replies wait for the next ones of a pipelined run so that they
/// leave together, but not for a command that takes its time (the store
/// slow or not answering), whose client is waiting for those before it.
const FLUSH_AFTER: Duration = Duration::from_millis(10);

/// `work`, which does not touch `wire`; if replies are queued and it is not
/// done within [`FLUSH_AFTER`], they are sent meanwhile. Also returns how
/// long that took. `None`: the connection must end (they could not be
/// sent).
async fn meanwhile_flush<T: Transport, F: std::future::Future>(
    wire: &mut Wire<T>,
    work: F,
) -> (Option<F::Output>, Duration) {
    if wire.write_buffer().is_empty() {
        return (Some(work.await), Duration::ZERO);
    }
    tokio::pin!(work);
    tokio::select! {
        biased;
        done = &mut work => return (Some(done), Duration::ZERO),
        () = tokio::time::sleep(FLUSH_AFTER) => {}
    }
    let flushing = Instant::now();
    if !flush_safe(wire).await {
        return (None, flushing.elapsed());
    }
    let flushing = flushing.elapsed();
    (Some(work.await), flushing)
}

/// Sends the queued replies once every change they answer is safe; false
/// when the connection must end. If a held change could not be made safe
/// (the log failed), no queued reply goes out: some of them would
/// acknowledge what may be lost, and the client is told by the hang-up.
async fn flush_safe<T: Transport>(wire: &mut Wire<T>) -> bool {
    if let Err(e) = held::until_safe().await {
        tracing::warn!(error = %e, "a pipelined change could not be made safe; closing the connection unanswered");
        wire.write_buffer_mut().clear();
        return false;
    }
    wire.flush().await.is_ok()
}

/// Queues a reply; sends what is queued first whenever the queue is full
/// (once it is safe to), between the reply's pieces too, so that a large
/// reply is held a piece at a time. False when the connection must end.
async fn feed_safe<T: Transport>(wire: &mut Wire<T>, response: Response) -> bool {
    let mut made = 0;
    for piece in 0..response.pieces() {
        // Framed writes its buffer out once it reaches the boundary, before
        // taking another reply: that write must wait for the held changes too.
        if wire.write_buffer().len() >= wire.backpressure_boundary() && !flush_safe(wire).await {
            return false;
        }
        made += response.encode_piece(piece, wire.write_buffer_mut());
        // A client that reads as fast as the reply is made would keep the
        // runtime thread here for the whole of it (0.8 s for 393 MB of JSON
        // schedules); the other connections get their turns between. The
        // bytes of an export page's lines count when they are counted too,
        // before any is written (45 MB of schedules in 512 lines held up
        // others for 0.3 s when only pieces counted there).
        if made >= YIELD_AFTER {
            made = 0;
            tokio::task::yield_now().await;
        }
    }
    true
}

/// The most of a reply made, written or counted, before the other tasks
/// get a turn.
const YIELD_AFTER: usize = 1 << 20;

/// Most pipelined puts taken together.
const MAX_PUTS: usize = 256;

/// What follows a run of puts in the read buffer.
enum Ahead {
    /// Nothing decoded yet.
    Nothing,
    /// A request that is not a put.
    Request(Request),
    /// The client hung up (or the read failed) after the puts.
    End,
}

fn is_put(request: &Request) -> bool {
    // An import inserts a job as a put does, and is gathered the same way.
    matches!(
        request.command,
        Ok(Command::Put { .. } | Command::Import(_))
    )
}

/// A run of puts read together.
enum Puts {
    /// One alone (the usual case: a client that waits for each reply).
    One(Request),
    /// Several, pipelined.
    Many(Vec<Request>),
}

impl Puts {
    fn into_vec(self) -> Vec<Request> {
        match self {
            Puts::One(put) => vec![put],
            Puts::Many(puts) => puts,
        }
    }
}

/// `first` and the puts that follow it already in the read buffer (a
/// client pipelining its puts), up to [`MAX_PUTS`], and what comes after.
fn more_puts<T: Transport>(wire: &mut Wire<T>, first: Request) -> (Puts, Ahead) {
    let second = match wire.next().now_or_never() {
        None => return (Puts::One(first), Ahead::Nothing),
        Some(Some(Ok(next))) if is_put(&next) => next,
        Some(Some(Ok(next))) => return (Puts::One(first), Ahead::Request(next)),
        Some(Some(Err(_)) | None) => return (Puts::One(first), Ahead::End),
    };
    let mut puts = vec![first, second];
    while puts.len() < MAX_PUTS {
        match wire.next().now_or_never() {
            None => break,
            Some(Some(Ok(next))) if is_put(&next) => puts.push(next),
            Some(Some(Ok(next))) => return (Puts::Many(puts), Ahead::Request(next)),
            Some(Some(Err(_)) | None) => return (Puts::Many(puts), Ahead::End),
        }
    }
    (Puts::Many(puts), Ahead::Nothing)
}

/// Answers a run of puts, in order; returns `false` when the connection
/// must end.
async fn answer_puts<S: Store, T: Transport>(
    wire: &mut Wire<T>,
    session: &mut Session<S>,
    puts: Vec<Request>,
    overdue: &mut bool,
) -> bool {
    let modes: Vec<_> = puts.iter().map(|put| put.mode).collect();
    let commands = puts
        .into_iter()
        .filter_map(|put| put.command.ok())
        .collect();
    let n = modes.len();
    let started = Instant::now();
    let limit = command_limit(session, *overdue);
    let mut watchdog = session.watchdog(limit);
    let work = within(watchdog.as_mut(), session.handle_puts(commands));
    let (Some(replies), flushing) = meanwhile_flush(wire, work).await else {
        return false;
    };
    session.keep_watchdog(watchdog);
    *overdue |= replies.is_none() || used_up(started, flushing, limit);
    let replies =
        replies.unwrap_or_else(|| (0..n).map(|_| failed(session.id, out_of_time())).collect());
    for (mode, reply) in modes.into_iter().zip(replies) {
        if !feed_safe(wire, Response { mode, reply }).await {
            return false;
        }
    }
    true
}

/// The next request: from the read buffer if one is there, else after
/// flushing queued replies and waiting for the client. `None` ends the
/// connection (hang-up, read error, or shutdown while idle).
async fn next_request<T: Transport>(
    wire: &mut Wire<T>,
    shutdown: &CancellationToken,
    overdue: &mut bool,
) -> Option<Request> {
    let polled = match wire.next().now_or_never() {
        Some(polled) => polled,
        None => {
            if !flush_safe(wire).await {
                return None;
            }
            // The client has every reply: what it sends next is new.
            *overdue = false;
            shrink_when_idle(wire);
            tokio::select! {
                polled = wire.next() => polled,
                () = shutdown.cancelled() => return None,
            }
        }
    };
    polled?.ok()
}

/// Read buffer capacity of a connection between commands.
const IDLE_BUFFER: usize = 256;
/// A buffer larger than this (a big body went through it) is let go while
/// the connection waits for its client.
const KEEP_BUFFER: usize = 4096;

/// Lets go of buffers a big body made large, so that an idle connection
/// costs little however much went through it.
fn shrink_when_idle<T: Transport>(wire: &mut Wire<T>) {
    if wire.read_buffer().is_empty() && wire.read_buffer().capacity() > KEEP_BUFFER {
        *wire.read_buffer_mut() = BytesMut::with_capacity(IDLE_BUFFER);
    }
    if wire.write_buffer().is_empty() && wire.write_buffer().capacity() > KEEP_BUFFER {
        *wire.write_buffer_mut() = BytesMut::new();
    }
}

/// `work`'s result, or `None` if there is a `watchdog` and it goes off
/// first.
async fn within<T>(
    watchdog: Option<&mut Pin<Box<Sleep>>>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    let Some(watchdog) = watchdog else {
        return Some(work.await);
    };
    tokio::select! {
        // The work first: one that is done is answered, even if its time
        // ran out while it was being done.
        biased;
        done = work => Some(done),
        () = watchdog.as_mut() => None,
    }
}

/// Why a command that ran out of time failed.
fn out_of_time() -> crate::error::StoreError {
    crate::error::StoreError::Unavailable("the store did not answer in time".into())
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Most bytes read ahead from a client while it is blocked in `reserve`;
/// past this the server stops reading until the reserve is answered, and
/// watches the socket for the client's hang-up alone.
const READ_AHEAD: usize = 64 * 1024;

/// Blocks in `reserve`. Returns the reply, or `None` if the client left or
/// the server is shutting down.
///
/// Meanwhile the socket is still read, so a hang-up is seen at once; the
/// bytes read (pipelined commands) are not decoded but put back in the read
/// buffer afterwards, to be answered in order once the reserve is. Past
/// [`READ_AHEAD`] the hang-up is watched for without reading ([`HangUp`]):
/// behind the unread bytes, reading would not see it, and a client that
/// pipelined more than that and left stayed a waiter for good.
async fn wait<S: Store, T: Transport>(
    wire: &mut Wire<T>,
    session: &mut Session<S>,
    wanted: Wanted,
    started: Instant,
    shutdown: &CancellationToken,
) -> Option<Reply> {
    let soon_at = session.deadline_soon_at();
    let mut blocked = session.block(wanted, started);
    let timeout_at = blocked.timeout_at();
    let mut ahead = BytesMut::new();
    let mut hangup = None;
    let give_up = loop {
        let full = ahead.len() >= READ_AHEAD;
        if full && hangup.is_none() {
            hangup = HangUp::watch(wire.get_ref().socket(), &session.shared.client_files);
        }
        tokio::select! {
            handed = blocked.handed() => {
                wire.read_buffer_mut().extend_from_slice(&ahead);
                return Some(blocked.deliver(session, handed).await);
            }
            () = sleep_until_some(timeout_at) => break Some(Reply::TimedOut),
            () = sleep_until_some(soon_at) => break Some(Reply::DeadlineSoon),
            // Cancel-safe: a read that loses the race has taken nothing.
            // Through the stream rather than the raw socket, so a TLS
            // session's bytes already decrypted are seen too.
            read = wire.get_mut().read_buf(&mut ahead), if !full => {
                match read {
                    // `ahead` always has room, so 0 is the end of input.
                    Ok(0) | Err(_) => break None,
                    Ok(_) => {}
                }
            }
            () = hung_up(hangup.as_ref()), if full => break None,
            () = shutdown.cancelled() => break None,
        }
    };
    wire.read_buffer_mut().extend_from_slice(&ahead);
    blocked.end(session, give_up).await
}
