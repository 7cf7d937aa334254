//! The admin command line: `delayq <subcommand>` talks to a running server
//! over its text protocol, prints what it found and exits with a code a
//! script can test.
//!
//! * [`Command`] is the subcommands and their flags (clap), checked before
//!   anything connects, so a bad tube name or id is a usage error.
//! * [`client`] speaks the protocol: a line out, a line (and a YAML
//!   document or a job body) back.
//! * [`yaml`] reads the server's documents, and turns them into JSON.
//! * `commands.rs` carries out the subcommands that take one round trip or
//!   a few; `drain.rs` the one that waits.
//!
//! A subcommand is a variant of [`Command`], an arm in [`run`] and one
//! function that returns an [`Outcome`] or a [`Fault`]; commands that
//! stream jobs (an export, an import) fit the same shape, with
//! [`Client::send_with_body`](client::Client::send_with_body) for the
//! bodies they send.

pub mod client;
mod commands;
mod drain;
mod transfer;
pub mod yaml;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use crate::names::{JobId, Tube};
use client::{Client, Fault};

/// The server the subcommands talk to unless `--server` says otherwise:
/// where `delayq` listens by default.
pub const DEFAULT_SERVER: &str = "127.0.0.1:11300";

/// Exit code: the command was carried out.
pub const EXIT_DONE: u8 = 0;
/// Exit code: the server answered, but there was nothing to do or show
/// (no such job or tube, nothing kicked), or `drain` timed out.
pub const EXIT_NOTHING: u8 = 1;
/// Exit code: the command line is wrong (clap exits with it).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the server could not be reached, failed, or answered with an
/// error.
pub const EXIT_FAULT: u8 = 3;

/// The admin subcommands. Each one connects to `--server`, runs a few
/// commands and exits; exit codes: 0 done, 1 nothing done or found (each
/// subcommand says when), 2 usage error, 3 cannot connect or server error.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Print the server's stats, or a tube's.
    ///
    /// The YAML document as the server sends it, or a JSON object with
    /// --json. Exit 1: no such tube.
    Stats {
        /// Show this tube's stats (`stats-tube`) instead of the server's.
        #[arg(value_name = "TUBE", value_parser = tube_name)]
        tube: Option<String>,
        /// Print a JSON object instead of the server's YAML.
        #[arg(long)]
        json: bool,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Print the names of the tubes that exist, one a line.
    ///
    /// A tube exists while it holds jobs or a connection uses or watches it.
    Tubes {
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a tube's next ready, delayed or buried job.
    ///
    /// A line `ID BYTES`, then the body (exactly BYTES bytes) and a newline.
    /// Exit 1: no such job (an unknown tube has none).
    Peek {
        /// The tube to look in.
        #[arg(value_name = "TUBE", value_parser = tube_name)]
        tube: String,
        /// Which of its jobs.
        #[arg(long, value_enum, default_value_t = State::Ready)]
        state: State,
        /// Print the body alone, byte for byte, without the `ID BYTES` line.
        #[arg(long)]
        body: bool,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a job by its id.
    ///
    /// Printed as `peek` prints it. Exit 1: no such job.
    PeekJob {
        /// A server id (digits) or a client-chosen id.
        #[arg(value_name = "ID", value_parser = job_id)]
        id: String,
        /// Print the body alone, byte for byte, without the `ID BYTES` line.
        #[arg(long)]
        body: bool,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Kick up to N of a tube's jobs to ready, and print how many.
    ///
    /// Buried jobs, those buried longest ago first; if none is buried,
    /// delayed ones, those due soonest first. Exit 1: none moved.
    Kick {
        /// The tube to kick in.
        #[arg(value_name = "TUBE", value_parser = tube_name)]
        tube: String,
        /// The most jobs to move.
        #[arg(value_name = "N")]
        count: u64,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Delete jobs by id, and report each one.
    ///
    /// One line for each id, `deleted ID` or `not found ID`. A job reserved
    /// by a worker cannot be deleted, and is not found. Exit 1: some were
    /// not found.
    Delete {
        /// Server ids (digits) or client-chosen ids.
        #[arg(value_name = "ID", required = true, value_parser = job_id)]
        ids: Vec<String>,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Pause a tube: no reserve takes its jobs for SECONDS.
    ///
    /// 0 ends a pause. Exit 1: no such tube.
    Pause {
        /// The tube to pause.
        #[arg(value_name = "TUBE", value_parser = tube_name)]
        tube: String,
        /// How long, in seconds.
        #[arg(value_name = "SECONDS")]
        seconds: u32,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Wait until a tube's jobs are all worked.
    ///
    /// Waits until the tube has no ready, delayed or reserved jobs, with a
    /// progress bar on a terminal. Buried jobs wait for a person, so they
    /// count only with --include-buried. Exit 1: timed out.
    Drain {
        /// The tube to wait for. A tube that does not exist holds no jobs,
        /// so it is drained.
        #[arg(value_name = "TUBE", value_parser = tube_name)]
        tube: String,
        /// Give up after this many seconds (fractions allowed). Default:
        /// wait for as long as it takes.
        #[arg(long, value_name = "SECONDS", value_parser = seconds)]
        timeout: Option<Duration>,
        /// Wait for the buried jobs too (deleted or kicked and worked).
        #[arg(long)]
        include_buried: bool,
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Write every job of the server to standard output, as JSON lines.
    ///
    /// One line per job with every field (id, tube, state, priority, times,
    /// counters, options, body), in the form `import` reads, to move a
    /// deployment to another engine. Jobs put or moved while it runs may
    /// be missed: stop producers and workers first. Needs an admin token
    /// without a tube prefix when tokens are on.
    Export {
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
    /// Put the jobs of an export (standard input) into the server.
    ///
    /// Each job keeps its client id, state, priority, due time (a job due
    /// while it was away is ready at once), counters and body; a server id
    /// is kept unless the server handed it out already. A job that is
    /// there already is skipped, so an import that stopped can be run
    /// again. Exit 3: some lines were refused (each is reported).
    Import {
        /// Where the server is.
        #[command(flatten)]
        remote: Remote,
    },
}

/// Where the server is, and how to sign in: flags every subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct Remote {
    /// The server to talk to (a name is resolved), or `unix:PATH` for one
    /// listening on a Unix domain socket.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_SERVER, value_parser = server_addr)]
    pub server: String,
    /// The token to authenticate with, when the server has tokens on.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "DELAYQ_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Connect over TLS, trusting the certificate (or the issuer's) in
    /// this PEM file; the server's certificate must name the host of
    /// --server.
    #[arg(long, value_name = "PATH", env = "DELAYQ_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
}

/// A state `peek` looks in.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The job `reserve` would take next (`peek-ready`).
    Ready,
    /// The delayed job due soonest (`peek-delayed`).
    Delayed,
    /// The buried job `kick` would take first (`peek-buried`).
    Buried,
}

/// How a subcommand ended, when the server answered as the protocol says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It was carried out: exit 0.
    Done,
    /// There was nothing to do or to show, or it timed out: exit 1.
    Nothing,
}

/// Runs one subcommand and returns the process's exit code. What it found
/// goes to standard output; why it did nothing, or failed, to standard
/// error.
pub async fn run(command: Command) -> ExitCode {
    match dispatch(command).await {
        Ok(Outcome::Done) => ExitCode::from(EXIT_DONE),
        Ok(Outcome::Nothing) => ExitCode::from(EXIT_NOTHING),
        Err(fault) => {
            eprintln!("delayq: {fault}");
            ExitCode::from(EXIT_FAULT)
        }
    }
}

async fn dispatch(command: Command) -> Result<Outcome, Fault> {
    match command {
        Command::Stats { tube, json, remote } => {
            commands::stats(&mut remote.connect().await?, tube.as_deref(), json).await
        }
        Command::Tubes { remote } => commands::tubes(&mut remote.connect().await?).await,
        Command::Peek {
            tube,
            state,
            body,
            remote,
        } => commands::peek(&mut remote.connect().await?, &tube, state, body).await,
        Command::PeekJob { id, body, remote } => {
            commands::peek_job(&mut remote.connect().await?, &id, body).await
        }
        Command::Kick {
            tube,
            count,
            remote,
        } => commands::kick(&mut remote.connect().await?, &tube, count).await,
        Command::Delete { ids, remote } => {
            commands::delete(&mut remote.connect().await?, &ids).await
        }
        Command::Pause {
            tube,
            seconds,
            remote,
        } => commands::pause(&mut remote.connect().await?, &tube, seconds).await,
        Command::Drain {
            tube,
            timeout,
            include_buried,
            remote,
        } => {
            let wait = drain::Drain {
                tube,
                timeout,
                include_buried,
            };
            wait.run(&mut remote.connect().await?).await
        }
        Command::Export { remote } => {
            let mut client = remote.connect().await?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            transfer::export(&mut client, &mut out).await
        }
        Command::Import { remote } => {
            let mut client = remote.connect().await?;
            let stdin = std::io::stdin();
            let size = input_size(&stdin);
            transfer::import(&mut client, &mut stdin.lock(), size).await
        }
    }
}

/// The length of standard input if it is a file, for a progress bar.
fn input_size(stdin: &std::io::Stdin) -> Option<u64> {
    use std::os::fd::AsFd;
    let file = std::fs::File::from(stdin.as_fd().try_clone_to_owned().ok()?);
    let meta = file.metadata().ok()?;
    meta.is_file().then_some(meta.len())
}

impl Remote {
    async fn connect(&self) -> Result<Client, Fault> {
        let mut client = Client::connect(&self.server, self.tls_ca.as_deref()).await?;
        if let Some(token) = &self.token {
            let line = format!("auth {token}");
            let reply = client.command(&line).await?;
            if reply != "AUTHENTICATED" {
                return Err(Fault::Server(format!("auth: {reply}")));
            }
        }
        Ok(client)
    }
}

/// Writes to standard output. A failed write is ignored: the reader went
/// away (`delayq tubes | head -1`), which is no fault of the server's, and
/// the command has been carried out by then.
fn out(bytes: &[u8]) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(bytes).and_then(|()| stdout.flush());
}

/// clap's check of a tube name: the server's own rules, so a bad name is a
/// usage error (exit 2), not a `BAD_FORMAT` from the server.
fn tube_name(raw: &str) -> Result<String, String> {
    Tube::parse(raw.as_bytes())
        .map(|t| t.as_str().to_string())
        .ok_or_else(|| {
            "a tube name is 1 to 200 letters, digits and -+/;.$_(), not starting with -".into()
        })
}

/// clap's check of a job id, by the server's rules.
fn job_id(raw: &str) -> Result<String, String> {
    JobId::parse(raw.as_bytes())
        .map(|id| id.to_string())
        .ok_or_else(|| {
            "a job id is a number, or 1 to 200 letters, digits and -+/;.$_():@ \
             (not starting with -, not all digits)"
                .into()
        })
}

/// clap's check of `--server`: `HOST:PORT` (or `unix:PATH`), so a forgotten
/// port is a usage error rather than a failure to connect.
fn server_addr(raw: &str) -> Result<String, String> {
    if let Some(path) = raw.strip_prefix("unix:") {
        return if path.is_empty() {
            Err("expected unix:PATH, the server's socket file".into())
        } else {
            Ok(raw.to_string())
        };
    }
    match raw.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(raw.to_string())
        }
        _ => Err("expected HOST:PORT, such as 127.0.0.1:11300".into()),
    }
}

/// clap's check of a number of seconds, fractions allowed.
fn seconds(raw: &str) -> Result<Duration, String> {
    raw.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| "expected a number of seconds, such as 30 or 0.5".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_by_the_servers_rules() {
        assert!(tube_name("orders").is_ok());
        assert!(tube_name("-orders").is_err());
        assert!(tube_name("a:b").is_err());
        assert_eq!(job_id("42").as_deref(), Ok("42"));
        assert!(job_id("order-close:4711").is_ok());
        assert!(job_id("-1").is_err());
        assert!(server_addr("localhost:11300").is_ok());
        assert!(server_addr("[::1]:11300").is_ok());
        assert!(server_addr("localhost").is_err());
        assert!(server_addr(":11300").is_err());
        assert!(server_addr("host:70000").is_err());
        assert!(server_addr("unix:/run/delayq.sock").is_ok());
        assert!(server_addr("unix:").is_err());
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert!(seconds("-1").is_err());
        assert!(seconds("soon").is_err());
    }
}
