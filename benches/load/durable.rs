//! The workloads of servers that keep jobs across a process: `restart` (a
//! big backlog, a stop, the time until a new process serves all of it) and
//! `disk` (bytes on disk per live job, and what put/delete cycles leave).

use std::io;
use std::time::{Duration, Instant};

use crate::client::Conn;
use crate::procs::{Programs, Target, dir_size, rss};
use crate::report::Report;
use crate::workloads::{Opts, backlog};

/// `restart`: the `backlog` of delayed jobs, then for each of `--stops` in
/// turn (on the same data): the stop, a new process, the seconds from its
/// spawn until it answers and until its `stats` count every job, and its
/// memory then against the old one's just before the stop.
pub async fn restart(target: &mut Target, programs: &Programs, o: &Opts) -> io::Result<Report> {
    let empty = target.dir.as_ref().map(|d| dir_size(d.path()));
    let mut report = backlog(&target.endpoint(), o, &target.probe()).await?;
    if let (Some(dir), Some(empty)) = (&target.dir, empty) {
        // beanstalkd writes within 50 ms, not at once.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // With this many jobs, a preallocated file is a small part.
        let full = dir_size(dir.path());
        let per_job = |now: u64, then: u64| (now as f64 - then as f64) / o.backlog as f64;
        report.add("disk/job (allocated)", "B", per_job(full.0, empty.0));
        report.add("disk/job (file lengths)", "B", per_job(full.1, empty.1));
    }
    for &stop in &o.stops {
        // What -f or -F has not synced yet is in the page cache, which a
        // SIGKILL leaves; give the servers that sync late the same footing.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let name = stop.name();
        let before = rss(target.server.pid());
        let took = target.stop(stop);
        let start = Instant::now();
        target.respawn(programs);
        let (answered, back) = wait_for_jobs(target, o.backlog as u64, start).await?;
        let after = rss(target.server.pid());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let settled = rss(target.server.pid());
        let mib = |b: u64| b as f64 / 1048576.0;
        report.add(
            format!("{name}: gone after"),
            "ms",
            took.as_secs_f64() * 1e3,
        );
        report.add(format!("{name}: answers after"), "s", answered);
        report.add(format!("{name}: all jobs back after"), "s", back);
        report.add(format!("{name}: RSS before"), "MiB", mib(before));
        report.add(format!("{name}: RSS when all back"), "MiB", mib(after));
        report.add(format!("{name}: RSS 1 s later"), "MiB", mib(settled));
    }
    Ok(report)
}

/// Polls the server just spawned until it accepts a connection, then its
/// `stats` until `current-jobs-delayed` is `jobs`: the seconds since
/// `start` at each.
async fn wait_for_jobs(target: &Target, jobs: u64, start: Instant) -> io::Result<(f64, f64)> {
    let limit = Duration::from_secs(300);
    let poll = Duration::from_millis(2);
    let mut c = loop {
        match Conn::connect(&target.endpoint()).await {
            Ok(c) => break c,
            Err(_) if start.elapsed() < limit => tokio::time::sleep(poll).await,
            Err(e) => return Err(io::Error::other(format!("the server never answered: {e}"))),
        }
    };
    // Answering is answering a command, not only accepting a connection.
    c.queue(format_args!("stats"));
    let mut stats = c.round_trip().await?;
    let answered = start.elapsed().as_secs_f64();
    while stats.field("current-jobs-delayed") != Some(jobs) {
        if start.elapsed() > limit {
            return Err(io::Error::other(format!(
                "the jobs did not all come back: {:?} of {jobs}",
                stats.field("current-jobs-delayed")
            )));
        }
        tokio::time::sleep(poll).await;
        c.queue(format_args!("stats"));
        stats = c.round_trip().await?;
    }
    Ok((answered, start.elapsed().as_secs_f64()))
}

/// `disk`: `disk_jobs` delayed jobs, then the data directory's size per job;
/// then `disk_cycles` put/delete cycles over `disk_live` live jobs and the
/// directory's size after them (and after a second for compaction to end).
pub async fn disk(target: &Target, o: &Opts) -> io::Result<Report> {
    let dir = target
        .dir
        .as_ref()
        .ok_or_else(|| io::Error::other("disk needs a server with a data directory"))?;
    let mut c = Conn::connect(&target.endpoint()).await?;
    let body = vec![b'x'; o.body];
    let empty = dir_size(dir.path());
    let mut ids = std::collections::VecDeque::new();
    put_many(&mut c, &body, o.disk_jobs, &mut ids).await?;
    // beanstalkd writes within 50 ms, not at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let full = dir_size(dir.path());
    let mut report = Report::default();
    // Files are preallocated (beanstalkd's 10 MiB, delayq's -s): the figure
    // is exact only to about a file's size divided by the jobs; `restart`
    // measures the same with ten times as many.
    let per_job = |now: u64, then: u64| (now as f64 - then as f64) / o.disk_jobs as f64;
    report.add("disk/live job (allocated)", "B", per_job(full.0, empty.0));
    report.add(
        "disk/live job (file lengths)",
        "B",
        per_job(full.1, empty.1),
    );
    delete_many(&mut c, ids.len(), &mut ids).await?;

    put_many(&mut c, &body, o.disk_live, &mut ids).await?;
    let start = Instant::now();
    let mut done = 0;
    while done < o.disk_cycles {
        let n = 100.min(o.disk_cycles - done);
        put_many(&mut c, &body, n, &mut ids).await?;
        delete_many(&mut c, n, &mut ids).await?;
        done += n;
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = dir_size(dir.path());
    report.add("put/delete cycles/s (pipelined 100)", "/s", rate);
    report.add(
        "dir after cycles (allocated)",
        "MiB",
        after.0 as f64 / 1048576.0,
    );
    report.add(
        "dir after cycles (file lengths)",
        "MiB",
        after.1 as f64 / 1048576.0,
    );
    Ok(report)
}

/// Puts `n` delayed jobs in one write and reads their ids.
async fn put_many(
    c: &mut Conn,
    body: &[u8],
    n: usize,
    ids: &mut std::collections::VecDeque<u64>,
) -> io::Result<()> {
    for chunk in 0..n.div_ceil(1000) {
        let k = 1000.min(n - chunk * 1000);
        for _ in 0..k {
            c.queue_put(0, 3600, 60, body);
        }
        c.flush().await?;
        for _ in 0..k {
            ids.push_back(c.reply().await?.id("INSERTED")?);
        }
    }
    Ok(())
}

/// Deletes the `n` oldest of `ids` in one write.
async fn delete_many(
    c: &mut Conn,
    n: usize,
    ids: &mut std::collections::VecDeque<u64>,
) -> io::Result<()> {
    let gone: Vec<u64> = ids.drain(..n).collect();
    for chunk in gone.chunks(1000) {
        for id in chunk {
            c.queue(format_args!("delete {id}"));
        }
        c.flush().await?;
        for _ in chunk {
            c.reply().await?.expect("DELETED")?;
        }
    }
    Ok(())
}
