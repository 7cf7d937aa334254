//! The engines under test: the `engines!` macro that turns the list in
//! `main.rs` into `store_tests!`, and one constructor per engine, named like
//! its test module, each giving a fresh, empty store of its own.

use delayq::broker::Broker;
use delayq::clock::Clock;
use delayq::store::log::{self, DurableStore, Options};
use delayq::store::memory::MemoryStore;
use delayq::store::redis::RedisStore;

use crate::env::{Env, Time};
use crate::redis_server::RedisServer;

/// Where a manual clock starts: a realistic wall-clock time (2023), so that
/// nothing passes by accident for being near zero.
const START: u64 = 1_700_000_000_000_000;

/// Declares `store_tests!` from the list of engines, so that every test
/// module instantiates its tests for every engine without naming any.
/// (`$d` is a literal `$`, passed in so that the macros declared here can
/// have repetitions of their own.)
macro_rules! engines {
    ($d:tt $($engine:ident),+ $(,)?) => {
        /// Instantiates each listed `async fn name(Env<impl Store>)` as a
        /// `#[tokio::test]` once per engine, in a module named after the
        /// engine, given a fresh store from the constructor of that name.
        ///
        /// After the tests every engine passes, `; ENGINE fails "why": names`
        /// (or `; [ENGINE ENGINE] fails ...`; several such lists, each test
        /// in one) lists tests that engine is known to fail: they are still built and run on every other
        /// engine, and ignored on that one with the reason, so that
        /// `cargo test -- --ignored` shows the failure until the engine is
        /// fixed, rather than the case being weakened.
        macro_rules! store_tests {
            (
                $d($d name:ident),* $d(,)?
                $d(; $d bad:tt fails $d why:literal: $d($d known:ident),+ $d(,)?)*
            ) => {
                $(
                    mod $engine {
                        $d(
                            #[tokio::test]
                            async fn $d name() {
                                super::$d name(crate::engines::$engine().await).await
                            }
                        )*
                        $d($d(
                            known_failure!($engine $d bad $d why $d known);
                        )+)*
                    }
                )+
            };
        }

        /// One test of a `store_tests!` failure list on `engine`: ignored if
        /// `engine` is the one (or one of those) that fails it. (A pattern
        /// that repeats the engine's name matches only where the two names
        /// are the same.)
        macro_rules! known_failure {
            $(
                ($engine $engine $d why:literal $d name:ident) => {
                    #[tokio::test]
                    #[ignore = $d why]
                    async fn $d name() {
                        super::$d name(crate::engines::$engine().await).await
                    }
                };
                ($engine [$engine $d($d rest:ident)*] $d why:literal $d name:ident) => {
                    known_failure!($engine $engine $d why $d name);
                };
            )+
            ($d engine:ident [$d first:ident $d($d rest:ident)*] $d why:literal $d name:ident) => {
                known_failure!($d engine [$d($d rest)*] $d why $d name);
            };
            ($d engine:ident [] $d why:literal $d name:ident) => {
                #[tokio::test]
                async fn $d name() {
                    super::$d name(crate::engines::$d engine().await).await
                }
            };
            ($d engine:ident $d bad:ident $d why:literal $d name:ident) => {
                #[tokio::test]
                async fn $d name() {
                    super::$d name(crate::engines::$d engine().await).await
                }
            };
        }
    };
}

/// The embedded engine, in memory only, on a manual clock.
pub async fn memory() -> Env<MemoryStore> {
    let clock = Clock::manual(START);
    let store = MemoryStore::with_clock(clock.clone());
    Env::new(Broker::new(store), Time::Manual(clock), None)
}

/// The Redis engine, on a private redis-server, in real time.
pub async fn redis() -> Env<RedisStore> {
    let server = RedisServer::start(&[]);
    let store = RedisStore::connect(&server.url, "delayq:")
        .await
        .expect("connect to the test's redis-server");
    Env::new(Broker::new(store), Time::real(), Some(Box::new(server)))
}

/// The Redis engine on a Redis Cluster: the test binary's one shared
/// 3-primary cluster, under a key prefix of the test's own, in real time.
pub async fn cluster() -> Env<RedisStore> {
    let store = crate::cluster::shared_store().await;
    Env::new(Broker::new(store), Time::real(), None)
}

/// The durable embedded engine, syncing before every reply, in a fresh data
/// directory of its own, on a manual clock.
pub async fn durable() -> Env<DurableStore> {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let clock = Clock::manual(START);
    let store =
        log::open(Options::new(dir.path()), clock.clone()).expect("open a fresh data directory");
    Env::new(Broker::new(store), Time::Manual(clock), Some(Box::new(dir)))
}
