//! Run-time settings, built from the command line in `main.rs`.

/// beanstalkd's default largest job body, in bytes.
pub const DEFAULT_MAX_JOB_SIZE: usize = 65_535;
/// beanstalkd's hard ceiling on `-z`.
pub const MAX_JOB_SIZE_CEILING: usize = 1_073_741_824;

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
