//! Replies held until their changes are safe, for a client that pipelines.
//!
//! A change is answered only once it is as safe as the engine promises (on
//! the durable engine, synced). A connection runs its commands in order, so
//! a client that writes a hundred puts and deletes in one go would wait for
//! a hundred syncs, one after the other. Instead, while more of its commands
//! are already read, a connection lets each change go on without waiting:
//! the engine hands it the wait instead ([`hold`]), and the connection
//! awaits the last one held ([`until_safe`]) before anything it has queued
//! goes out to the client. The replies leave in the same order and no
//! sooner than before; only the waits are shared.
//!
//! The holding is scoped to one connection's task ([`scope`]); outside one,
//! or when the connection says its client is not pipelining ([`pipelining`]),
//! engines wait as usual.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

use crate::error::StoreResult;

/// A wait for changes to become safe.
pub type Wait = Pin<Box<dyn Future<Output = StoreResult<()>> + Send>>;

#[derive(Default)]
struct Held {
    /// Whether the connection's client has more commands already read.
    pipelining: bool,
    /// The wait for the latest change held (it covers the earlier ones:
    /// a log makes its records safe in order).
    wait: Option<Wait>,
}

tokio::task_local! {
    static HELD: RefCell<Held>;
}

/// Runs one connection, its changes' waits held while it pipelines.
pub async fn scope<F: Future>(connection: F) -> F::Output {
    HELD.scope(RefCell::new(Held::default()), connection).await
}

/// Says whether the client has more commands already read (the changes
/// that follow may then be held).
pub fn pipelining(yes: bool) {
    let _ = HELD.try_with(|h| h.borrow_mut().pipelining = yes);
}

/// For an engine: holds `wait` instead of awaiting it, if the current task
/// is a connection that is pipelining; otherwise hands it back.
pub fn hold(wait: Wait) -> Option<Wait> {
    let mut wait = Some(wait);
    let _ = HELD.try_with(|h| {
        let mut h = h.borrow_mut();
        if h.pipelining {
            h.wait = wait.take();
        }
    });
    wait
}

/// Whether the current task could hold a wait now (so that an engine need
/// not build one for nothing).
pub fn can_hold() -> bool {
    HELD.try_with(|h| h.borrow().pipelining).unwrap_or(false)
}

/// Waits until every change held by this connection is safe. An error
/// means some may not be: none of the replies queued since may go out.
pub async fn until_safe() -> StoreResult<()> {
    let wait = HELD.try_with(|h| h.borrow_mut().wait.take()).ok().flatten();
    match wait {
        Some(wait) => wait.await,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;

    fn failing() -> Wait {
        Box::pin(async { Err(StoreError::Unavailable("gone".into())) })
    }

    #[tokio::test]
    async fn only_a_pipelining_connection_holds() {
        assert!(hold(failing()).is_some(), "outside a connection");
        scope(async {
            assert!(hold(failing()).is_some(), "not pipelining");
            assert!(until_safe().await.is_ok());
            pipelining(true);
            assert!(can_hold());
            assert!(hold(failing()).is_none());
            pipelining(false);
            assert!(until_safe().await.is_err(), "the held wait is awaited");
            assert!(until_safe().await.is_ok(), "and only once");
        })
        .await;
    }
}
