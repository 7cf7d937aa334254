//! The command line and the settings it makes: flags are parsed and checked
//! here, so `main.rs` only acts on settings known to be sound.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tracing::warn;

use crate::auth::Tokens;
use crate::store::log::{DEFAULT_FILE_SIZE, Options, SyncPolicy};
use crate::store::redis::Target;
use crate::tls::Tls;

/// beanstalkd's default largest job body, in bytes.
pub const DEFAULT_MAX_JOB_SIZE: usize = 65_535;
/// beanstalkd's hard ceiling on `-z`.
pub const MAX_JOB_SIZE_CEILING: usize = 1_073_741_824;

/// Files kept back from the connection limit for delayq's own use: the
/// listener, Redis connections, the timer, logging.
const OWN_FILES: usize = 64;

/// Settings of one server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest job body accepted, in bytes.
    pub max_job_size: usize,
    /// Most client connections open at once; one more is refused with
    /// `TOO_MANY_CONNECTIONS` and closed.
    pub max_connections: usize,
    /// Most descriptors the clients may hold at once, over both front ends:
    /// a connection (text or HTTP) takes one, and so does the hang-up watch
    /// of a blocked reserve or an HTTP long-poll. What the open-file limit
    /// allows beyond them is kept for delayq's own files: out of
    /// descriptors, the log could not begin its next file, and a durable
    /// server would take no more changes until restarted.
    pub client_files: usize,
    /// The access tokens (`--tokens`); `None`, the default, lets every
    /// client do everything, as beanstalkd does.
    pub tokens: Option<Arc<Tokens>>,
    /// TLS for clients (`--tls-cert`, `--tls-key`): when set, the text and
    /// HTTP listeners speak only TLS. `None`, the default, is plaintext.
    pub tls: Option<Arc<Tls>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_job_size: DEFAULT_MAX_JOB_SIZE,
            max_connections: 100_000,
            client_files: 100_000,
            tokens: None,
            tls: None,
        }
    }
}

/// `--shards`: how many shards a tube's new jobs go to, `None` for one per
/// primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread(pub Option<usize>);

fn parse_shards(s: &str) -> Result<Spread, String> {
    let most = crate::store::redis::SHARDS;
    if s == "primaries" {
        return Ok(Spread(None));
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(Spread(Some(n))),
        _ => Err(format!("a number from 1 to {most}, or `primaries`")),
    }
}

/// A delay-queue job server speaking beanstalkd's protocol.
#[derive(Parser, Debug)]
#[command(
    name = "delayq",
    version,
    about,
    args_conflicts_with_subcommands = true,
    // A flag given twice takes the last value, as beanstalkd's getopt
    // does (a unit file that adds `-f 10` to a command with `-f 50`).
    args_override_self = true
)]
pub struct Flags {
    /// An admin subcommand to run against a running server, instead of
    /// starting one. The server's flags and the subcommands exclude each
    /// other, so a server flag given to a subcommand is an error, not
    /// silently ignored.
    #[command(subcommand)]
    pub command: Option<crate::cli::Command>,
    /// Address to listen on, or `unix:PATH` for a Unix domain socket at
    /// PATH (as in beanstalkd; -p is then not used).
    #[arg(short = 'l', value_name = "ADDR", default_value = "127.0.0.1")]
    pub listen: String,
    /// TCP port to listen on.
    #[arg(short = 'p', value_name = "PORT", default_value_t = 11300)]
    pub port: u16,
    /// Largest job body in bytes (at most 1073741824).
    #[arg(short = 'z', value_name = "BYTES", default_value_t = DEFAULT_MAX_JOB_SIZE)]
    pub max_job_size: usize,
    /// Keep the jobs in this directory (created if missing): in memory, and
    /// in a write-ahead log there, so a restart or a crash loses nothing
    /// acknowledged. One delayq process per directory. Default, unless
    /// another engine is chosen: `delayq-data` in the working directory.
    #[arg(short = 'b', long = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Answer a change once its record is written, and sync at most every MS
    /// milliseconds (beanstalkd's -f). Without -f or -F, a change is synced
    /// before it is answered; -f 0 is the same. Of -f and -F, the last
    /// given wins, as in beanstalkd.
    #[arg(
        short = 'f',
        long = "fsync-every",
        value_name = "MS",
        overrides_with = "no_fsync"
    )]
    pub fsync_every: Option<u64>,
    /// Never sync the log (beanstalkd's -F): a crash of the host may lose
    /// any change; a crash of delayq alone loses nothing answered.
    #[arg(short = 'F', long = "no-fsync", overrides_with = "fsync_every")]
    pub no_fsync: bool,
    /// The size of each log file, in bytes (beanstalkd's -s).
    #[arg(short = 's', long = "log-file-size", value_name = "BYTES", default_value_t = DEFAULT_FILE_SIZE)]
    pub log_file_size: u64,
    /// Start even if the log is damaged, skipping the damaged records (and
    /// saying how many); without it, delayq refuses to start on damage.
    #[arg(long)]
    pub salvage: bool,
    /// Keep the jobs in this process's memory only: a restart loses them.
    #[arg(long, conflicts_with_all = ["data_dir", "fsync_every", "no_fsync", "log_file_size", "salvage", "redis"])]
    pub in_memory: bool,
    /// Store jobs in Redis at this URL (redis://[:password@]host:port/db, or
    /// redis+unix:///path) instead of in a data directory.
    #[arg(long, value_name = "URL", conflicts_with_all = ["data_dir", "fsync_every", "no_fsync", "log_file_size", "salvage", "redis_cluster", "redis_sentinel"])]
    pub redis: Option<String>,
    /// Store jobs in a Redis Cluster reached through these nodes
    /// (comma-separated URLs: redis://host:port,redis://host:port).
    #[arg(long, value_name = "URLS", conflicts_with_all = ["data_dir", "fsync_every", "no_fsync", "log_file_size", "salvage", "redis_sentinel"])]
    pub redis_cluster: Option<String>,
    /// Store jobs in the Redis primary these sentinels name (comma-separated
    /// URLs of sentinels: redis://host:26379,redis://host2:26379), following
    /// its failovers.
    #[arg(long, value_name = "URLS", conflicts_with_all = ["data_dir", "fsync_every", "no_fsync", "log_file_size", "salvage"])]
    pub redis_sentinel: Option<String>,
    /// The name the sentinels know the primary by.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "mymaster",
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_master: String,
    /// On a Redis Cluster, how many of the 64 shards a tube's new jobs are
    /// spread over (1 to 64; order and priority hold within a shard), chosen
    /// evenly among the primaries; `primaries`: one per primary, following
    /// the cluster as it grows (fewer, larger calls to Redis, but server ids
    /// then skip). May be changed on a running deployment: a job is always
    /// found by its id.
    #[arg(long, value_name = "N|primaries", default_value = "64", value_parser = parse_shards, requires = "redis_cluster")]
    pub shards: Spread,
    /// Acknowledge a put only once N replicas of its Redis primary have it
    /// (Redis's WAIT), narrowing what a failover can lose; a put they do not
    /// confirm within --redis-wait-timeout answers INTERNAL_ERROR (the job
    /// may still exist). 0: Redis's own asynchronous replication.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub redis_wait: u32,
    /// How long a put waits for --redis-wait replicas, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub redis_wait_timeout: u64,
    /// On a Redis Cluster, keep this tube's jobs on one shard, so its order
    /// and priorities hold across them (repeatable; a job with a
    /// client-chosen id lives in its id's shard).
    #[arg(long, value_name = "TUBE", requires = "redis_cluster")]
    pub one_shard_tube: Vec<String>,
    /// Prefix of every Redis key delayq uses (it becomes the keys' hash tag).
    #[arg(long, value_name = "PREFIX", default_value = "delayq:")]
    pub redis_prefix: String,
    /// Also serve the HTTP API, /metrics and the dashboard on this address
    /// (`ADDR:PORT`, such as `127.0.0.1:11380`). Off unless given.
    #[arg(long, value_name = "ADDR:PORT")]
    pub http: Option<String>,
    /// Most client connections at once; one more is told
    /// TOO_MANY_CONNECTIONS and closed. Default: what the open-file limit
    /// allows, less a few files for delayq's own use.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Require clients to authenticate with a token from this file (lines
    /// of `TOKEN ROLE[,ROLE...] [PREFIX]`; see the README). Off unless given.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Serve clients over TLS only, with the certificate chain in this PEM
    /// file (the server's certificate first), on the text port and on
    /// --http alike. Needs --tls-key.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, in a PEM file (PKCS#8, PKCS#1 or
    /// SEC1). Needs --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The data directory when none is given: `delayq-data` in the working
/// directory.
pub const DEFAULT_DATA_DIR: &str = "delayq-data";

/// Where the jobs are kept.
#[derive(Debug, Clone)]
pub enum Engine {
    /// In this process's memory only.
    Memory,
    /// In memory and in a write-ahead log in a data directory (the default).
    Durable(Options),
    /// In Redis: one server, a cluster, or a primary Sentinel names.
    Redis {
        /// Where.
        target: crate::store::redis::Target,
        /// How.
        options: crate::store::redis::Options,
    },
}

/// Checked settings, ready to act on.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to listen on, as given (a name is resolved at start).
    pub listen: String,
    /// Port to listen on.
    pub port: u16,
    /// Largest job body.
    pub max_job_size: usize,
    /// The connection limit asked for, if any.
    pub max_connections: Option<usize>,
    /// Where the HTTP front end listens, if it is on (`ADDR:PORT`).
    pub http: Option<String>,
    /// Where the jobs are kept.
    pub engine: Engine,
    /// The access tokens, if they are on.
    pub tokens: Option<Arc<Tokens>>,
    /// TLS for clients, if it is on.
    pub tls: Option<Arc<Tls>>,
}

impl Flags {
    /// Checks the flags; an error says which one is wrong and why.
    pub fn settings(self) -> Result<Settings, String> {
        if self.redis_prefix.contains(['{', '}']) {
            return Err(
                "--redis-prefix may not contain braces: delayq adds its own hash tag".into(),
            );
        }
        if let Some(path) = self.listen.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("-l unix:PATH wants the socket's path".into());
            }
            // A client of a Unix socket is on this machine, and the socket
            // file's permissions say who may connect; a certificate would
            // name no host. TLS there would only lock out the clients
            // (the admin CLI among them) that expect plaintext.
            if self.tls_cert.is_some() {
                return Err("--tls-cert is for TCP clients; -l unix:PATH is served in \
                            plaintext, guarded by the socket file's permissions"
                    .into());
            }
        }
        // Read now, so that a bad file stops the start, not the first client.
        let tokens = match &self.tokens {
            Some(path) => Some(Arc::new(Tokens::load(path)?)),
            None => None,
        };
        // Read now too: a certificate that cannot be used stops the start.
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(Tls::load(cert, key)?)),
            (None, None) => None,
            // clap's `requires` makes these a usage error before we get here.
            (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
        };
        let mut max_job_size = self.max_job_size;
        if max_job_size > MAX_JOB_SIZE_CEILING {
            warn!(
                max_job_size,
                "-z is above the ceiling; using {MAX_JOB_SIZE_CEILING}"
            );
            max_job_size = MAX_JOB_SIZE_CEILING;
        }
        let urls = |list: &str| -> Result<Vec<String>, String> {
            let urls: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect();
            if urls.is_empty() {
                return Err("no URL given".into());
            }
            Ok(urls)
        };
        let target = match (self.redis, self.redis_cluster, self.redis_sentinel) {
            (Some(url), _, _) => Some(Target::Single(url)),
            (_, Some(seeds), _) => Some(Target::Cluster(
                urls(&seeds).map_err(|e| format!("--redis-cluster: {e}"))?,
            )),
            (_, _, Some(sentinels)) => Some(Target::Sentinel {
                sentinels: urls(&sentinels).map_err(|e| format!("--redis-sentinel: {e}"))?,
                master: self.redis_sentinel_master,
            }),
            _ => None,
        };
        let engine = match target {
            Some(target) => Engine::Redis {
                target,
                options: crate::store::redis::Options {
                    prefix: self.redis_prefix,
                    spread: self.shards.0,
                    whole_tubes: self.one_shard_tube,
                    wait: (self.redis_wait > 0)
                        .then_some((self.redis_wait, self.redis_wait_timeout)),
                },
            },
            None if self.in_memory => Engine::Memory,
            None => Engine::Durable(Options {
                dir: self
                    .data_dir
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
                policy: match (self.fsync_every, self.no_fsync) {
                    (_, true) => SyncPolicy::Never,
                    (None | Some(0), false) => SyncPolicy::Always,
                    (Some(ms), false) => SyncPolicy::Every(Duration::from_millis(ms)),
                },
                file_size: self.log_file_size,
                max_job_size,
                salvage: self.salvage,
            }),
        };
        Ok(Settings {
            listen: self.listen,
            port: self.port,
            max_job_size,
            max_connections: self.max_connections,
            http: self.http,
            engine,
            tokens,
            tls,
        })
    }
}

impl Settings {
    /// The server's [`Config`], given how many files this process may open.
    ///
    /// Refused connections linger a moment too, each on a file of its own
    /// (`lingering` of them at most on each front end: the text protocol's,
    /// and `--http`'s when it is on), so the default limit leaves room for
    /// them; a larger limit than the files allow is lowered, with a warning.
    pub fn config(&self, open_files: usize, lingering: usize) -> Config {
        let front_ends = 1 + usize::from(self.http.is_some());
        let allowed = open_files
            .saturating_sub(OWN_FILES + front_ends * lingering)
            .max(1);
        let max_connections = match self.max_connections {
            None => allowed,
            Some(n) if n > allowed => {
                warn!(
                    max_connections = n,
                    open_files,
                    "--max-connections is above what the open-file limit allows; using {allowed}"
                );
                allowed
            }
            Some(n) => n,
        };
        Config {
            max_job_size: self.max_job_size,
            max_connections,
            client_files: allowed,
            tokens: self.tokens.clone(),
            tls: self.tls.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Result<Settings, String> {
        Flags::try_parse_from(std::iter::once("delayq").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?
            .settings()
    }

    fn durable(args: &[&str]) -> Options {
        match settings(args).unwrap().engine {
            Engine::Durable(options) => options,
            other => panic!("{args:?} is not durable: {other:?}"),
        }
    }

    #[test]
    fn flags_become_settings() {
        let s = settings(&[]).unwrap();
        assert_eq!((s.listen.as_str(), s.port), ("127.0.0.1", 11300));
        assert_eq!(s.max_job_size, DEFAULT_MAX_JOB_SIZE);
        let o = durable(&[]);
        assert_eq!(o.dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(o.policy, SyncPolicy::Always);
        assert_eq!(o.file_size, DEFAULT_FILE_SIZE);
        assert!(matches!(
            settings(&["--in-memory"]).unwrap().engine,
            Engine::Memory
        ));
        let s = settings(&["--redis", "redis://x", "-z", "2000000000"]).unwrap();
        assert_eq!(s.max_job_size, MAX_JOB_SIZE_CEILING);
        assert!(
            matches!(s.engine, Engine::Redis { ref options, .. } if options.prefix == "delayq:")
        );
        assert!(settings(&["--redis-prefix", "a{b"]).is_err());
        assert!(settings(&[]).unwrap().tokens.is_none());
        assert!(settings(&["--tokens", "/no/such/file"]).is_err());
    }

    #[test]
    fn shards_are_a_number_or_one_per_primary() {
        let spread = |extra: &[&str]| {
            let mut args = vec!["--redis-cluster", "redis://a:1"];
            args.extend_from_slice(extra);
            settings(&args).map(|s| match s.engine {
                Engine::Redis { options, .. } => options.spread,
                other => panic!("not Redis: {other:?}"),
            })
        };
        assert_eq!(spread(&[]), Ok(Some(64)), "all 64 by default");
        assert_eq!(spread(&["--shards", "3"]), Ok(Some(3)));
        assert_eq!(spread(&["--shards", "primaries"]), Ok(None));
        for bad in ["0", "65", "-1", "many", ""] {
            assert!(spread(&["--shards", bad]).is_err(), "--shards {bad:?}");
        }
        assert!(settings(&["--shards", "3"]).is_err(), "a cluster only");
    }

    #[test]
    fn beanstalkd_flags_mean_what_they_mean_there() {
        let o = durable(&["-b", "/var/lib/delayq", "-f", "50", "-s", "1000000"]);
        assert_eq!(o.dir, PathBuf::from("/var/lib/delayq"));
        assert_eq!(o.policy, SyncPolicy::Every(Duration::from_millis(50)));
        assert_eq!(o.file_size, 1_000_000);
        assert_eq!(durable(&["-f", "0"]).policy, SyncPolicy::Always);
        assert_eq!(durable(&["-F"]).policy, SyncPolicy::Never);
        assert_eq!(
            durable(&["--data-dir", "d", "--fsync-every", "5"]).policy,
            SyncPolicy::Every(Duration::from_millis(5))
        );
        assert!(durable(&["--salvage"]).salvage);
        // The last of -f and -F wins, as in beanstalkd.
        assert_eq!(durable(&["-f", "5", "-F"]).policy, SyncPolicy::Never);
        assert_eq!(
            durable(&["-F", "-f", "50"]).policy,
            SyncPolicy::Every(Duration::from_millis(50))
        );
        assert_eq!(durable(&["-F", "-f", "0"]).policy, SyncPolicy::Always);
        // Given twice, the last wins, as in beanstalkd.
        assert_eq!(
            durable(&["-f", "50", "-f", "10"]).policy,
            SyncPolicy::Every(Duration::from_millis(10))
        );
        assert_eq!(durable(&["-F", "-F"]).policy, SyncPolicy::Never);
        assert_eq!(durable(&["-s", "4096", "-s", "8192"]).file_size, 8192);
        let s = settings(&["-p", "1", "-p", "2", "-l", "a", "-l", "b"]).unwrap();
        assert_eq!((s.listen.as_str(), s.port), ("b", 2));
        // Repeatable flags still gather every value.
        let tubes = match settings(&[
            "--redis-cluster",
            "redis://a:1",
            "--one-shard-tube",
            "x",
            "--one-shard-tube",
            "y",
        ])
        .unwrap()
        .engine
        {
            Engine::Redis { options, .. } => options.whole_tubes,
            other => panic!("not Redis: {other:?}"),
        };
        assert_eq!(tubes, ["x", "y"]);
        assert!(settings(&["--in-memory", "-b", "d"]).is_err());
        // The log's flags all belong to the durable engine alone.
        for log_flag in [
            &["-f", "50"][..],
            &["-F"],
            &["-s", "100000"],
            &["--salvage"],
        ] {
            for engine in [&["--in-memory"][..], &["--redis", "redis://x"]] {
                let args = [engine, log_flag].concat();
                assert!(settings(&args).is_err(), "{args:?} accepted");
            }
        }
        assert!(settings(&["--redis", "redis://x", "-b", "d"]).is_err());
    }

    #[test]
    fn a_unix_socket_needs_a_path_and_no_tls() {
        let s = settings(&["-l", "unix:/run/delayq.sock"]).unwrap();
        assert_eq!(s.listen, "unix:/run/delayq.sock");
        assert!(settings(&["-l", "unix:"]).is_err());
        let e = settings(&[
            "-l",
            "unix:/run/delayq.sock",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ])
        .unwrap_err();
        assert!(e.contains("unix"), "{e}");
    }

    #[test]
    fn tls_needs_both_files_and_reads_them_at_once() {
        assert!(settings(&[]).unwrap().tls.is_none());
        assert!(settings(&["--tls-cert", "c.pem"]).is_err());
        assert!(settings(&["--tls-key", "k.pem"]).is_err());
        let e = settings(&[
            "--tls-cert",
            "/no/such/c.pem",
            "--tls-key",
            "/no/such/k.pem",
        ])
        .unwrap_err();
        assert!(e.contains("/no/such/c.pem"), "{e}");
    }

    #[test]
    fn the_connection_limit_leaves_room_for_own_files() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.config(1024, 64).max_connections, 1024 - 64 - 64);
        let s = settings(&["--max-connections", "10"]).unwrap();
        assert_eq!(s.config(1024, 64).max_connections, 10);
        let s = settings(&["--max-connections", "5000"]).unwrap();
        assert_eq!(s.config(1024, 64).max_connections, 896);
        assert_eq!(s.config(10, 64).max_connections, 1);
        assert_eq!(s.config(1024, 64).client_files, 896);
        // Each front end's refusals linger on files of their own.
        let s = settings(&["--http", "127.0.0.1:11380"]).unwrap();
        assert_eq!(s.config(1024, 64).client_files, 1024 - 64 - 2 * 64);
        assert_eq!(s.config(1024, 64).max_connections, 832);
    }
}
