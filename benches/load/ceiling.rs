//! The Redis ceiling: how many of delayq's own put and reserve calls Redis
//! itself runs a second on this machine (`redis-benchmark` of `FCALL`), so
//! the Redis engine's figures can be read as a fraction of what Redis allows.

use std::io;
use std::process::Command;

use delayq::store::redis::bench_call;

use crate::procs::{Programs, RedisServer, redis_conn};
use crate::report::Report;

/// One `redis-benchmark` run: how many times a second Redis answered.
fn redis_benchmark(
    port: u16,
    requests: usize,
    pipeline: usize,
    command: &[Vec<u8>],
) -> io::Result<f64> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-c",
        "50",
        "--csv",
    ])
    .args(["-n", &requests.to_string(), "-P", &pipeline.to_string()]);
    for arg in command {
        cmd.arg(std::str::from_utf8(arg).map_err(io::Error::other)?);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // The CSV's second line: "<command>","<requests per second>",...
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|line| line.split("\",\"").nth(1))
        .and_then(|rps| rps.trim_matches('"').parse().ok())
        .ok_or_else(|| io::Error::other(format!("redis-benchmark printed {text:?}")))
}

/// Runs the ceiling measurements against a private `redis-server`.
pub async fn ceiling(programs: &Programs) -> io::Result<Report> {
    let redis = RedisServer::start(&programs.redis_server);
    let (source, _) = bench_call("put", 1).expect("put is a bench op");
    let mut conn = redis_conn(&redis.url()).await?;
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&source)
        .query_async::<String>(&mut conn)
        .await
        .map_err(io::Error::other)?;
    let mut report = Report::default();
    // For scale: the smallest script that reads and writes, two commands.
    let two: Vec<Vec<u8>> = [
        "EVAL",
        "redis.call('INCR', KEYS[1]) return redis.call('INCR', KEYS[1])",
        "1",
        "k",
    ]
    .map(|s| s.as_bytes().to_vec())
    .into();
    report.add(
        "2-command script",
        "/s",
        redis_benchmark(redis.port, 200_000, 1, &two)?,
    );
    report.add(
        "2-command script, pipelined 16",
        "/s",
        redis_benchmark(redis.port, 400_000, 16, &two)?,
    );
    // Puts first: the reserves that follow need ready jobs, fewer than put.
    for (op, scale) in [("put", 2), ("reserve", 1)] {
        for (per_call, pipeline, calls) in [(1, 1, 100_000), (1, 16, 100_000), (16, 1, 10_000)] {
            let calls = calls * scale;
            let (_, command) = bench_call(op, per_call).expect("a bench op");
            let rps = redis_benchmark(redis.port, calls, pipeline, &command)?;
            let label = match (per_call, pipeline) {
                (1, 1) => format!("{op}, 1 per call"),
                (1, p) => format!("{op}, 1 per call, pipelined {p}"),
                (n, _) => format!("{op}, {n} per call"),
            };
            report.add(label, "ops/s", rps * per_call as f64);
        }
    }
    Ok(report)
}
