//! Constants shared by several conformance modules.

use std::time::Duration;

use crate::common::Client;

/// One second.
pub const SEC: Duration = Duration::from_secs(1);

/// A client-chosen job id used throughout.
pub const OID: &str = "order-close:4711";

/// `stats-job` fields as beanstalkd 1.12 prints them.
pub const BEANSTALKD_STATS_JOB: &[&str] = &[
    "id",
    "tube",
    "state",
    "pri",
    "age",
    "delay",
    "ttr",
    "time-left",
    "file",
    "reserves",
    "timeouts",
    "releases",
    "buries",
    "kicks",
];

/// Sends `put <args> <bytes>[ <extra>]` and the body; returns the reply line.
/// `args` is `<pri> <delay> <ttr>`; `extra` is an optional client id and
/// the options, as one string.
pub async fn put_with(c: &mut Client, args: &str, body: &[u8], extra: &str) -> String {
    let mut line = format!("put {args} {}", body.len());
    if !extra.is_empty() {
        line.push(' ');
        line.push_str(extra);
    }
    let mut msg = line.into_bytes();
    msg.extend_from_slice(b"\r\n");
    msg.extend_from_slice(body);
    msg.extend_from_slice(b"\r\n");
    c.send(&msg).await;
    c.line().await
}

/// A `put` with options that must be stored; returns the server id.
pub async fn put_opts(c: &mut Client, args: &str, body: &[u8], options: &str) -> u64 {
    let reply = put_with(c, args, body, options).await;
    reply
        .strip_prefix("INSERTED ")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("put {args} .. {options}: expected INSERTED <n>, got {reply:?}"))
}

/// Puts a job with `options` whose body reads as a command (`use evil`):
/// the put must be refused with `BAD_OPTION` and its body read as data,
/// so the connection still uses `default`.
pub async fn assert_bad_option(c: &mut Client, options: &str) {
    assert_eq!(
        put_with(c, "0 0 60", b"use evil", options).await,
        "BAD_OPTION",
        "put .. {options}"
    );
    assert_eq!(
        c.cmd("list-tube-used").await,
        "USING default",
        "after {options}"
    );
}
