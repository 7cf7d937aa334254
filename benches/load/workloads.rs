//! The workloads. Each talks to a server at an address like any client and
//! returns what it measured; where a [`Probe`] says which process (and which
//! Redis) serves, it also reads their memory and CPU.

use std::io;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::client::Conn;
use crate::http_client::HttpConn;
use crate::secure::Endpoint;
use redis::aio::MultiplexedConnection;

use crate::procs::{Info, Probe, Stop, cpu, redis_conn, rss, switches};
use crate::report::{Report, histogram, micros};

/// The knobs of every workload; the defaults are the issue's.
#[derive(clap::Args, Clone, Debug)]
pub struct Opts {
    /// cycle: connections, each looping put, reserve, delete.
    #[arg(long, default_value_t = 50)]
    pub conns: usize,
    /// cycle: delayed jobs put (pipelined, due in an hour or two) before
    /// the cycles begin, so that a log compacting during them has that
    /// many live jobs to copy.
    #[arg(long, default_value_t = 0)]
    pub prefill: usize,
    /// cycle, pipeline: seconds measured (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    pub secs: f64,
    /// cycle, pipeline: seconds run before measuring.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Body size of every job, in bytes (at least 24).
    #[arg(long, default_value_t = 100)]
    pub body: usize,
    /// pipeline, lateness: producer connections.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// pipeline, lateness: consumer connections.
    #[arg(long, default_value_t = 50)]
    pub consumers: usize,
    /// pipeline: jobs put but not yet finished, at most (the latency
    /// measured is mostly the time a job waits behind these).
    #[arg(long, default_value_t = 100)]
    pub in_flight: usize,
    /// batch: jobs each connection puts, reserves and finishes at once.
    #[arg(long, default_value_t = 100)]
    pub reserve_batch: usize,
    /// pipeline: puts a producer writes at once.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// lateness: jobs.
    #[arg(long, default_value_t = 20_000)]
    pub late_jobs: usize,
    /// lateness: the puts are spread over this many seconds, and each job's
    /// delay is 1 to this many seconds (beanstalkd's delays are whole seconds).
    #[arg(long, default_value_t = 5)]
    pub spread: u64,
    /// disk: live jobs whose size on disk is measured.
    #[arg(long, default_value_t = 100_000)]
    pub disk_jobs: usize,
    /// disk: live jobs during the put/delete cycles.
    #[arg(long, default_value_t = 1_000)]
    pub disk_live: usize,
    /// disk: put/delete cycles.
    #[arg(long, default_value_t = 300_000)]
    pub disk_cycles: usize,
    /// backlog, restart: delayed jobs.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog: usize,
    /// restart: how the server is stopped, in turn, on the same data (the
    /// first after the backlog, each next one after the previous restart).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kill,term")]
    pub stops: Vec<Stop>,
    /// backlog: connections writing the puts.
    #[arg(long, default_value_t = 4)]
    pub backlog_conns: usize,
    /// backlog: puts written at once, before their replies are read.
    #[arg(long, default_value_t = 1000)]
    pub chunk: usize,
    /// idle: seconds watched.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// conns: connections blocked in reserve-with-timeout.
    #[arg(long, default_value_t = 10_000)]
    pub waiters: usize,
    /// conns: jobs put once they are all blocked.
    #[arg(long, default_value_t = 1000)]
    pub conn_jobs: usize,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A body of `len` bytes that starts with two numbers in hex (a time in
/// nanoseconds and a job number), so that whoever reserves it knows when it
/// was due and which job it is.
fn stamped(len: usize, ns: u64, n: u64) -> Vec<u8> {
    let mut body = format!("{ns:016x}{n:08x}").into_bytes();
    body.resize(len.max(24), b'x');
    body
}

fn stamp(body: &[u8]) -> io::Result<(u64, usize)> {
    let hex = |b: &[u8]| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
    };
    match (body.get(..16).and_then(hex), body.get(16..24).and_then(hex)) {
        (Some(ns), Some(n)) => Ok((ns, n as usize)),
        _ => Err(io::Error::other("a body without the bench's stamp")),
    }
}

fn since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

async fn join<T: 'static>(mut tasks: JoinSet<io::Result<T>>) -> io::Result<Vec<T>> {
    let mut out = Vec::with_capacity(tasks.len());
    while let Some(done) = tasks.join_next().await {
        out.push(done.map_err(io::Error::other)??);
    }
    Ok(out)
}

/// `cycle`: connections each looping put, reserve, delete of one job.
pub async fn cycle(at: &Endpoint, o: &Opts, probe: &Probe) -> io::Result<Report> {
    if o.prefill > 0 {
        let fill = Opts {
            backlog: o.prefill,
            ..o.clone()
        };
        backlog(at, &fill, &Probe::default()).await?;
    }
    let mut watch = Conn::connect(at).await?;
    let log_before = log_figures(&mut watch).await?;
    let from = Instant::now() + secs(o.warmup);
    let until = from + secs(o.secs);
    let costs = tokio::spawn(costs(probe.clone(), from, until));
    let body: Arc<[u8]> = vec![b'x'; o.body].into();
    let mut tasks = JoinSet::new();
    for _ in 0..o.conns {
        let body = body.clone();
        let at = at.clone();
        tasks.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let mut h = cycle_histograms();
            let mut cycles = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= until {
                    break;
                }
                c.queue_put(0, 0, 60, &body);
                c.flush().await?;
                c.reply().await?.id("INSERTED")?;
                let t1 = Instant::now();
                c.queue(format_args!("reserve"));
                let id = c.round_trip().await?.id("RESERVED")?;
                let t2 = Instant::now();
                c.queue(format_args!("delete {id}"));
                c.round_trip().await?.expect("DELETED")?;
                let t3 = Instant::now();
                if t0 >= from {
                    cycles += 1;
                    record_cycle(&mut h, [t0, t1, t2, t3]);
                }
            }
            Ok((cycles, h))
        });
    }
    let (cycles, h) = merge_cycles(join(tasks).await?);
    let log_after = log_figures(&mut watch).await?;
    let mut report = Report::default();
    report.add("cycles/s", "/s", cycles as f64 / o.secs);
    let costs = costs.await.map_err(io::Error::other)??;
    costs.report(&mut report, cycles as f64);
    if let (Some(before), Some(after)) = (log_before, log_after) {
        // Over the whole run, warm-up included: whether the log moved on
        // to new files and compacted (dropped old ones) while measured.
        report.add("binlog files begun", "files", (after[0] - before[0]) as f64);
        report.add(
            "binlog files dropped",
            "files",
            (after[1] - before[1]) as f64,
        );
        report.add(
            "binlog records migrated",
            "records",
            (after[2] - before[2]) as f64,
        );
    }
    // The whole cycle first: the figure the p99 targets are about.
    let [put, reserve, delete, whole] = &h;
    for (name, h) in [
        ("cycle", whole),
        ("put", put),
        ("reserve", reserve),
        ("delete", delete),
    ] {
        report.latency(name, h);
    }
    Ok(report)
}

/// `http-cycle`: the `cycle` over delayq's HTTP API, on `--conns`
/// keep-alive connections to its `--http` listener (`http`), each looping
/// `POST /v1/tubes/default/jobs`, a long-poll
/// `POST /v1/tubes/default/reserve?timeout=10` and
/// `POST /v1/jobs/{id}/finish`; the same figures as `cycle`'s, so the two
/// tables read side by side. A reserve may take another connection's job,
/// as in `cycle`; every connection puts before it reserves, so one always
/// comes.
pub async fn http_cycle(at: &Endpoint, o: &Opts, probe: &Probe) -> io::Result<Report> {
    let from = Instant::now() + secs(o.warmup);
    let until = from + secs(o.secs);
    let costs = tokio::spawn(costs(probe.clone(), from, until));
    let put: Arc<[u8]> = serde_json::to_vec(&serde_json::json!({
        "body": "x".repeat(o.body),
        "ttr": 60,
    }))
    .map_err(io::Error::other)?
    .into();
    let mut tasks = JoinSet::new();
    for _ in 0..o.conns {
        let put = put.clone();
        let at = at.clone();
        tasks.spawn(async move {
            let mut c = HttpConn::connect(&at).await?;
            let mut h = cycle_histograms();
            let mut cycles = 0u64;
            let mut path = String::new();
            loop {
                let t0 = Instant::now();
                if t0 >= until {
                    break;
                }
                c.call("POST", "/v1/tubes/default/jobs", &put)
                    .await?
                    .id(201)?;
                let t1 = Instant::now();
                let id = loop {
                    let answer = c
                        .call("POST", "/v1/tubes/default/reserve?timeout=10", b"")
                        .await?;
                    // A long-poll that ran out is asked again, as a
                    // blocked text `reserve` would go on waiting.
                    if answer.status == 200 && answer.json()?["error"] == "TIMED_OUT" {
                        continue;
                    }
                    break answer.id(200)?;
                };
                let t2 = Instant::now();
                path.clear();
                path.push_str("/v1/jobs/");
                path.push_str(&id);
                path.push_str("/finish");
                c.call("POST", &path, b"").await?.id(200)?;
                let t3 = Instant::now();
                if t0 >= from {
                    cycles += 1;
                    record_cycle(&mut h, [t0, t1, t2, t3]);
                }
            }
            Ok((cycles, h))
        });
    }
    let (cycles, h) = merge_cycles(join(tasks).await?);
    let mut report = Report::default();
    report.add("cycles/s", "/s", cycles as f64 / o.secs);
    let costs = costs.await.map_err(io::Error::other)??;
    costs.report(&mut report, cycles as f64);
    let [put, reserve, finish, whole] = &h;
    for (name, h) in [
        ("cycle", whole),
        ("put", put),
        ("reserve", reserve),
        ("finish", finish),
    ] {
        report.latency(name, h);
    }
    Ok(report)
}

/// The log's `binlog-current-index`, `binlog-oldest-index` and
/// `binlog-records-migrated` from `stats`, for a server that keeps a log.
async fn log_figures(c: &mut Conn) -> io::Result<Option<[u64; 3]>> {
    c.queue(format_args!("stats"));
    let stats = c.round_trip().await?;
    let field = |k| stats.field(k);
    Ok(
        match (
            field("binlog-current-index"),
            field("binlog-oldest-index"),
            field("binlog-records-migrated"),
        ) {
            (Some(current), Some(oldest), Some(migrated)) if current > 0 => {
                Some([current, oldest, migrated])
            }
            _ => None,
        },
    )
}

/// `batch`: C connections each looping over N jobs at once: N puts
/// written together, `reserve-batch N`, `finish-batch` of what came; the
/// jobs moved per second, comparable with `cycle`'s cycles per second (a
/// cycle moves one job the same way).
pub async fn batch(at: &Endpoint, o: &Opts, probe: &Probe) -> io::Result<Report> {
    let from = Instant::now() + secs(o.warmup);
    let until = from + secs(o.secs);
    let costs = tokio::spawn(costs(probe.clone(), from, until));
    let body: Arc<[u8]> = vec![b'x'; o.body].into();
    let n = o.reserve_batch;
    let mut tasks = JoinSet::new();
    for _ in 0..o.conns {
        let body = body.clone();
        let at = at.clone();
        tasks.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let mut h = histogram();
            let mut jobs = 0u64;
            let mut ids = String::new();
            loop {
                let t0 = Instant::now();
                if t0 >= until {
                    break;
                }
                for _ in 0..n {
                    c.queue_put(0, 0, 60, &body);
                }
                c.flush().await?;
                for _ in 0..n {
                    c.reply().await?.id("INSERTED")?;
                }
                c.queue(format_args!("reserve-batch {n}"));
                let got = c.round_trip().await?.id("RESERVED_BATCH")?;
                ids.clear();
                for _ in 0..got {
                    let id = c.reply().await?.id("RESERVED")?;
                    ids.push_str(&format!(" {id}"));
                }
                c.queue(format_args!("finish-batch{ids}"));
                c.round_trip().await?.id("FINISHED")?;
                if t0 >= from {
                    jobs += got;
                    h.saturating_record(micros(t0.elapsed()));
                }
            }
            Ok((jobs, h))
        });
    }
    let mut jobs = 0;
    let mut h = histogram();
    for (n, one) in join(tasks).await? {
        jobs += n;
        h.add(&one).expect("same bounds");
    }
    let mut report = Report::default();
    report.add("jobs/s", "/s", jobs as f64 / o.secs);
    let costs = costs.await.map_err(io::Error::other)??;
    costs.report(&mut report, jobs as f64);
    report.add("round p50", "ms", h.value_at_quantile(0.5) as f64 / 1000.0);
    report.add("round p99", "ms", h.value_at_quantile(0.99) as f64 / 1000.0);
    Ok(report)
}

/// `pipeline`: producers writing puts in batches, consumers reserving and
/// deleting, with at most `in_flight` jobs between them.
pub async fn pipeline(at: &Endpoint, o: &Opts) -> io::Result<Report> {
    let epoch = Instant::now();
    let from = epoch + secs(o.warmup);
    let until = from + secs(o.secs);
    let stop = CancellationToken::new();
    let room = Arc::new(Semaphore::new(o.in_flight));
    let batch = o.batch.clamp(1, o.in_flight);
    let mut producers = JoinSet::new();
    for _ in 0..o.producers {
        let (room, stop, len) = (room.clone(), stop.clone(), o.body);
        let at = at.clone();
        producers.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let mut puts = 0u64;
            loop {
                tokio::select! {
                    permits = room.acquire_many(batch as u32) => permits.map_err(io::Error::other)?.forget(),
                    () = stop.cancelled() => break,
                }
                let now = Instant::now();
                for _ in 0..batch {
                    c.queue_put(0, 0, 60, &stamped(len, since(epoch, now), 0));
                }
                c.flush().await?;
                for _ in 0..batch {
                    c.reply().await?.id("INSERTED")?;
                }
                if now >= from && now < until {
                    puts += batch as u64;
                }
            }
            Ok(puts)
        });
    }
    let mut consumers = JoinSet::new();
    for _ in 0..o.consumers {
        let (room, stop) = (room.clone(), stop.clone());
        let at = at.clone();
        consumers.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let (mut finishes, mut h) = (0u64, histogram());
            c.queue(format_args!("reserve"));
            c.flush().await?;
            loop {
                let reply = tokio::select! {
                    reply = c.reply() => reply?,
                    () = stop.cancelled() => break,
                };
                let now = Instant::now();
                let in_window = now >= from && now < until;
                if reply.is("DELETED") {
                    room.add_permits(1);
                    finishes += u64::from(in_window);
                    continue;
                }
                let id = reply.id("RESERVED")?;
                let (put_at, _) = stamp(reply.body.as_deref().unwrap_or_default())?;
                if in_window {
                    h.saturating_record(micros(now - (epoch + Duration::from_nanos(put_at))));
                }
                c.queue(format_args!("delete {id}"));
                c.queue(format_args!("reserve"));
                c.flush().await?;
            }
            Ok((finishes, h))
        });
    }
    sleep_until(until).await;
    stop.cancel();
    let puts: u64 = join(producers).await?.into_iter().sum();
    let (mut finishes, mut h) = (0, histogram());
    for (n, one) in join(consumers).await? {
        finishes += n;
        h.add(&one).expect("same bounds");
    }
    let mut report = Report::default();
    report.add("puts/s", "/s", puts as f64 / o.secs);
    report.add("finishes/s", "/s", finishes as f64 / o.secs);
    report.latency("put->reserved", &h);
    Ok(report)
}

/// `lateness`: jobs with random delays, put over a few seconds, reserved by
/// consumers already blocked; how late each arrives after its due time.
pub async fn lateness(at: &Endpoint, o: &Opts) -> io::Result<Report> {
    let jobs = o.late_jobs;
    let spread = Duration::from_secs(o.spread.max(1));
    let stop = CancellationToken::new();
    // 0: not seen; then how many times it was delivered, up to 255.
    let seen: Arc<[AtomicU8]> = (0..jobs).map(|_| AtomicU8::new(0)).collect();
    let received = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(Notify::new());
    // Consumers connect and block first; the clock starts after.
    let epoch = Instant::now() + Duration::from_millis(500);
    let mut consumers = JoinSet::new();
    for _ in 0..o.consumers {
        let (stop, seen, received, all_in) =
            (stop.clone(), seen.clone(), received.clone(), all_in.clone());
        let at = at.clone();
        consumers.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let (mut h, mut early) = (histogram(), 0u64);
            c.queue(format_args!("reserve"));
            c.flush().await?;
            loop {
                let reply = tokio::select! {
                    reply = c.reply() => reply?,
                    () = stop.cancelled() => break,
                };
                if reply.is("DELETED") {
                    continue;
                }
                let now = Instant::now();
                let id = reply.id("RESERVED")?;
                let (due, n) = stamp(reply.body.as_deref().unwrap_or_default())?;
                let due = epoch + Duration::from_nanos(due);
                if now < due {
                    early += 1;
                }
                h.saturating_record(micros(now.saturating_duration_since(due)));
                if let Some(seen) = seen.get(n) {
                    let _ = seen.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| {
                        Some(k.saturating_add(1))
                    });
                }
                if received.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                    all_in.notify_one();
                }
                c.queue(format_args!("delete {id}"));
                c.queue(format_args!("reserve"));
                c.flush().await?;
            }
            Ok((h, early))
        });
    }
    let mut producers = JoinSet::new();
    let (producer_count, len) = (o.producers.max(1), o.body);
    for p in 0..producer_count {
        let at = at.clone();
        producers.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            let mut last_due = epoch;
            for n in (p..jobs).step_by(producer_count) {
                sleep_until(epoch + spread.mul_f64(n as f64 / jobs as f64)).await;
                let delay = fastrand::u64(1..=spread.as_secs());
                let due = Instant::now() + Duration::from_secs(delay);
                last_due = last_due.max(due);
                c.queue_put(0, delay, 60, &stamped(len, since(epoch, due), n as u64));
                c.flush().await?;
                c.reply().await?.id("INSERTED")?;
            }
            Ok(last_due)
        });
    }
    let last_due = join(producers).await?.into_iter().max().unwrap_or(epoch);
    // Whatever has not come 3 s after the last due time is counted missing.
    let _ = timeout(
        (last_due + Duration::from_secs(3)).saturating_duration_since(Instant::now()),
        async {
            while received.load(Ordering::Relaxed) < jobs {
                all_in.notified().await;
            }
        },
    )
    .await;
    stop.cancel();
    let (mut h, mut early) = (histogram(), 0);
    for (one, e) in join(consumers).await? {
        h.add(&one).expect("same bounds");
        early += e;
    }
    let missing = seen
        .iter()
        .filter(|s| s.load(Ordering::Relaxed) == 0)
        .count();
    let repeated = seen
        .iter()
        .filter(|s| s.load(Ordering::Relaxed) > 1)
        .count();
    let mut report = Report::default();
    report.latency("late", &h);
    report.add("jobs missing", "jobs", missing as f64);
    report.add("jobs delivered twice", "jobs", repeated as f64);
    report.add("jobs early", "jobs", early as f64);
    Ok(report)
}

async fn used_memory(probe: &Probe) -> io::Result<Option<f64>> {
    match &probe.redis {
        Some(url) => Info::read(&mut redis_conn(url).await?)
            .await?
            .num("used_memory")
            .map(Some),
        None => Ok(None),
    }
}

/// `backlog`: delayed jobs (due in one to two hours) written with pipelined
/// puts; the put rate, and the memory they take.
pub async fn backlog(at: &Endpoint, o: &Opts, probe: &Probe) -> io::Result<Report> {
    let rss_before = probe.pid.map(rss);
    let used_before = used_memory(probe).await?;
    let conns = o.backlog_conns.max(1);
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for k in 0..conns {
        let (chunk, len) = (o.chunk.max(1), o.body);
        let share = o.backlog / conns + usize::from(k < o.backlog % conns);
        let at = at.clone();
        tasks.spawn(async move {
            let mut c = Conn::connect(&at).await?;
            c.queue(format_args!("use backlog"));
            c.round_trip().await?.expect("USING backlog")?;
            let mut left = share;
            while left > 0 {
                let n = left.min(chunk);
                for _ in 0..n {
                    let delay = 3600 + fastrand::u64(0..3600);
                    c.queue_put(0, delay, 60, &stamped(len, 0, 0));
                }
                c.flush().await?;
                for _ in 0..n {
                    c.reply().await?.id("INSERTED")?;
                }
                left -= n;
            }
            Ok(())
        });
    }
    join(tasks).await?;
    let elapsed = start.elapsed();
    let jobs = o.backlog as f64;
    let mut report = Report::default();
    report.add("puts/s", "/s", jobs / elapsed.as_secs_f64());
    if let (Some(before), Some(pid)) = (rss_before, probe.pid) {
        report.add(
            "server RSS/job",
            "B",
            (rss(pid) as f64 - before as f64) / jobs,
        );
    }
    if let (Some(before), Some(after)) = (used_before, used_memory(probe).await?) {
        let per_job = (after - before) / jobs;
        report.add("Redis used_memory/job", "B", per_job);
        report.add("Redis bytes/job beyond body", "B", per_job - o.body as f64);
    }
    Ok(report)
}

/// `idle`: what the server (and its Redis) do over `idle_secs` with no
/// traffic; run after `backlog`, so a big delayed backlog is waiting.
pub async fn idle(o: &Opts, probe: &Probe) -> io::Result<Report> {
    let pid = probe
        .pid
        .ok_or_else(|| io::Error::other("idle needs the server's pid (--pid)"))?;
    let mut redis = match &probe.redis {
        Some(url) => Some(redis_conn(url).await?),
        None => None,
    };
    let redis_figures = async |redis: &mut Option<MultiplexedConnection>| match redis {
        Some(conn) => {
            let info = Info::read(conn).await?;
            let cpu = info.num("used_cpu_sys")? + info.num("used_cpu_user")?;
            io::Result::Ok(Some((info.num("total_commands_processed")?, cpu)))
        }
        None => Ok(None),
    };
    let window = Duration::from_secs(o.idle_secs.max(1));
    let (cpu0, sw0) = (cpu(pid), switches(pid));
    let redis0 = redis_figures(&mut redis).await?;
    sleep(window).await;
    let (cpu1, sw1) = (cpu(pid), switches(pid));
    let redis1 = redis_figures(&mut redis).await?;
    let s = window.as_secs_f64();
    let mut report = Report::default();
    report.add(
        "idle CPU",
        "% of a core",
        (cpu1 - cpu0).as_secs_f64() / s * 100.0,
    );
    report.add("idle wake-ups/s", "/s", (sw1 - sw0) as f64 / s);
    if let (Some((cmds0, rcpu0)), Some((cmds1, rcpu1))) = (redis0, redis1) {
        // The first INFO is counted among the commands the window saw.
        report.add("idle Redis commands/s", "/s", (cmds1 - cmds0 - 1.0) / s);
        report.add("idle Redis CPU", "% of a core", (rcpu1 - rcpu0) / s * 100.0);
    }
    Ok(report)
}

/// `conns`: many connections blocked in `reserve-with-timeout`, then a
/// burst of ready jobs; how long until every job reached a worker, and what
/// each blocked connection costs the server.
pub async fn conns(at: &Endpoint, o: &Opts, probe: &Probe) -> io::Result<Report> {
    let rss_before = probe.pid.map(rss);
    let stop = CancellationToken::new();
    let arrivals = Arc::new(Mutex::new(Vec::with_capacity(o.conn_jobs)));
    let all_in = Arc::new(Notify::new());
    let connecting = Arc::new(Semaphore::new(256));
    let mut waiters = JoinSet::new();
    for _ in 0..o.waiters {
        let (stop, arrivals, all_in, connecting) = (
            stop.clone(),
            arrivals.clone(),
            all_in.clone(),
            connecting.clone(),
        );
        let jobs = o.conn_jobs;
        let at = at.clone();
        waiters.spawn(async move {
            let permit = connecting.acquire_owned().await.map_err(io::Error::other)?;
            let mut c = Conn::connect(&at).await?;
            c.queue(format_args!("reserve-with-timeout 120"));
            c.flush().await?;
            drop(permit);
            let reply = tokio::select! {
                reply = c.reply() => reply?,
                () = stop.cancelled() => return Ok(()),
            };
            reply.id("RESERVED")?;
            {
                let mut arrivals = arrivals.lock().unwrap();
                arrivals.push(Instant::now());
                if arrivals.len() == jobs {
                    all_in.notify_one();
                }
            }
            // Hold the job until the end, as a busy worker would.
            stop.cancelled().await;
            Ok(())
        });
    }
    let mut control = Conn::connect(at).await?;
    let blocked_by = Instant::now() + Duration::from_secs(120);
    loop {
        control.queue(format_args!("stats"));
        let stats = control.round_trip().await?;
        if stats.field("current-waiting").unwrap_or(0) >= o.waiters as u64 {
            break;
        }
        if Instant::now() > blocked_by {
            return Err(io::Error::other(
                "the connections did not all block in time",
            ));
        }
        sleep(Duration::from_millis(50)).await;
    }
    let mut report = Report::default();
    if let (Some(before), Some(pid)) = (rss_before, probe.pid) {
        let per_conn = (rss(pid) as f64 - before as f64) / o.waiters as f64;
        report.add("server RSS/blocked conn", "B", per_conn);
    }
    let body = vec![b'x'; o.body];
    for _ in 0..o.conn_jobs {
        control.queue_put(0, 0, 60, &body);
    }
    let start = Instant::now();
    control.flush().await?;
    for _ in 0..o.conn_jobs {
        control.reply().await?.id("INSERTED")?;
    }
    let _ = timeout(Duration::from_secs(10), async {
        while arrivals.lock().unwrap().len() < o.conn_jobs {
            all_in.notified().await;
        }
    })
    .await;
    let arrivals = std::mem::take(&mut *arrivals.lock().unwrap());
    let mut h: Histogram<u64> = histogram();
    for at in &arrivals {
        h.saturating_record(micros(*at - start));
    }
    report.add("jobs delivered", "jobs", arrivals.len() as f64);
    if let Some(last) = arrivals.iter().max() {
        report.add(
            "all delivered after",
            "ms",
            (*last - start).as_secs_f64() * 1e3,
        );
    }
    report.add("delivery p50", "ms", h.value_at_quantile(0.5) as f64 / 1e3);
    stop.cancel();
    join(waiters).await?;
    Ok(report)
}

/// What the server (and each Redis behind it) spent over a measured window.
struct Costs {
    /// The server's CPU time.
    server: Option<Duration>,
    /// Each Redis node's CPU seconds and `FCALL`s.
    redis: Vec<(f64, f64)>,
}

/// One Redis node's CPU seconds and `FCALL`s so far.
async fn redis_costs(conn: &mut MultiplexedConnection) -> io::Result<(f64, f64)> {
    let info = Info::read(conn).await?;
    let cpu = info.num("used_cpu_sys")? + info.num("used_cpu_user")?;
    // `cmdstat_fcall:calls=N,usec=...`; absent before the first call.
    let calls = info
        .text("cmdstat_fcall")
        .and_then(|v| v.strip_prefix("calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    Ok((cpu, calls))
}

/// Reads the server's CPU and its Redis nodes' (`probe.redis`: URLs,
/// comma-separated, one per node of a cluster) at `from` and at `until`.
async fn costs(probe: Probe, from: Instant, until: Instant) -> io::Result<Costs> {
    let mut nodes = Vec::new();
    for url in probe.redis.iter().flat_map(|urls| urls.split(',')) {
        nodes.push(redis_conn(url).await?);
    }
    let read = async |nodes: &mut Vec<MultiplexedConnection>| {
        let mut figures = Vec::with_capacity(nodes.len());
        for node in nodes.iter_mut() {
            figures.push(redis_costs(node).await?);
        }
        io::Result::Ok((probe.pid.map(cpu), figures))
    };
    sleep_until(from).await;
    let (server0, redis0) = read(&mut nodes).await?;
    sleep_until(until).await;
    let (server1, redis1) = read(&mut nodes).await?;
    Ok(Costs {
        server: server0.zip(server1).map(|(a, b)| b - a),
        redis: redis0
            .iter()
            .zip(&redis1)
            .map(|(a, b)| (b.0 - a.0, b.1 - a.1))
            .collect(),
    })
}

impl Costs {
    /// Adds the costs per cycle of `cycles`, and how evenly the Redis nodes
    /// shared the calls.
    fn report(&self, report: &mut Report, cycles: f64) {
        if cycles == 0.0 {
            return;
        }
        if let Some(server) = self.server {
            let us = server.as_secs_f64() * 1e6 / cycles;
            report.add("server CPU per cycle", "µs", us);
        }
        if self.redis.is_empty() {
            return;
        }
        let cpu: f64 = self.redis.iter().map(|(cpu, _)| cpu).sum();
        let calls: f64 = self.redis.iter().map(|(_, calls)| calls).sum();
        report.add("Redis CPU per cycle", "µs", cpu * 1e6 / cycles);
        report.add("Redis FCALLs per cycle", "calls", calls / cycles);
        if self.redis.len() > 1 {
            let mean = calls / self.redis.len() as f64;
            let furthest = self
                .redis
                .iter()
                .map(|(_, c)| (c - mean).abs() / mean * 100.0)
                .fold(0.0, f64::max);
            report.add("FCALL spread over nodes", "% off even", furthest);
        }
    }
}

/// Asks `GET /metrics` of the HTTP listener at `at` at once and then every
/// `every`, on one keep-alive connection, as Prometheus would, until the
/// task is aborted; fails at the first answer that is not 200 (a token
/// refused, say), so that a run is not measured without its scrapes.
pub async fn scrape(at: Endpoint, every: Duration) -> io::Result<()> {
    let mut c = HttpConn::connect(&at).await?;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let answer = c.call("GET", "/metrics", b"").await?;
        if answer.status != 200 {
            return Err(io::Error::other(format!(
                "GET /metrics: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )));
        }
    }
}

/// The histograms of one connection's cycles: its three steps, then the
/// whole cycle.
fn cycle_histograms() -> [Histogram<u64>; 4] {
    [histogram(), histogram(), histogram(), histogram()]
}

/// Records one cycle whose steps began at `t[0]`, `t[1]`, `t[2]` and whose
/// last ended at `t[3]`.
fn record_cycle(h: &mut [Histogram<u64>; 4], t: [Instant; 4]) {
    h[0].saturating_record(micros(t[1] - t[0]));
    h[1].saturating_record(micros(t[2] - t[1]));
    h[2].saturating_record(micros(t[3] - t[2]));
    h[3].saturating_record(micros(t[3] - t[0]));
}

/// The connections' cycles and histograms, summed.
fn merge_cycles(each: Vec<(u64, [Histogram<u64>; 4])>) -> (u64, [Histogram<u64>; 4]) {
    let mut cycles = 0;
    let mut h = cycle_histograms();
    for (n, hs) in each {
        cycles += n;
        for (sum, one) in h.iter_mut().zip(&hs) {
            sum.add(one).expect("same bounds");
        }
    }
    (cycles, h)
}
