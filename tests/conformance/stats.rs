//! `stats`, `stats-job` and `stats-tube`: fields, values and counters; and
//! `version`.

use crate::common::{Backend, TestServer};
use crate::support::BEANSTALKD_STATS_JOB;

/// `stats` fields exactly as beanstalkd 1.12 prints them, in its order
/// (taken from a real beanstalkd 1.12's output).
const BEANSTALKD_STATS: &[&str] = &[
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "cmd-put",
    "cmd-peek",
    "cmd-peek-ready",
    "cmd-peek-delayed",
    "cmd-peek-buried",
    "cmd-reserve",
    "cmd-reserve-with-timeout",
    "cmd-delete",
    "cmd-release",
    "cmd-use",
    "cmd-watch",
    "cmd-ignore",
    "cmd-bury",
    "cmd-kick",
    "cmd-touch",
    "cmd-stats",
    "cmd-stats-job",
    "cmd-stats-tube",
    "cmd-list-tubes",
    "cmd-list-tube-used",
    "cmd-list-tubes-watched",
    "cmd-pause-tube",
    "job-timeouts",
    "total-jobs",
    "max-job-size",
    "current-tubes",
    "current-connections",
    "current-producers",
    "current-workers",
    "current-waiting",
    "total-connections",
    "pid",
    "version",
    "rusage-utime",
    "rusage-stime",
    "uptime",
    "binlog-oldest-index",
    "binlog-current-index",
    "binlog-records-migrated",
    "binlog-records-written",
    "binlog-max-size",
    "draining",
    "id",
    "hostname",
    "os",
    "platform",
];

/// `stats-tube` fields as beanstalkd 1.12 prints them.
const BEANSTALKD_STATS_TUBE: &[&str] = &[
    "name",
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "total-jobs",
    "current-using",
    "current-watching",
    "current-waiting",
    "cmd-delete",
    "cmd-pause-tube",
    "pause",
    "pause-time-left",
];

backend_tests!(
    stats_fields_match_beanstalkd,
    stats_job_fields_and_values,
    stats_tube_fields_and_values,
    stats_command_counters,
    stats_job_counts_by_state,
    stats_connection_counters,
    refused_puts_are_counted_as_beanstalkd_counts_them,
    version_is_the_crate_version,
);

async fn stats_fields_match_beanstalkd(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let s = c.stats().await;
    let keys = s.keys();
    assert!(
        keys.len() >= BEANSTALKD_STATS.len(),
        "too few fields: {keys:?}"
    );
    assert_eq!(&keys[..BEANSTALKD_STATS.len()], BEANSTALKD_STATS);
    assert_eq!(s.get("draining"), "false");
    assert_eq!(s.num("max-job-size"), 65_535);
    assert_eq!(s.num("pid"), u64::from(std::process::id()));
    // beanstalkd reports its default `-s` when it keeps no log; the durable
    // engine reports the size of the files it writes.
    let file_size = match backend {
        Backend::Durable => delayq::store::log::DEFAULT_FILE_SIZE,
        Backend::Memory | Backend::Redis | Backend::Cluster => 10_485_760,
    };
    assert_eq!(s.num("binlog-max-size"), file_size);
    let id = s.get("id");
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "id: {id:?}"
    );
    for k in ["rusage-utime", "rusage-stime"] {
        let v = s.get(k);
        let (secs, micros) = v.split_once('.').unwrap_or_else(|| panic!("{k}: {v}"));
        assert!(secs.parse::<u64>().is_ok() && micros.len() == 6, "{k}: {v}");
    }
    // delayq's extra counters come after beanstalkd's fields.
    for k in ["cmd-reserve-job", "cmd-kick-job", "cmd-finish"] {
        assert_eq!(s.num(k), 0, "{k}");
    }
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "duplicate fields: {keys:?}");
}

async fn stats_job_fields_and_values(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    c.cmd("use jobs").await;
    let id = c.put_ok(1500, 0, 0, b"x").await;
    let s = c.stats_job(id).await;
    assert_eq!(s.keys(), BEANSTALKD_STATS_JOB);
    let want = [
        ("id", id.to_string()),
        ("tube", "jobs".into()),
        ("state", "ready".into()),
        ("pri", "1500".into()),
        ("age", "0".into()),
        ("delay", "0".into()),
        // beanstalkd raises a TTR of 0 to 1.
        ("ttr", "1".into()),
        ("time-left", "0".into()),
        ("file", "0".into()),
        ("reserves", "0".into()),
        ("timeouts", "0".into()),
        ("releases", "0".into()),
        ("buries", "0".into()),
        ("kicks", "0".into()),
    ];
    for (k, v) in want {
        assert_eq!(s.get(k), v, "{k}");
    }
    let d = c.put_ok(0, 30, 60, b"x").await;
    let s = c.stats_job(d).await;
    assert_eq!((s.get("state"), s.num("delay")), ("delayed", 30));
    assert!((28..=30).contains(&s.num("time-left")), "{s:?}");
    c.cmd("watch jobs").await;
    c.reserved(&format!("reserve-job {id}")).await;
    let s = c.stats_job(id).await;
    assert_eq!((s.get("state"), s.num("reserves")), ("reserved", 1));
    assert!(s.num("time-left") <= 1, "{s:?}");
    assert_eq!(c.cmd("stats-job 999").await, "NOT_FOUND");
    assert_eq!(c.stats().await.num("cmd-stats-job"), 4);
}

async fn stats_tube_fields_and_values(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let mut w = server.client().await;
    w.ping().await;
    let s = c.stats_tube("default").await;
    assert_eq!(s.keys(), BEANSTALKD_STATS_TUBE);
    for k in &BEANSTALKD_STATS_TUBE[1..] {
        let want = match *k {
            "current-using" | "current-watching" => 2,
            _ => 0,
        };
        assert_eq!(s.num(k), want, "{k}");
    }
    assert_eq!(s.get("name"), "default");
    c.cmd("use t").await;
    c.put_ok(0, 0, 60, b"urgent").await;
    c.put_ok(1024, 0, 60, b"not urgent").await;
    c.put_ok(0, 100, 60, b"delayed").await;
    w.cmd("watch t").await;
    w.reserved("reserve-job 1").await;
    let s = c.stats_tube("t").await;
    let want = [
        ("current-jobs-urgent", 0),
        ("current-jobs-ready", 1),
        ("current-jobs-reserved", 1),
        ("current-jobs-delayed", 1),
        ("current-jobs-buried", 0),
        ("total-jobs", 3),
        ("current-using", 1),
        ("current-watching", 1),
        ("current-waiting", 0),
        ("cmd-delete", 0),
    ];
    for (k, v) in want {
        assert_eq!(s.num(k), v, "{k}");
    }
    w.cmd("delete 1").await;
    w.send_line("reserve-with-timeout 10").await;
    // w gets the ready job at once, then blocks on the next reserve.
    let line = w.line().await;
    w.job_after("RESERVED", &line).await;
    w.send_line("reserve").await;
    let s = c
        .poll_yaml("stats-tube t", |y| y.num("current-waiting") == 1)
        .await;
    assert_eq!(s.num("cmd-delete"), 1);
    assert_eq!(s.num("current-jobs-reserved"), 1);
    assert_eq!(c.stats_tube("default").await.num("current-waiting"), 1);
}

async fn stats_command_counters(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    assert_eq!(c.put(0, 0, 60, b"x").await, "INSERTED 1");
    // One of each command (but `stats`, which comes last), whatever its answer.
    let script = [
        ("peek 1", "FOUND 1 1"),
        ("peek-ready", "FOUND 1 1"),
        ("peek-delayed", "NOT_FOUND"),
        ("peek-buried", "NOT_FOUND"),
        ("reserve", "RESERVED 1 1"),
        ("release 1 0 0", "RELEASED"),
        ("reserve-with-timeout 0", "RESERVED 1 1"),
        ("bury 1 0", "BURIED"),
        ("kick 1", "KICKED 1"),
        ("use t", "USING t"),
        ("watch t", "WATCHING 2"),
        ("ignore t", "WATCHING 1"),
        ("touch 1", "NOT_FOUND"),
        ("kick-job 1", "NOT_FOUND"),
        ("pause-tube default 0", "PAUSED"),
        ("reserve-job 1", "RESERVED 1 1"),
        ("stats-job 1", "OK"),
        ("stats-tube default", "OK"),
        ("list-tubes", "OK"),
        ("list-tube-used", "USING t"),
        ("list-tubes-watched", "OK"),
        ("finish 1", "FINISHED"),
        ("delete 1", "NOT_FOUND"),
    ];
    for (cmd, want) in script {
        assert_eq!(c.reply(cmd).await, want, "{cmd}");
    }
    // Malformed commands are not counted.
    assert_eq!(c.cmd("peek x:").await, "NOT_FOUND");
    assert_eq!(c.cmd("delete -1").await, "BAD_FORMAT");
    let s = c.stats().await;
    for k in BEANSTALKD_STATS.iter().filter(|k| k.starts_with("cmd-")) {
        let want = match *k {
            "cmd-peek" => 2,
            _ => 1,
        };
        assert_eq!(s.num(k), want, "{k}");
    }
    for k in ["cmd-reserve-job", "cmd-kick-job", "cmd-finish"] {
        assert_eq!(s.num(k), 1, "{k}");
    }
    assert_eq!(s.num("total-jobs"), 1);
    assert_eq!(s.num("current-jobs-ready"), 0);
}

async fn stats_job_counts_by_state(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let j1 = c.put_ok(0, 0, 60, b"1").await;
    let _j2 = c.put_ok(2000, 0, 60, b"2").await;
    let _j3 = c.put_ok(0, 100, 60, b"3").await;
    let j4 = c.put_ok(5, 0, 60, b"4").await;
    let _j5 = c.put_ok(10, 0, 60, b"5").await;
    assert_eq!(c.reserve_body().await.id, j1.to_string());
    c.reserved(&format!("reserve-job {j4}")).await;
    assert_eq!(c.cmd(&format!("bury {j4} 0")).await, "BURIED");
    for doc in [c.stats().await, c.stats_tube("default").await] {
        let want = [
            ("current-jobs-urgent", 1),
            ("current-jobs-ready", 2),
            ("current-jobs-reserved", 1),
            ("current-jobs-delayed", 1),
            ("current-jobs-buried", 1),
            ("total-jobs", 5),
        ];
        for (k, v) in want {
            assert_eq!(doc.num(k), v, "{k}");
        }
    }
    for id in 1..=5 {
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
    let s = c.stats().await;
    for k in [
        "current-jobs-urgent",
        "current-jobs-ready",
        "current-jobs-reserved",
        "current-jobs-delayed",
        "current-jobs-buried",
    ] {
        assert_eq!(s.num(k), 0, "{k}");
    }
    assert_eq!(s.num("total-jobs"), 5);
}

async fn stats_connection_counters(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let mut c = server.client().await;
    for x in [&mut a, &mut b, &mut c] {
        x.ping().await;
    }
    let s = a.stats().await;
    let want = [
        ("current-connections", 3),
        ("total-connections", 3),
        ("current-producers", 0),
        ("current-workers", 0),
        ("current-waiting", 0),
    ];
    for (k, v) in want {
        assert_eq!(s.num(k), v, "{k}");
    }
    a.put_ok(0, 0, 60, b"x").await;
    a.put_ok(0, 0, 60, b"y").await;
    assert_eq!(b.reply("reserve-with-timeout 0").await, "RESERVED 1 1");
    let s = c.stats().await;
    assert_eq!(
        (s.num("current-producers"), s.num("current-workers")),
        (1, 1)
    );
    assert_eq!(c.reply("reserve-with-timeout 0").await, "RESERVED 2 1");
    c.send_line("reserve").await;
    let s = a.wait_stat("current-waiting", 1).await;
    assert_eq!(s.num("current-workers"), 2);
    drop(c);
    let s = a.wait_stat("current-connections", 2).await;
    assert_eq!(s.num("current-workers"), 1);
    assert_eq!(s.num("current-waiting"), 0);
    assert_eq!(s.num("total-connections"), 3);
    // c's reservation came back when it left.
    assert_eq!(s.num("current-jobs-ready"), 1);
    drop(b);
    let s = a.wait_stat("current-connections", 1).await;
    assert_eq!(
        (s.num("current-workers"), s.num("current-producers")),
        (0, 1)
    );
    let mut d = server.client().await;
    d.ping().await;
    drop(a);
    let s = d.wait_stat("current-connections", 1).await;
    assert_eq!(s.num("current-producers"), 0);
    assert_eq!(s.num("total-connections"), 4);
    // `reserve-job` makes a worker too, as in beanstalkd.
    let ready = d.put_ok(0, 0, 60, b"z").await;
    let mut e = server.client().await;
    e.reserved(&format!("reserve-job {ready}")).await;
    assert_eq!(d.stats().await.num("current-workers"), 1);
}

async fn refused_puts_are_counted_as_beanstalkd_counts_them(backend: Backend) {
    let server = TestServer::start(backend).await;
    // A body too big is skipped unread: a `put`, but no producer yet.
    let mut a = server.client().await;
    a.send(b"put 0 0 60 70000\r\n").await;
    a.send(&vec![b'x'; 70_002]).await;
    assert_eq!(a.line().await, "JOB_TOO_BIG");
    let s = a.stats().await;
    assert_eq!((s.num("cmd-put"), s.num("current-producers")), (1, 0));
    // A body read but not ended by CRLF: its connection is a producer.
    let mut b = server.client().await;
    b.send(b"put 0 0 60 1\r\nxyz").await;
    assert_eq!(b.line().await, "EXPECTED_CRLF");
    let s = a.stats().await;
    assert_eq!((s.num("cmd-put"), s.num("current-producers")), (2, 1));
    // A malformed line is not a put at all; neither is a refused import.
    let mut c = server.client().await;
    assert_eq!(c.reply("put 0 0 sixty 1").await, "BAD_FORMAT");
    c.send(b"import 3\r\nabcXY").await;
    assert_eq!(c.line().await, "EXPECTED_CRLF");
    let s = c.stats().await;
    assert_eq!((s.num("cmd-put"), s.num("current-producers")), (2, 1));
    assert_eq!(s.num("total-jobs"), 0);
}

async fn version_is_the_crate_version(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let s = c.stats().await;
    assert_eq!(
        s.get("version"),
        format!("\"{}\"", env!("CARGO_PKG_VERSION"))
    );
}
