//! The durable embedded engine under the same faults as Redis: SIGKILL
//! under load, again and again, on one data directory, checked against the
//! same ledger.

use crate::restarts::{Keeper, killed_and_restarted};

/// Ten kills in a row, one producer: every acknowledged job survives, and
/// the jobs the worker held are ready again at each restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_killed_ten_times_in_a_row_loses_nothing() {
    let kills = crate::scale(10, 50);
    killed_and_restarted(Keeper::dir(&[]), "durable", kills, 1).await;
}

/// Several producers at once, so that replies wait on shared syncs (group
/// commit) when the kill comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_killed_under_concurrent_puts_loses_nothing() {
    let kills = crate::scale(5, 20);
    killed_and_restarted(Keeper::dir(&[]), "durable, 4 producers", kills, 4).await;
}

/// With `-f 50` a reply leaves once its record is written, before the sync:
/// a SIGKILL of delayq (not of the host) still loses nothing, as written
/// records are in the kernel's page cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_with_fsync_every_50ms_survives_sigkill() {
    let kills = crate::scale(5, 20);
    killed_and_restarted(Keeper::dir(&["-f", "50"]), "durable, -f 50", kills, 1).await;
}
