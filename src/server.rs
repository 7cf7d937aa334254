//! The accept loop and graceful shutdown.
//!
//! [`run`] takes a listener the caller bound, so tests bind port 0 and run
//! many servers in one process; there are no globals.
//!
//! With TLS on (`Config::tls`) the loop is the same: each connection's task
//! shakes hands first, after it has its place under the limit, so the loop
//! itself never waits on a client.
//!
//! The text protocol is served on a TCP port or, as beanstalkd's
//! `-l unix:PATH` does, on a Unix domain socket ([`Listener`]); a
//! connection is the same either way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::broker::Broker;
use crate::config::Config;
use crate::protocol::connection::{self, Transport};
use crate::protocol::session::Shared;
use crate::protocol::stats::ServerStats;
use crate::store::Store;

/// How long shutdown waits for connections to finish what is in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Longest the server waits for its first timer pass before it accepts.
const FIRST_TICK_WAIT: Duration = Duration::from_secs(1);
/// What a connection over the limit is told before it is closed.
const TOO_MANY: &[u8] = b"TOO_MANY_CONNECTIONS\r\n";
/// What it is told over TLS: nothing. The refusal would have to be
/// encrypted, and a full handshake is what an overloaded server should not
/// spend on a client it turns away; plaintext instead would only reach a
/// TLS client as a garbled record. So it is closed (in the same orderly way)
/// and sees the connection end during its handshake.
const TOO_MANY_TLS: &[u8] = b"";
/// How long a refused connection's input is read and thrown away before it
/// is closed.
const LINGER: Duration = Duration::from_secs(1);
/// How many refused connections may linger so at once: file descriptors
/// the connection limit must leave room for.
pub const MAX_LINGERING: usize = 64;

/// Handles to steer a running server from outside (signals, tests).
#[derive(Clone, Default)]
pub struct Control {
    /// Cancel to stop accepting, finish what is in flight and return.
    pub shutdown: CancellationToken,
    /// Set to make `put` answer `DRAINING` (SIGUSR1).
    pub draining: Arc<AtomicBool>,
}

/// Where the text protocol is served.
pub enum Listener {
    /// A TCP port.
    Tcp(TcpListener),
    /// A Unix domain socket (`-l unix:PATH`): for clients on the same
    /// machine, with the file system's permissions as its access control.
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Listener {
        Listener::Tcp(listener)
    }
}

impl From<UnixListener> for Listener {
    fn from(listener: UnixListener) -> Listener {
        Listener::Unix(listener)
    }
}

/// TCP keepalive on every client connection (the HTTP front end's too). A
/// client that is gone without a word (its machine off, the network cut)
/// would otherwise be held for good, a waiter in `reserve` taking the next
/// job of its tubes, or the holder of its reserved jobs until their TTR:
/// probed after a minute of silence, every 10 s, it is let go about two
/// and a half minutes after it went (Linux gives up after 9 unanswered
/// probes). So is one whose FIN cannot reach the server because its input
/// fills the server's buffers, once its kernel stops trying to send (3 on
/// loopback: 6.5 minutes; held for good without keepalive).
pub(crate) const KEEPALIVE: socket2::TcpKeepalive = socket2::TcpKeepalive::new()
    .with_time(Duration::from_secs(60))
    .with_interval(Duration::from_secs(10));

/// A connection just accepted, and its peer's address (a Unix socket's
/// peer has none worth telling: clients are unnamed).
enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Unix(UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, peer)| Accepted::Tcp(s, peer)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }
}

/// A stream a refusal can be written to at once, without waiting.
pub(crate) trait Refusable: Transport {
    /// Writes what fits in the socket's buffer now (a fresh socket's buffer
    /// is empty, so a short refusal goes out whole).
    fn write_now(&self, bytes: &[u8]);
}

impl Refusable for TcpStream {
    fn write_now(&self, bytes: &[u8]) {
        let _ = self.try_write(bytes);
    }
}

impl Refusable for UnixStream {
    fn write_now(&self, bytes: &[u8]) {
        let _ = self.try_write(bytes);
    }
}

/// Serves `listener` with `store` until `control.shutdown` is cancelled.
pub async fn run<S: Store>(
    listener: impl Into<Listener>,
    store: S,
    config: Config,
    control: Control,
) {
    run_with_http(listener, None, store, config, control).await;
}

/// Serves `listener` with `store`, and the HTTP front end on `http` if
/// given, until `control.shutdown` is cancelled.
pub async fn run_with_http<S: Store>(
    listener: impl Into<Listener>,
    http: Option<TcpListener>,
    store: S,
    config: Config,
    control: Control,
) {
    let listener = listener.into();
    let shared = Arc::new(Shared::new(
        Broker::new(store),
        ServerStats::new(control.draining.clone()),
        config,
    ));
    let tracker = TaskTracker::new();
    if let Some(http) = http {
        let shared = shared.clone();
        let shutdown = control.shutdown.clone();
        tracker.spawn(async move { crate::http::serve(http, shared, shutdown).await });
    }
    // What fell due while the server was down (a restart of the durable
    // engine, jobs due during the outage) is ready before the first command
    // is read: a `reserve-with-timeout 0` at once gets it, rather than race
    // the timer's first pass. Connections wait in the listener's backlog
    // meanwhile. The wait is bounded, so that a shared store that does not
    // answer delays nothing longer; the pass itself runs on to its end in
    // its own task (a store call is not cut off halfway).
    let first = {
        let shared = shared.clone();
        tracker.spawn(async move {
            let _ = shared.broker.tick().await;
        })
    };
    let _ = tokio::time::timeout(FIRST_TICK_WAIT, first).await;
    {
        let shared = shared.clone();
        let shutdown = control.shutdown.clone();
        tracker.spawn(async move { shared.broker.run_timer(shutdown).await });
    }
    {
        let shared = shared.clone();
        let shutdown = control.shutdown.clone();
        tracker.spawn(async move { shared.broker.run_events(shutdown).await });
    }
    {
        let shared = shared.clone();
        let shutdown = control.shutdown.clone();
        tracker.spawn(async move { shared.broker.run_schedules(shutdown).await });
    }
    let admission = Admission {
        next_conn: AtomicU64::new(0),
        room: Arc::new(Semaphore::new(
            shared.config.max_connections.min(Semaphore::MAX_PERMITS),
        )),
        lingering: Arc::new(Semaphore::new(MAX_LINGERING)),
        refusal: if shared.config.tls.is_some() {
            TOO_MANY_TLS
        } else {
            TOO_MANY
        },
        shared: shared.clone(),
        shutdown: control.shutdown.clone(),
        tracker: tracker.clone(),
    };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = control.shutdown.cancelled() => break,
        };
        match accepted {
            Ok(Accepted::Tcp(socket, peer)) => {
                let _ = socket.set_nodelay(true);
                let _ = socket2::SockRef::from(&socket).set_tcp_keepalive(&KEEPALIVE);
                admission.admit(socket, Some(peer));
            }
            Ok(Accepted::Unix(socket)) => admission.admit(socket, None),
            Err(e) => {
                // Usually out of file descriptors: back off rather than spin.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(listener);
    info!("shutting down: finishing open requests");
    tracker.close();
    // A client that never reads its replies could hold a connection forever.
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        warn!("connections still busy after {SHUTDOWN_GRACE:?}; stopping anyway");
    }
    shared.broker.leave().await;
}

/// What the accept loop needs to start a connection's task, or refuse it.
struct Admission<S: Store> {
    next_conn: AtomicU64,
    /// A permit per connection allowed.
    room: Arc<Semaphore>,
    lingering: Arc<Semaphore>,
    refusal: &'static [u8],
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl<S: Store> Admission<S> {
    /// Serves `socket` in a task of its own if the limit allows another
    /// connection, else refuses it.
    fn admit<T: Refusable>(&self, socket: T, peer: Option<SocketAddr>) {
        let permits = self
            .room
            .clone()
            .try_acquire_owned()
            .ok()
            .zip(self.shared.client_files.clone().try_acquire_owned().ok());
        let Some(permit) = permits else {
            debug!(?peer, "connection refused: too many connections");
            refuse(socket, self.refusal, &self.lingering, &self.tracker);
            return;
        };
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed) + 1;
        let shutdown = self.shutdown.clone();
        let shared = self.shared.clone();
        match self.shared.config.tls.clone() {
            None => self.tracker.spawn(async move {
                connection::serve(socket, peer, conn, shared, shutdown).await;
                drop(permit);
            }),
            Some(tls) => self.tracker.spawn(async move {
                if let Some(stream) = tls.accept_text(socket, peer, &shutdown).await {
                    let stream = connection::serve(stream, peer, conn, shared, shutdown).await;
                    crate::tls::close(stream).await;
                }
                drop(permit);
            }),
        };
    }
}

/// Tells a connection over the limit so (`refusal`) and closes it.
///
/// Closing a socket whose input was never read makes the kernel send a
/// reset, which can destroy the refusal before the client has read it (a
/// client that sends a command as soon as it connects would see only
/// "connection reset"). So the refusal is followed by an orderly end of
/// output, and what the client sends is read and dropped for a moment
/// before the close. Only a few refusals linger at once, so a flood of them
/// cannot use up the file descriptors the limit is there to keep. An empty
/// `refusal` is an orderly close without a word (what a TLS client gets:
/// no plaintext can reach it before a handshake).
pub(crate) fn refuse<T: Refusable>(
    socket: T,
    refusal: &'static [u8],
    lingering: &Arc<Semaphore>,
    tracker: &TaskTracker,
) {
    // Said at once and without waiting: a fresh socket's send buffer is
    // empty.
    if !refusal.is_empty() {
        socket.write_now(refusal);
    }
    let Ok(permit) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tracker.spawn(async move {
        let mut socket = socket;
        let _ = socket.shutdown().await;
        let mut sink = [0u8; 1024];
        let drain = async { while let Ok(1..) = socket.read(&mut sink).await {} };
        let _ = tokio::time::timeout(LINGER, drain).await;
        drop(permit);
    });
}

/// Raises this process's soft limit on open files to its hard limit, and
/// returns the limit then in force (1024 if it cannot be read).
///
/// Each client is a file descriptor, and the usual soft limit of 1024 would
/// cap a server (or a load generator, or a test) at about a thousand
/// connections on a machine that allows many more.
pub fn raise_fd_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            warn!(error = %std::io::Error::last_os_error(), "cannot read the file descriptor limit");
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            } else {
                warn!(error = %std::io::Error::last_os_error(), "cannot raise the file descriptor limit");
            }
        }
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}
