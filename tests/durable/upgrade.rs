//! A data directory written by the delayq before this one (log format 1:
//! every number fixed-size) is read: its jobs are served, and new records
//! go to a new file in the current format, never into the old one.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::daemon::Daemon;
use crate::log_files;

/// A job record as format 1 framed it (`src/store/log/record.rs` before
/// format 2): length, CRC-32C, then every number fixed-size.
fn job_v1(seq: u64, key: u64, pri: u32, state: (u8, u64), body: &[u8]) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut r = Vec::new();
    r.extend_from_slice(&seq.to_le_bytes());
    r.extend_from_slice(&0u64.to_le_bytes()); // stamp
    r.push(1); // a job
    r.extend_from_slice(&key.to_le_bytes());
    r.extend_from_slice(&pri.to_le_bytes());
    r.extend_from_slice(&0u64.to_le_bytes()); // delay
    r.push(state.0);
    r.extend_from_slice(&state.1.to_le_bytes());
    r.extend_from_slice(&[0; 20]); // counters
    r.extend_from_slice(&60_000_000u64.to_le_bytes()); // ttr
    r.extend_from_slice(&now.to_le_bytes()); // created
    r.push(7);
    r.extend_from_slice(b"default");
    r.push(0); // no client id
    r.extend_from_slice(&(body.len() as u32).to_le_bytes());
    r.extend_from_slice(body);
    let len = (r.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &r);
    [&len[..], &crc.to_le_bytes()[..], &r[..]].concat()
}

#[tokio::test]
async fn a_format_1_directory_is_served_and_then_written_in_format_2() {
    let dir = tempfile::tempdir().expect("a data directory");
    let mut file = Vec::new();
    file.extend_from_slice(b"DELAYQLG");
    file.extend_from_slice(&1u32.to_le_bytes()); // format 1
    file.extend_from_slice(&[0; 4]);
    file.extend_from_slice(&1u64.to_le_bytes()); // file 1
    file.extend_from_slice(&1u64.to_le_bytes()); // its first record
    file.extend(job_v1(1, 1, 5, (0, 0), b"ready, from format 1"));
    file.extend(job_v1(2, 2, 9, (3, 1), b"buried, from format 1"));
    file.resize(64 * 1024, 0);
    let old = dir.path().join("log.0000000000000001");
    std::fs::write(&old, &file).expect("write a format 1 log");

    let mut daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    let ready = c.found("peek-ready").await;
    assert_eq!(
        (ready.id.as_str(), &ready.body[..]),
        ("1", &b"ready, from format 1"[..])
    );
    assert_eq!(c.stats_job(1).await.get("pri"), "5");
    let buried = c.found("peek-buried").await;
    assert_eq!(
        (buried.id.as_str(), &buried.body[..]),
        ("2", &b"buried, from format 1"[..])
    );
    // Numbered past both, and past any other put the old file had room
    // for: no older build said whether it stopped cleanly.
    let new_id = c.put_ok(0, 0, 60, b"new").await;
    assert!(new_id > 2, "{new_id}");
    daemon.kill();
    // The old file is as it was: the new record went to a file of its own.
    assert_eq!(std::fs::read(&old).expect("the old log"), file);
    let logs = log_files(dir.path());
    assert_eq!(logs.len(), 2, "{logs:?}");
    let new = std::fs::read(&logs[1]).expect("the new log");
    assert_eq!(u32::from_le_bytes(new[8..12].try_into().unwrap()), 2);

    let daemon = Daemon::durable(dir.path(), &[]).await;
    let mut c = daemon.client().await;
    assert_eq!(c.stats().await.num("current-jobs-ready"), 2);
    assert_eq!(c.stats().await.num("current-jobs-buried"), 1);
    assert_eq!(c.found(&format!("peek {new_id}")).await.body, b"new");
    assert_eq!(c.found("peek 1").await.body, b"ready, from format 1");
}
