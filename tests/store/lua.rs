//! The Redis engine's function library, called directly: what one call of
//! several operations answers, which the engine's batching makes happen
//! only by chance of timing, and calls coming in an order that only a
//! cluster client sending a failed call again makes happen.

use delayq::store::redis::bench_call;
use redis::Value;

use crate::redis_server::RedisServer;

/// A private `redis-server` with the library loaded, taking calls of
/// operations of our choosing.
struct Library {
    _server: RedisServer,
    conn: redis::aio::MultiplexedConnection,
    /// `FCALL` and what comes before the first operation.
    head: Vec<Vec<u8>>,
}

impl Library {
    async fn start() -> Library {
        let server = RedisServer::start(&[]);
        let (source, head) = bench_call("put", 0).expect("put is a bench op");
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
        Library {
            _server: server,
            conn,
            head,
        }
    }

    /// One call of `ops` (each operation's name and arguments, one after
    /// another), `puts` of them puts; their replies.
    async fn run(&mut self, puts: usize, ops: &[Vec<u8>]) -> Vec<Value> {
        let mut call = redis::cmd("FCALL");
        // After FCALL: the function, the key count, the key, the prefix,
        // the number of puts and the mode.
        for (i, arg) in self.head[1..].iter().enumerate() {
            if i == 4 {
                call.arg(puts);
            } else {
                call.arg(arg.as_slice());
            }
        }
        for arg in ops {
            call.arg(arg.as_slice());
        }
        call.query_async(&mut self.conn).await.expect("the call")
    }

    /// One call of one operation (its name and arguments); its reply.
    async fn call(&mut self, op: &[&str]) -> Value {
        let ops: Vec<Vec<u8>> = op.iter().map(|a| a.as_bytes().to_vec()).collect();
        let mut replies = self.run(0, &ops).await;
        assert_eq!(replies.len(), 1, "{op:?}: {replies:?}");
        let reply = replies.pop().expect("one reply");
        assert!(!matches!(reply, Value::ServerError(_)), "{op:?}: {reply:?}");
        reply
    }

    /// `(current-using, current-watching)` of `tube`; `None` if there is
    /// no such tube (it has no jobs and nobody uses or watches it).
    async fn users(&mut self, tube: &str) -> Option<(i64, i64)> {
        // {urgent, ready, reserved, delayed, buried, total, using, watching, ...}
        match self.call(&["stats_tube", tube]).await {
            Value::Nil => None,
            v => {
                let s = figures(v);
                Some((s[6], s[7]))
            }
        }
    }
}

/// One call of two puts on the tube `bench`, the first ready and the second
/// delayed by a minute, followed by one more operation, `op` (its name and
/// arguments); returns that one's reply.
async fn after_two_puts(op: &[&str]) -> Value {
    let mut lib = Library::start().await;
    let (_, command) = bench_call("put", 2).expect("put is a bench op");
    // After the call's head come the operations: `put` and its tube, client
    // id, priority and delay, ... The second put's delay:
    let mut ops = command[lib.head.len()..].to_vec();
    let second_delay = 8 + 4;
    assert_eq!(ops[second_delay - 4], b"put");
    ops[second_delay] = b"60000".to_vec();
    ops.extend(op.iter().map(|a| a.as_bytes().to_vec()));
    let mut replies = lib.run(2, &ops).await;
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

/// The cluster client sends a call answered `CLUSTERDOWN` or `TRYAGAIN`
/// again after a random wait, so a call carrying an older count of a
/// process's watchers may run after one carrying a newer: the older changes
/// nothing, whichever order they come in.
#[tokio::test]
async fn a_count_older_than_the_one_redis_has_changes_nothing() {
    let mut lib = Library::start().await;
    // The process's first connection watches `x` (version ...100), then a
    // second one does (...200), then the first leaves (...300): counts 1,
    // 2, 1.
    lib.call(&["tube_ref", "p1", "x", "w", "1", "1000100"])
        .await;
    lib.call(&["tube_ref", "p1", "x", "w", "1", "1000300"])
        .await;
    assert_eq!(lib.users("x").await, Some((0, 1)));
    // The call of version ...200 was sent again and comes last.
    lib.call(&["tube_ref", "p1", "x", "w", "2", "1000200"])
        .await;
    assert_eq!(
        lib.users("x").await,
        Some((0, 1)),
        "the count of version ...200 is older"
    );
    // A newer count goes in: the tube's last watcher leaves, and with no
    // jobs the tube is gone.
    lib.call(&["tube_ref", "p1", "x", "w", "0", "1000400"])
        .await;
    assert_eq!(lib.users("x").await, None);
    lib.call(&["tube_ref", "p1", "x", "w", "1", "1000350"])
        .await;
    assert_eq!(
        lib.users("x").await,
        None,
        "a late count does not bring it back"
    );
    // Another process's counts have versions of their own.
    lib.call(&["tube_ref", "p2", "x", "u", "3", "5"]).await;
    assert_eq!(lib.users("x").await, Some((3, 0)));
}

/// A process sends all its counts again (`restore_refs`): a count newer
/// than them stays, and one older than them that comes after is ignored.
#[tokio::test]
async fn counts_sent_again_whole_keep_newer_ones_and_ignore_older_ones() {
    let mut lib = Library::start().await;
    lib.call(&["tube_ref", "p1", "a", "w", "3", "2000500"])
        .await;
    // All the counts as they were at version ...400 come after the count
    // of `a` of version ...500: that one stays, the others are set.
    lib.call(&["restore_refs", "p1", "w:a 1 u:b 2", "2000400"])
        .await;
    assert_eq!(lib.users("a").await, Some((0, 3)));
    assert_eq!(lib.users("b").await, Some((2, 0)));
    // Counts of versions before ...400, in tubes the restore named or not,
    // come later and change nothing.
    lib.call(&["tube_ref", "p1", "b", "u", "7", "2000300"])
        .await;
    lib.call(&["tube_ref", "p1", "c", "w", "1", "2000350"])
        .await;
    assert_eq!(lib.users("b").await, Some((2, 0)));
    assert_eq!(lib.users("c").await, None);
    // An older restore, sent again, changes nothing either; a newer one
    // does, and a count it no longer has is gone.
    lib.call(&["restore_refs", "p1", "w:a 9", "2000200"]).await;
    assert_eq!(lib.users("a").await, Some((0, 3)));
    lib.call(&["restore_refs", "p1", "w:a 1", "2000600"]).await;
    assert_eq!(lib.users("a").await, Some((0, 1)));
    assert_eq!(lib.users("b").await, None);
}

/// Versions are kept 10 s (of the process's clock) behind its latest, not
/// for every tube the process ever used: a call sent again comes within 2 s.
#[tokio::test]
async fn versions_of_counts_are_kept_for_ten_seconds_only() {
    let mut lib = Library::start().await;
    // A tube a second for 100 seconds, each used and left.
    for i in 0..100u64 {
        let tube = format!("t{i}");
        let at = 3_000_000_000 + i * 1_000_000;
        let (used, left) = (at.to_string(), (at + 1).to_string());
        lib.call(&["tube_ref", "p1", &tube, "u", "1", &used]).await;
        lib.call(&["tube_ref", "p1", &tube, "u", "0", &left]).await;
    }
    let kept: i64 = redis::cmd("ZCARD")
        .arg("{delayq:}refv:p1")
        .query_async(&mut lib.conn)
        .await
        .expect("ZCARD");
    assert!((10..=11).contains(&kept), "{kept} versions kept");
}
