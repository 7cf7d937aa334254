//! A delayq server inside the test process, for the tests that kill Redis
//! rather than delayq.

use std::net::SocketAddr;

use delayq::config::Config;
use delayq::server::{Control, run};
use delayq::store::redis::RedisStore;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::common::Client;

/// A delayq server inside the test process, on the Redis at `url`, for tests
/// that kill Redis rather than delayq. Stops when dropped.
pub struct InProcess {
    addr: SocketAddr,
    control: Control,
    _task: JoinHandle<()>,
}

impl InProcess {
    /// Serves on a loopback port of its own, from this test's process,
    /// with the Redis at `url` as its store.
    pub async fn start(url: &str) -> InProcess {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let store = RedisStore::connect(url, "delayq:")
            .await
            .expect("connect to the test's redis-server");
        let control = Control::default();
        let task = tokio::spawn(run(listener, store, Config::default(), control.clone()));
        InProcess {
            addr,
            control,
            _task: task,
        }
    }

    /// A new connection to this server.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.control.shutdown.cancel();
    }
}
