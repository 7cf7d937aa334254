//! The command line and the settings it makes: flags are parsed and checked
//! here, so `main.rs` only acts on settings known to be sound.

use clap::Parser;
use tracing::warn;

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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_job_size: DEFAULT_MAX_JOB_SIZE,
            max_connections: 100_000,
        }
    }
}

/// A delay-queue job server speaking beanstalkd's protocol.
#[derive(Parser, Debug)]
#[command(name = "delayq", version, about)]
pub struct Flags {
    /// Address to listen on.
    #[arg(short = 'l', value_name = "ADDR", default_value = "127.0.0.1")]
    pub listen: String,
    /// TCP port to listen on.
    #[arg(short = 'p', value_name = "PORT", default_value_t = 11300)]
    pub port: u16,
    /// Largest job body in bytes (at most 1073741824).
    #[arg(short = 'z', value_name = "BYTES", default_value_t = DEFAULT_MAX_JOB_SIZE)]
    pub max_job_size: usize,
    /// Store jobs in Redis at this URL (redis://[:password@]host:port/db, or
    /// redis+unix:///path). Without it, jobs live in this process's memory.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// Prefix of every Redis key delayq uses (it becomes the keys' hash tag).
    #[arg(long, value_name = "PREFIX", default_value = "delayq:")]
    pub redis_prefix: String,
    /// Most client connections at once; one more is told
    /// TOO_MANY_CONNECTIONS and closed. Default: what the open-file limit
    /// allows, less a few files for delayq's own use.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
}

/// Where the jobs are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// In this process's memory only.
    Memory,
    /// In Redis.
    Redis {
        /// The server's URL.
        url: String,
        /// The prefix of every key.
        prefix: String,
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
    /// Where the jobs are kept.
    pub engine: Engine,
}

impl Flags {
    /// Checks the flags; an error says which one is wrong and why.
    pub fn settings(self) -> Result<Settings, String> {
        if self.redis_prefix.contains(['{', '}']) {
            return Err(
                "--redis-prefix may not contain braces: delayq adds its own hash tag".into(),
            );
        }
        let mut max_job_size = self.max_job_size;
        if max_job_size > MAX_JOB_SIZE_CEILING {
            warn!(
                max_job_size,
                "-z is above the ceiling; using {MAX_JOB_SIZE_CEILING}"
            );
            max_job_size = MAX_JOB_SIZE_CEILING;
        }
        let engine = match self.redis {
            Some(url) => Engine::Redis {
                url,
                prefix: self.redis_prefix,
            },
            None => Engine::Memory,
        };
        Ok(Settings {
            listen: self.listen,
            port: self.port,
            max_job_size,
            max_connections: self.max_connections,
            engine,
        })
    }
}

impl Settings {
    /// The server's [`Config`], given how many files this process may open.
    ///
    /// Refused connections linger a moment too, each on a file of its own
    /// (`lingering` of them at most), so the default limit leaves room for
    /// them; a larger limit than the files allow is lowered, with a warning.
    pub fn config(&self, open_files: usize, lingering: usize) -> Config {
        let allowed = open_files.saturating_sub(OWN_FILES + lingering).max(1);
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

    #[test]
    fn flags_become_settings() {
        let s = settings(&[]).unwrap();
        assert_eq!((s.listen.as_str(), s.port), ("127.0.0.1", 11300));
        assert_eq!(s.engine, Engine::Memory);
        assert_eq!(s.max_job_size, DEFAULT_MAX_JOB_SIZE);
        let s = settings(&["--redis", "redis://x", "-z", "2000000000"]).unwrap();
        assert_eq!(s.max_job_size, MAX_JOB_SIZE_CEILING);
        assert!(matches!(s.engine, Engine::Redis { ref prefix, .. } if prefix == "delayq:"));
        assert!(settings(&["--redis-prefix", "a{b"]).is_err());
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
    }
}
