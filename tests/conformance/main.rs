//! Command-level conformance: every command and reply word of beanstalkd
//! 1.12's protocol, the delayq extensions (client ids, `finish`, JSON lines,
//! drain mode), and the queue's behaviour over time. Every test runs against
//! every backend through `backend_tests!`.
//!
//! Split by theme into one module each; every module lists its tests in
//! its own `backend_tests!` invocation.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod support;

mod batch;
mod client_ids;
mod errors;
mod expiry;
mod json;
mod lifecycle;
mod rate;
mod retries;
mod schedules;
mod stats;
mod timing;
mod transfer;
mod tubes;
