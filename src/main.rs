//! The `delayq` binary: flags, logging, signals, then [`delayq::server::run`].

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use delayq::config::{Config, MAX_JOB_SIZE_CEILING};
use delayq::server::{Control, MAX_LINGERING, raise_fd_limit, run};
use delayq::store::memory::MemoryStore;
use delayq::store::redis::RedisStore;

/// A delay-queue job server speaking beanstalkd's protocol.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(short = 'l', value_name = "ADDR", default_value = "127.0.0.1")]
    listen: String,
    /// TCP port to listen on.
    #[arg(short = 'p', value_name = "PORT", default_value_t = 11300)]
    port: u16,
    /// Largest job body in bytes (at most 1073741824).
    #[arg(short = 'z', value_name = "BYTES", default_value_t = 65535)]
    max_job_size: usize,
    /// Store jobs in Redis at this URL (redis://[:password@]host:port/db, or
    /// redis+unix:///path). Without it, jobs live in this process's memory.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Prefix of every Redis key delayq uses (it becomes the keys' hash tag).
    #[arg(long, value_name = "PREFIX", default_value = "delayq:")]
    redis_prefix: String,
    /// Most client connections at once; one more is told
    /// TOO_MANY_CONNECTIONS and closed. Default: what the open-file limit
    /// allows, less a few files for delayq's own use.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
}

/// Files kept back from the connection limit for delayq's own use: the
/// listener, Redis connections, the timer, logging.
const OWN_FILES: usize = 64;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    // rediss:// URLs use rustls; pick its crypto once for the process. An
    // error only means a provider was installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    if args.redis_prefix.contains(['{', '}']) {
        error!("--redis-prefix may not contain braces: delayq adds its own hash tag");
        return ExitCode::from(2);
    }
    let mut max_job_size = args.max_job_size;
    if max_job_size > MAX_JOB_SIZE_CEILING {
        warn!(
            max_job_size,
            "-z is above the ceiling; using {MAX_JOB_SIZE_CEILING}"
        );
        max_job_size = MAX_JOB_SIZE_CEILING;
    }
    let addr = match format!("{}:{}", args.listen, args.port).parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => match tokio::net::lookup_host((args.listen.as_str(), args.port)).await {
            Ok(mut addrs) => match addrs.next() {
                Some(addr) => addr,
                None => {
                    error!(listen = %args.listen, "address resolves to nothing");
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                error!(listen = %args.listen, error = %e, "cannot resolve the listen address");
                return ExitCode::from(2);
            }
        },
    };
    let listener = match TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            error!(%addr, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let files = raise_fd_limit();
    info!(open_files = files, "file descriptor limit");
    // Refused connections linger a moment too, each on a file of its own.
    let allowed = files.saturating_sub(OWN_FILES + MAX_LINGERING).max(1);
    let max_connections = match args.max_connections {
        None => allowed,
        Some(n) if n > allowed => {
            warn!(
                max_connections = n,
                open_files = files,
                "--max-connections is above what the open-file limit allows; using {allowed}"
            );
            allowed
        }
        Some(n) => n,
    };
    let control = Control::default();
    if let Err(e) = watch_signals(control.clone()) {
        error!(error = %e, "cannot install signal handlers");
        return ExitCode::FAILURE;
    }
    let addr = listener.local_addr().unwrap_or(addr);
    let config = Config {
        max_job_size,
        max_connections,
    };
    match &args.redis {
        None => {
            info!(%addr, max_job_size, max_connections, "delayq listening with the embedded engine");
            run(listener, MemoryStore::new(), config, control).await;
        }
        Some(url) => {
            let store = match RedisStore::connect(url, &args.redis_prefix).await {
                Ok(store) => store,
                Err(e) => {
                    error!(error = %e, "cannot connect to Redis");
                    return ExitCode::FAILURE;
                }
            };
            info!(%addr, max_job_size, max_connections, prefix = %args.redis_prefix, "delayq listening with the Redis engine");
            run(listener, store, config, control).await;
        }
    }
    info!("delayq stopped");
    ExitCode::SUCCESS
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
