//! The Redis engine's function library, called directly: what one call of
//! several operations answers, which the engine's batching makes happen
//! only by chance of timing.

use delayq::store::redis::bench_call;
use redis::Value;

use crate::redis_server::RedisServer;

/// One call of two puts on the tube `bench`, the first ready and the second
/// delayed by a minute, followed by one more operation, `op` (its name and
/// arguments); returns that one's reply.
async fn after_two_puts(op: &[&str]) -> Value {
    let server = RedisServer::start(&[]);
    let (source, mut command) = bench_call("put", 2).expect("put is a bench op");
    // After FCALL, the function, the key count, the key, the prefix, the
    // number of puts and the mode come the operations: `put` and its tube,
    // client id, priority and delay, ... The second put's delay:
    let second_delay = 7 + 8 + 4;
    assert_eq!(command[second_delay - 4], b"put");
    command[second_delay] = b"60000".to_vec();
    command.extend(op.iter().map(|a| a.as_bytes().to_vec()));
    let client = redis::Client::open(server.url.as_str()).expect("the test's redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test's redis-server");
    let _: Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(source)
        .query_async(&mut conn)
        .await
        .expect("load the library");
    let mut call = redis::cmd("FCALL");
    for arg in &command[1..] {
        call.arg(arg.as_slice());
    }
    let mut replies: Vec<Value> = call.query_async(&mut conn).await.expect("the call");
    assert_eq!(replies.len(), 3, "{replies:?}");
    replies.pop().expect("three replies")
}

fn figures(v: Value) -> Vec<i64> {
    redis::from_redis_value(v).expect("a list of figures")
}

/// A call writes its counts once, at its end; a `stats` behind the puts in
/// the same call counted their jobs in the ready and delayed indexes but
/// not in the counts (`current-jobs-urgent` and `current-jobs-delayed`),
/// and under load a client polling `stats` saw more jobs than there were.
#[tokio::test]
async fn a_stats_in_the_same_call_counts_the_changes_before_it() {
    // {urgent, ready, reserved, delayed, buried, timeouts, total, ...}
    let s = figures(after_two_puts(&["stats"]).await);
    assert_eq!(s[1], 1, "ready: {s:?}");
    assert_eq!(s[0], 1, "urgent (the ready job has priority 0): {s:?}");
    assert_eq!(s[3], 1, "delayed: {s:?}");
    assert_eq!(s[6], 2, "total jobs: {s:?}");
}

/// The same for `stats-tube`.
#[tokio::test]
async fn a_stats_tube_in_the_same_call_counts_the_changes_before_it() {
    // {urgent, ready, reserved, delayed, buried, total, ...}
    let s = figures(after_two_puts(&["stats_tube", "bench"]).await);
    assert_eq!(s[1], 1, "ready: {s:?}");
    assert_eq!(s[0], 1, "urgent: {s:?}");
    assert_eq!(s[3], 1, "delayed: {s:?}");
    assert_eq!(s[5], 2, "total jobs: {s:?}");
}
