//! The durable embedded engine under the same faults as Redis: SIGKILL
//! under load, again and again, on one data directory, checked against the
//! same ledger.

use crate::restarts::{Keeper, Producers, killed_and_restarted};

/// Ten kills in a row, one producer: every acknowledged job survives, and
/// the jobs the worker held are ready again at each restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_killed_ten_times_in_a_row_loses_nothing() {
    let kills = crate::scale(10, 50);
    killed_and_restarted(Keeper::dir(&[]), "durable", kills, Producers::paced(1)).await;
}

/// Several producers at once, each pausing between puts, so that their
/// puts sometimes meet in one sync (group commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_killed_under_concurrent_puts_loses_nothing() {
    let kills = crate::scale(5, 20);
    let producers = Producers::paced(4);
    killed_and_restarted(Keeper::dir(&[]), "durable, 4 producers", kills, producers).await;
}

/// Several producers sending windows of puts with no pause, so that each
/// kill lands while many replies wait on one sync (group commit): a put cut
/// off then may or may not be stored, and is in doubt; every put answered
/// `INSERTED` before the kill is there after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_killed_while_replies_wait_on_a_sync_loses_nothing() {
    let kills = crate::scale(5, 20);
    let producers = Producers::flooding(4, 8);
    let what = "durable, 4 producers flooding";
    let summary = killed_and_restarted(Keeper::dir(&[]), what, kills, producers).await;
    // Unpaced producers are nearly always awaiting replies: over all the
    // kills, one at least must have caught some.
    assert!(
        summary.in_flight > 0,
        "no kill caught a put awaiting its reply: {summary:?}"
    );
}

/// The same with log files of 8 KiB (some 30 records each), so that kills
/// land while new files begin: the replies of the records a begun file's
/// group wrote to the old file leave once that file is synced, before the
/// new file is named, and those of the new file's records only once it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_with_small_files_killed_while_files_begin_loses_nothing() {
    let kills = crate::scale(5, 20);
    let keeper = Keeper::dir(&["-s", "8192"]);
    let producers = Producers::flooding(4, 8);
    let what = "durable, -s 8192, 4 producers flooding";
    killed_and_restarted(keeper, what, kills, producers).await;
}

/// With `-f 50` a reply leaves once its record is written, before the sync:
/// a SIGKILL of delayq (not of the host) still loses nothing, as written
/// records are in the kernel's page cache, which outlives the process. (A
/// power cut could lose the last 50 ms; no test here pulls the plug.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_with_fsync_every_50ms_survives_sigkill() {
    let kills = crate::scale(5, 20);
    let keeper = Keeper::dir(&["-f", "50"]);
    killed_and_restarted(keeper, "durable, -f 50", kills, Producers::paced(1)).await;
}

/// With `-F` (never synced) a reply also leaves once its record is
/// written: a SIGKILL of delayq loses nothing answered, with several
/// producers flooding, so that kills land while connections write their
/// records themselves and the writer thread lingers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_never_synced_survives_sigkill() {
    let kills = crate::scale(5, 20);
    let keeper = Keeper::dir(&["-F"]);
    let producers = Producers::flooding(4, 8);
    killed_and_restarted(
        keeper,
        "durable, -F, 4 producers flooding",
        kills,
        producers,
    )
    .await;
}

/// With `-f 50` and small log files, flooding: records reach the kernel
/// through the mapped log file at once, except around the start of each of
/// the many new files (named only once the file before is synced), where
/// they wait to be written. A kill at any of those moments loses nothing
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_with_fsync_every_50ms_and_small_files_survives_sigkill_while_flooding() {
    let kills = crate::scale(5, 20);
    let keeper = Keeper::dir(&["-f", "50", "-s", "65536"]);
    let producers = Producers::flooding(4, 8);
    let what = "durable, -f 50 -s 65536, 4 producers flooding";
    killed_and_restarted(keeper, what, kills, producers).await;
}
