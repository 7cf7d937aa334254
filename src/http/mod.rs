//! The HTTP front end (`--http ADDR:PORT`, off by default): a JSON API over
//! the same commands as the text protocol, the Prometheus `/metrics`, and
//! the dashboard, all on one listener, built on axum.
//!
//! * `api.rs`: the JSON API under `/v1`, and its OpenAPI document;
//! * `metrics.rs`: `/metrics`, in OpenMetrics text;
//! * `dashboard.rs`: the page at `/`, which works through the API.
//!
//! Every route reaches the store the way a text connection does: it builds
//! a [`crate::protocol::command::Command`] and runs it in a
//! [`crate::protocol::session::Session`], so the rules (validation, the
//! replies, the engine calls) are the text protocol's, written once.
//!
//! [`serve`] is its own accept loop over hyper rather than `axum::serve`,
//! which has neither a connection cap nor a limit on how long a client may
//! take to send its headers: without them a few thousand sockets that
//! trickle a header byte now and then would hold the server's file
//! descriptors for ever.
//!
//! With TLS on (`Config::tls`), each connection's task shakes hands first
//! (ALPN `http/1.1`) and hyper serves the TLS session; the handshake has its
//! own time limit, after which [`HEADER_TIMEOUT`] applies as usual.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::protocol::session::Shared;
use crate::store::Store;

pub mod api;
pub mod dashboard;
pub mod metrics;

/// The connection id every HTTP request acts as: HTTP has no connection
/// that could hold a reservation, so a job reserved over HTTP is held by
/// "HTTP" until it is finished, released, buried or its TTR runs out, and
/// any HTTP request may act on it.
pub const HTTP_CONN: crate::store::ConnId = u64::MAX - 1;

/// Longest a client may take over a request's head (request line and
/// headers), counted from when the connection is ready for one: a fresh
/// connection, or one that has just been answered. A client that is not
/// done by then is disconnected, so an idle keep-alive connection is also
/// closed after this long. Any real client sends its head in one go.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a client may leave its reply unread: a write during which the
/// client took no byte for this long fails (see `Unread`), and the
/// connection is closed. A client that asks for a hundred large jobs and
/// never reads the reply would otherwise hold the reply (several times the
/// jobs' size, once escaped) for as long as it keeps the connection. The
/// jobs stay reserved by HTTP until their TTR, as any job reserved over
/// HTTP.
pub const UNREAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for an HTTP connection to finish the request in
/// flight (a long-poll may have minutes to go): a little less than the
/// text server's 5 s, which also bounds this task, so that HTTP is done
/// within it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// How long a refused connection's input is read and thrown away before it
/// is closed (see [`refuse`]).
const LINGER: Duration = Duration::from_secs(1);

/// Most of a refused connection's request that is waited for before it is
/// answered: any real request head fits.
const MAX_HEAD: usize = 16 * 1024;

/// The whole answer to a connection over the limit, whatever it asked.
const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 48\r\n\
\r\n\
{\"success\":false,\"error\":\"TOO_MANY_CONNECTIONS\"}";

/// Every route, over `shared`.
pub fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    Router::new()
        .merge(api::routes::<S>())
        .merge(metrics::routes::<S>())
        .merge(dashboard::routes::<S>())
        .with_state(shared)
}

/// Serves the HTTP front end on `listener` until `shutdown`.
///
/// At most [`crate::config::Config::max_connections`] HTTP connections are
/// open at once (a bound of their own, beside the text connections', and
/// within [`crate::config::Config::client_files`], which both share); one
/// more is answered 503 `TOO_MANY_CONNECTIONS` and closed, as the text
/// protocol refuses it, rather than left waiting unanswered in the listen
/// queue. A client gets [`HEADER_TIMEOUT`] for each request's head.
/// Request bodies are bounded by the routes themselves (`api/input.rs`).
/// On `shutdown` no connection is accepted, idle ones are closed, and a
/// request in flight (a long-poll, say) gets [`SHUTDOWN_GRACE`] to finish.
pub async fn serve<S: Store>(
    listener: TcpListener,
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, tls = shared.config.tls.is_some(), "HTTP listening");
    }
    let room = Arc::new(Semaphore::new(
        shared.config.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let files = shared.client_files.clone();
    let lingering = Arc::new(Semaphore::new(crate::server::MAX_LINGERING));
    let tls = shared.config.tls.clone();
    let app = router(shared);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Usually out of file descriptors: back off rather than spin.
                warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A descriptor too, from the budget the text connections share.
        let permits = room
            .clone()
            .try_acquire_owned()
            .ok()
            .zip(files.clone().try_acquire_owned().ok());
        let Some(permit) = permits else {
            debug!(%peer, "HTTP connection refused: too many connections");
            refuse(socket, tls.is_some(), &lingering, &tracker);
            continue;
        };
        let _ = socket.set_nodelay(true);
        let _ = socket2::SockRef::from(&socket).set_tcp_keepalive(&crate::server::KEEPALIVE);
        let shutdown = shutdown.clone();
        match &tls {
            None => {
                let fd = socket.as_raw_fd();
                let conn = http.serve_connection(
                    TokioIo::new(Unread::new(socket, fd)),
                    WithCaller::new(&app, peer, fd),
                );
                tracker.spawn(async move {
                    drive(conn, peer, &shutdown).await;
                    drop(permit);
                });
            }
            Some(tls) => {
                let (tls, http, app) = (tls.clone(), http.clone(), app.clone());
                let fd = socket.as_raw_fd();
                tracker.spawn(async move {
                    if let Some(stream) = tls.accept_http(socket, peer, &shutdown).await {
                        let conn = http.serve_connection(
                            TokioIo::new(Unread::new(stream, fd)),
                            WithCaller::new(&app, peer, fd),
                        );
                        drive(conn, peer, &shutdown).await;
                    }
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    tracker.close();
    // Each connection stops within the grace on its own; this only waits.
    tracker.wait().await;
}

/// Serves one HTTP connection to its end, or until `shutdown` and a grace
/// after it.
async fn drive<IO>(
    conn: http1::Connection<TokioIo<Unread<IO>>, WithCaller>,
    peer: SocketAddr,
    shutdown: &CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(SHUTDOWN_GRACE, conn.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    // Bad input, a header timeout or a client gone: the client's affair,
    // and hyper has answered it if it could.
    if let Err(e) = served {
        debug!(%peer, error = %e, "HTTP connection ended");
    }
}

/// Answers a connection over the limit with [`TOO_MANY`] and closes it.
///
/// The answer waits for the request's head (or [`LINGER`], or [`MAX_HEAD`]
/// bytes): an HTTP client takes bytes that come before it has sent its
/// request for a broken connection, and never reads them. Then, as in the
/// text server, the answer is followed by an orderly end of output and what
/// the client still sends is read and dropped for a moment before the
/// close: closing with input unread would make the kernel send a reset,
/// which can destroy the answer before the client reads it. Only a few
/// refusals are so looked after at once, so a flood of them cannot use up
/// the file descriptors the cap is there to keep; the rest are answered at
/// once and closed.
///
/// Over TLS (`tls`) there is no answer, only the orderly close: a 503 would
/// need a full handshake, which an overloaded server should not spend on a
/// client it turns away, and a plaintext one would reach the client as a
/// garbled TLS record. Its handshake fails with the connection closed.
fn refuse(socket: TcpStream, tls: bool, lingering: &Arc<Semaphore>, tracker: &TaskTracker) {
    if tls {
        crate::server::refuse(socket, b"", lingering, tracker);
        return;
    }
    let Ok(permit) = lingering.clone().try_acquire_owned() else {
        // A fresh socket's send buffer is empty: this goes out whole.
        let _ = socket.try_write(TOO_MANY);
        return;
    };
    tracker.spawn(async move {
        let mut socket = socket;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        let read_head = async {
            while let Ok(k @ 1..) = socket.read(&mut buf).await {
                head.extend_from_slice(&buf[..k]);
                if head.len() >= MAX_HEAD || memchr::memmem::find(&head, b"\r\n\r\n").is_some() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, read_head).await;
        let _ = socket.write_all(TOO_MANY).await;
        let _ = socket.shutdown().await;
        let drain = async { while let Ok(1..) = socket.read(&mut buf).await {} };
        let _ = tokio::time::timeout(LINGER, drain).await;
        drop(permit);
    });
}

/// An HTTP connection's stream, whose writes fail once one has been
/// blocked for [`UNREAD_TIMEOUT`] while the client read nothing.
///
/// "Blocked" alone is not "read nothing": the kernel wakes a blocked writer
/// only once half its send buffer (megabytes, as it grows) is free again,
/// which a client reading steadily at 100 KB/s takes longer than the limit
/// to free. So while a write is blocked the socket's queue of bytes the
/// client has not yet taken (`TIOCOUTQ`) is looked at every second; the
/// limit counts from the last time it shrank.
struct Unread<IO> {
    io: IO,
    /// The socket under `io` (its TLS session's too).
    fd: std::os::fd::RawFd,
    /// While a write is blocked, what is known of the client's reading.
    stalled: Option<Stalled>,
}

/// A blocked write: when to look again, the bytes the client had not
/// taken at the last look, and when it last took some.
struct Stalled {
    look: std::pin::Pin<Box<tokio::time::Sleep>>,
    queued: Option<u64>,
    took: tokio::time::Instant,
}

/// How often a blocked write looks whether the client took bytes.
const UNREAD_LOOK: Duration = Duration::from_secs(1);

/// Bytes written to the socket `fd` that its peer has not acknowledged
/// (taken into its own buffer, which a client that reads nothing fills).
#[cfg(target_os = "linux")]
fn unacknowledged(fd: std::os::fd::RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int; `fd` is a socket its `Unread` owns.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (rc == 0).then(|| u64::try_from(n).unwrap_or(0))
}

#[cfg(not(target_os = "linux"))]
fn unacknowledged(_fd: std::os::fd::RawFd) -> Option<u64> {
    None
}

impl<IO> Unread<IO> {
    fn new(io: IO, fd: std::os::fd::RawFd) -> Unread<IO> {
        Unread {
            io,
            fd,
            stalled: None,
        }
    }

    /// What a write that got `polled` answers: blocked while the client
    /// took nothing for [`UNREAD_TIMEOUT`], an error.
    fn limit<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::task::Poll;
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let fd = self.fd;
        let stalled = self.stalled.get_or_insert_with(|| Stalled {
            look: Box::pin(tokio::time::sleep(UNREAD_LOOK)),
            queued: unacknowledged(fd),
            took: tokio::time::Instant::now(),
        });
        loop {
            if stalled.look.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = tokio::time::Instant::now();
            let queued = unacknowledged(fd);
            if let (Some(before), Some(queued)) = (stalled.queued, queued)
                && queued < before
            {
                stalled.took = now;
            }
            stalled.queued = queued;
            if now.duration_since(stalled.took) >= UNREAD_TIMEOUT {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client left its reply unread",
                )));
            }
            stalled.look.as_mut().reset(now + UNREAD_LOOK);
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Unread<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Unread<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.limit(cx, polled)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.limit(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.limit(cx, polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_shutdown(cx);
        self.limit(cx, polled)
    }
}

/// The app for one connection: each request carries the connection's
/// [`api::Caller`], so that a failed token check is logged with the
/// client's address and slowed down by the failures before it on the
/// connection, as on a text connection (each request is a session of its
/// own).
struct WithCaller {
    app: TowerToHyperService<Router>,
    caller: api::Caller,
}

impl WithCaller {
    fn new(app: &Router, peer: SocketAddr, socket: RawFd) -> WithCaller {
        WithCaller {
            app: TowerToHyperService::new(app.clone()),
            caller: api::Caller::new(peer, socket),
        }
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for WithCaller {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
    >>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
    >>::Error;
    type Future = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<hyper::body::Incoming>,
    >>::Future;

    fn call(&self, mut request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.caller.clone());
        self.app.call(request)
    }
}
