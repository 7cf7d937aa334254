//! The `delayq` binary: flags, logging, signals, the engine, then
//! [`delayq::server::run`]; or, given a subcommand, the admin client
//! [`delayq::cli::run`].

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use tokio::net::{TcpListener, TcpSocket, UnixListener};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use delayq::clock::Clock;
use delayq::config::{Config, Engine, Flags, Settings};
use delayq::server::{Control, Listener, MAX_LINGERING, raise_fd_limit, run_with_http};
use delayq::store::Store;
use delayq::store::memory::MemoryStore;
use delayq::store::redis::RedisStore;

/// What is logged unless `RUST_LOG` says otherwise. The redis crate's own
/// warnings are left out: during a cluster failover it wrote one or two
/// thousand of them in 3 s (each slot refresh, each failed connection),
/// where delayq says what matters once a second.
const DEFAULT_LOG: &str = "info,redis=error";

fn main() -> ExitCode {
    let mut flags = Flags::parse();
    if let Some(command) = flags.command.take() {
        return match runtime() {
            Ok(runtime) => runtime.block_on(delayq::cli::run(command)),
            Err(e) => no_runtime(&e),
        };
    }
    // rediss:// URLs use rustls; pick its crypto once for the process. An
    // error only means a provider was installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Colours only for someone at a terminal: a journal, a log file or a
    // container's log would keep the escape codes as text.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_LOG.into()))
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        // A log whose reader has gone (a `| logger` that died) must not
        // stop the server. By default a failed write is reported with
        // `eprintln!`, which panics on the same broken pipe: at start, or
        // in the task that logged, such as the one that handles SIGTERM.
        .log_internal_errors(false)
        .init();
    // Under a file-size limit (`ulimit -f`, a unit's LimitFSIZE) a write
    // past it kills the process with SIGXFSZ, every client cut off and
    // nothing said. Ignored, the write fails with EFBIG instead, which the
    // log reports and outlives as it does a full disk.
    // SAFETY: setting a signal's disposition to "ignore" before any thread
    // starts; no handler runs.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let settings = match flags.settings() {
        Ok(settings) => settings,
        Err(why) => {
            error!("{why}");
            return ExitCode::from(2);
        }
    };
    // One thread for every engine. A second one for the durable default,
    // whose replies wait for syncs, was ahead on the machines of November
    // (about 15 % more cycles a second), but on 2026-12-06, in nine
    // alternated pairs of 6 s `cycle` runs, one thread did 25,195 to
    // 34,775 cycles/s against 20,905 to 29,859 on two (more in every
    // pair), with a lower cycle p99 in every pair (2.77 to 3.74 ms against
    // 3.33 to 4.57) and less CPU a cycle. On one thread, too, events are
    // handled in the order they come, as beanstalkd handles them: a `stats`
    // sent right after another connection hung up counted that connection
    // as still open in 24 of 300 tries on two threads, none on one.
    match runtime() {
        Ok(runtime) => runtime.block_on(serve_settings(settings)),
        Err(e) => no_runtime(&e),
    }
}

/// The runtime: the caller's own thread.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn no_runtime(e: &std::io::Error) -> ExitCode {
    // Not `eprintln!`, which panics if standard error is a broken pipe.
    let _ = writeln!(std::io::stderr(), "delayq: cannot start the runtime: {e}");
    ExitCode::FAILURE
}

async fn serve_settings(settings: Settings) -> ExitCode {
    // A socket file is removed however this function returns.
    let (listener, at, _socket_file) = if let Some(path) = settings.listen.strip_prefix("unix:") {
        match listen_unix(Path::new(path)) {
            Ok((listener, at)) => (listener, at, SocketFile::of(Path::new(path))),
            Err(why) => {
                error!("{why}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        let Some(addr) = resolve(&settings.listen, settings.port).await else {
            return ExitCode::from(2);
        };
        match listen(addr) {
            Ok(listener) => {
                let at = listener
                    .local_addr()
                    .map_or_else(|_| addr.to_string(), |a| a.to_string());
                (Listener::Tcp(listener), at, None)
            }
            Err(e) => {
                error!(%addr, error = %e, "cannot listen");
                return ExitCode::FAILURE;
            }
        }
    };
    let http = match &settings.http {
        None => None,
        Some(at) => {
            let Some(addr) = resolve_pair(at).await else {
                return ExitCode::from(2);
            };
            match listen(addr) {
                Ok(listener) => Some(listener),
                Err(e) => {
                    error!(%addr, error = %e, "cannot listen for HTTP");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let files = raise_fd_limit();
    info!(open_files = files, "file descriptor limit");
    let config = settings.config(files, MAX_LINGERING);
    let control = Control::default();
    if let Err(e) = watch_signals(control.clone()) {
        error!(error = %e, "cannot install signal handlers");
        return ExitCode::FAILURE;
    }
    let served = match &settings.engine {
        Engine::Memory => serve(listener, &at, http, MemoryStore::new(), config, control).await,
        Engine::Durable(options) => {
            match delayq::store::log::open(options.clone(), Clock::system()) {
                Ok(store) => serve(listener, &at, http, store, config, control).await,
                Err(why) => Err(why),
            }
        }
        Engine::Redis { target, options } => {
            match RedisStore::open(target.clone(), options.clone()).await {
                Ok(store) => serve(listener, &at, http, store, config, control).await,
                Err(e) => Err(format!("cannot connect to Redis: {e}")),
            }
        }
    };
    match served {
        Ok(()) => {
            info!("delayq stopped");
            ExitCode::SUCCESS
        }
        Err(why) => {
            error!("{why}");
            ExitCode::FAILURE
        }
    }
}

/// Serves on `store` until shutdown; `at` says where `listener` listens.
async fn serve<S: Store>(
    listener: Listener,
    at: &str,
    http: Option<TcpListener>,
    store: S,
    config: Config,
    control: Control,
) -> Result<(), String> {
    info!(
        addr = at,
        max_job_size = config.max_job_size,
        max_connections = config.max_connections,
        engine = store.describe(),
        tls = config.tls.is_some(),
        "delayq listening"
    );
    if config.tls.is_some() {
        info!("TLS on: the text port and --http accept TLS clients only");
    }
    run_with_http(listener, http, store, config, control).await;
    Ok(())
}

/// The longest listen queue asked for; the kernel caps it at its own
/// `somaxconn` (4096 on current Linux).
const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `addr` with a queue as long as the kernel allows (tokio's
/// `bind` asks for 1024): thousands of clients connecting at once wait
/// there for the accept loop, rather than being reset when it is full.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As tokio's `bind` does: a restarted server gets its port back at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Listens on a Unix domain socket at `path`, as beanstalkd's
/// `-l unix:PATH` does, and says where (the path as given).
///
/// A socket file left there by a server that is gone (killed, or the
/// machine lost power) is replaced, as beanstalkd replaces any; one that a
/// running server still accepts on is not (beanstalkd would take it over,
/// and the other server's clients would silently reach this one from then
/// on), and a file that is not a socket is never removed.
fn listen_unix(path: &Path) -> Result<(Listener, String), String> {
    let shown = path.display();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "cannot listen on {shown}: it exists and is not a socket"
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "cannot listen on {shown}: another server is listening there"
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                warn!(path = %shown, "removing a socket file nobody listens on, to replace it");
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove the old socket {shown}: {e}"))?;
            }
            Err(e) => return Err(format!("cannot listen on {shown}: {e}")),
        }
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot listen on {shown}: {e}"))?;
    Ok((Listener::Unix(listener), format!("unix:{shown}")))
}

/// The socket file this server made, removed when the server stops (the
/// next start would find it in the way), unless another file has taken its
/// place meanwhile: it is known by its inode.
struct SocketFile {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// The socket file at `path` as it is now.
    fn of(path: &Path) -> Option<SocketFile> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        Some(SocketFile {
            dev: meta.dev(),
            ino: meta.ino(),
            path: path.to_path_buf(),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The address of `ADDR:PORT` (a name is resolved).
async fn resolve_pair(at: &str) -> Option<SocketAddr> {
    let Some((host, port)) = at.rsplit_once(':') else {
        error!(%at, "--http wants ADDR:PORT");
        return None;
    };
    let Ok(port) = port.parse() else {
        error!(%at, "--http wants ADDR:PORT");
        return None;
    };
    resolve(host.trim_start_matches('[').trim_end_matches(']'), port).await
}

/// The address to listen on: `listen` is an IP address or a name.
async fn resolve(listen: &str, port: u16) -> Option<SocketAddr> {
    if let Ok(addr) = format!("{listen}:{port}").parse::<SocketAddr>() {
        return Some(addr);
    }
    match tokio::net::lookup_host((listen, port)).await {
        Ok(mut addrs) => {
            let addr = addrs.next();
            if addr.is_none() {
                error!(%listen, "address resolves to nothing");
            }
            addr
        }
        Err(e) => {
            error!(%listen, error = %e, "cannot resolve the listen address");
            None
        }
    }
}

/// SIGINT and SIGTERM shut down gracefully; SIGUSR1 enters drain mode.
fn watch_signals(control: Control) -> std::io::Result<()> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = int.recv() => break,
                _ = term.recv() => break,
                _ = usr1.recv() => {
                    info!("SIGUSR1: draining, new jobs are refused");
                    control.draining.store(true, Ordering::Relaxed);
                }
            }
        }
        info!("signal received: shutting down");
        control.shutdown.cancel();
    });
    Ok(())
}
