//! Events from the other delayq processes sharing a Redis: a dedicated
//! pub/sub connection on the `events` channel, where the library announces
//! tubes that got ready jobs and due times earlier than any known, so that a
//! job made ready by one process reaches a worker blocked on another.

use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::names::{Tube, parse_u64};
use crate::store::StoreEvent;

/// How often the listener retries while Redis is unreachable.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// What one message on the channel means: `due:MS` or a tube's name.
fn event(payload: &[u8]) -> Option<StoreEvent> {
    match payload.strip_prefix(b"due:") {
        Some(ms) => parse_u64(ms).map(|ms| StoreEvent::Due(Duration::from_millis(ms))),
        None => Tube::parse(payload).map(StoreEvent::Ready),
    }
}

/// Listens on `channel` until `stop`, reconnecting as needed; each
/// (re)connection first sends [`StoreEvent::Resync`], since announcements
/// may have been missed while away.
pub(super) async fn listen(
    client: redis::Client,
    channel: String,
    tx: mpsc::Sender<StoreEvent>,
    stop: CancellationToken,
) {
    let mut connected_before = false;
    loop {
        let session = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            if connected_before {
                info!("Redis events channel back");
            }
            let _ = tx.send(StoreEvent::Resync).await;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                if let Some(event) = event(msg.get_payload_bytes()) {
                    let _ = tx.send(event).await;
                }
            }
            Ok::<(), RedisError>(())
        };
        tokio::select! {
            ended = session => match ended {
                Ok(()) => warn!("Redis events channel closed; reconnecting"),
                Err(e) => warn!(error = %e, "Redis events channel unavailable; retrying"),
            },
            () = stop.cancelled() => return,
        }
        connected_before = true;
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_DELAY) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_their_events() {
        assert_eq!(
            event(b"due:1500"),
            Some(StoreEvent::Due(Duration::from_millis(1500)))
        );
        assert_eq!(
            event(b"orders"),
            Some(StoreEvent::Ready(Tube::parse(b"orders").unwrap()))
        );
        assert_eq!(event(b"due:x"), None);
        assert_eq!(event(b"a:b"), None);
    }
}
