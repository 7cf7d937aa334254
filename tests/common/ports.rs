//! Loopback ports, shared by the tests and the load generator (which
//! includes this file by path), so both pick ports the same way.

use std::net::{Ipv4Addr, TcpListener};

/// A loopback port nobody listens on right now. Another process may take
/// it before the caller does: callers that start a server on it retry.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}
