//! delayq's load generator. It speaks beanstalkd's protocol, so one
//! generator measures delayq on either engine and beanstalkd itself on the
//! same machine, in the same run.
//!
//! ```text
//! cargo bench --bench load -- compare            # the usual workloads, 3 rounds, the default servers
//! cargo bench --bench load -- compare --workloads cycle,lateness \
//!     --targets beanstalkd-b,beanstalkd-b-f0,delayq-durable,delayq-f50 --baseline beanstalkd-b
//! cargo bench --bench load -- compare --workloads cycle \
//!     --targets 'delayq-durable,delayq-durable:-s 1048576'   # KIND:ARGS adds arguments
//! cargo bench --bench load -- restart --target beanstalkd-b --stops kill,term
//! cargo bench --bench load -- cycle --target delayq-redis
//! cargo bench --bench load -- cycle --addr 127.0.0.1:11300 [--pid PID] [--redis URL[,URL...]]
//! cargo bench --bench load -- compare --workloads cycle,http-cycle \
//!     --targets delayq-memory,delayq-durable,delayq-redis
//! cargo bench --bench load -- http-cycle --addr 127.0.0.1:11300 --http-addr 127.0.0.1:11380
//! cargo bench --bench load -- compare --workloads cycle,http-cycle --baseline delayq-memory \
//!     --targets 'delayq-memory,delayq-memory:--secure --scrape 1'   # everything on
//! cargo bench --bench load -- ceiling            # what Redis itself allows
//! ```
//!
//! Servers (`--target`, `--targets`), each started afresh, on a fresh
//! temporary data directory where it keeps one: `beanstalkd` (no binlog),
//! `beanstalkd-b` (`-b DIR`, synced at most every 50 ms, its default),
//! `beanstalkd-b-f0` (`-b DIR -f 0`), `delayq-memory` (`--in-memory`),
//! `delayq-durable` (`-b DIR`, delayq's default: synced before every
//! reply), `delayq-f50` (`-b DIR -f 50`) and `delayq-redis` (on a private
//! redis-server). `KIND:ARGS` adds arguments to one's command line.
//!
//! Tokens and TLS: when a delayq's arguments have `--tokens FILE`, every
//! connection the bench makes to it (text, HTTP, the scraper) authenticates
//! with the file's first token that has the admin role and no prefix; with
//! `--tls-cert C`, every one speaks TLS to 127.0.0.1 as `localhost`,
//! trusting C only (so C must name `localhost`). Two arguments of a
//! delayq's ARGS are the bench's own: `--secure` makes a self-signed
//! certificate and a tokens file and adds `--tls-cert`, `--tls-key`,
//! `--tokens` and an `--http` listener; `--scrape SECS` turns `--http` on
//! and asks `GET /metrics` every SECS seconds while a workload runs (not
//! during `restart` and `disk`). With `--addr`, `--tokens` and `--tls-cert`
//! say the same of a server the bench did not start.
//!
//! Workloads (see `--help` for their knobs):
//! * `cycle`: C connections each looping put, reserve, delete of a 100-byte job.
//! * `batch`: the cycle in batches of N (`--reserve-batch`): N puts written
//!   at once, one `reserve-batch N`, one `finish-batch`; jobs per second
//!   (delayq only: beanstalkd has no batch commands).
//! * `pipeline`: producers writing puts in batches, consumers reserving and
//!   deleting; end-to-end latency from put to reserved.
//! * `lateness`: 20k jobs with random delays, consumers blocked in reserve;
//!   how late after its due time each job arrives, and how many never do.
//! * `backlog`: 1M delayed jobs put with pipelined writes; put rate and
//!   memory per job. `idle` fills the same backlog, then watches the server
//!   (and its Redis) do nothing for 10 s.
//! * `conns`: 10k connections blocked in reserve-with-timeout, then 1k jobs.
//! * `restart`: the backlog, then a stop (SIGKILL, SIGTERM: `--stops`) and
//!   the time from spawning a new process until it answers and its `stats`
//!   count every job; its memory against the old one's.
//! * `disk`: bytes on disk per live job; what put/delete cycles leave.
//! * `http-cycle`: the cycle over delayq's HTTP API (the bench starts
//!   delayq with `--http` for it): C keep-alive connections each looping
//!   `POST /v1/tubes/default/jobs`, a long-poll reserve and
//!   `POST /v1/jobs/{id}/finish`; the same figures as `cycle`, to read
//!   beside it (delayq only: beanstalkd has no HTTP; its column is n/a).
//!
//! `compare` starts each server afresh for every run, runs each workload on
//! them in turn, round after round, and prints the medians and their ratios
//! to the baseline's (`--baseline`, by default the first beanstalkd
//! listed). A workload a server cannot run (`restart` on a server that
//! keeps nothing, `disk` on one without a directory, `batch` and
//! `http-cycle` on beanstalkd) is left out for it: its column says n/a.
//! Redis runs without RDB or AOF.

mod ceiling;
mod client;
mod durable;
mod http_client;
// The tests' port picker, shared rather than copied.
#[path = "../../tests/common/ports.rs"]
mod ports;
mod procs;
mod report;
mod secure;
mod workloads;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use procs::{Probe, Programs, Spec, Target};
use report::{Report, fmt, median};
use secure::{Access, Endpoint};
use workloads::Opts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum What {
    Cycle,
    /// The cycle in batches: put N (pipelined), `reserve-batch N`,
    /// `finish-batch` (delayq only).
    Batch,
    Pipeline,
    Lateness,
    Backlog,
    Idle,
    Conns,
    /// The backlog, then SIGKILL and the time until a new process serves
    /// all of it (servers with a data directory).
    Restart,
    /// Bytes on disk per live job, and after put/delete cycles.
    Disk,
    /// The cycle over delayq's HTTP API (`--http`): put, long-poll
    /// reserve, finish, on keep-alive connections (delayq only).
    HttpCycle,
    /// Every chosen workload on every chosen server, in alternation.
    Compare,
    /// redis-benchmark of delayq's own Redis functions.
    Ceiling,
}

impl What {
    /// Whether it talks to delayq's HTTP listener, which the bench then
    /// turns on.
    fn needs_http(self) -> bool {
        self == What::HttpCycle
    }
}

#[derive(Parser, Debug)]
#[command(about = "Load generator for beanstalkd-protocol servers")]
struct Cli {
    /// A workload, `compare` or `ceiling`.
    what: What,
    /// Run one workload against the server at this address, instead of one
    /// the bench starts.
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// With --addr: the server's HTTP listener (its `--http`), for
    /// http-cycle.
    #[arg(long)]
    http_addr: Option<SocketAddr>,
    /// With --addr: the server's process id, for its memory and CPU.
    #[arg(long)]
    pid: Option<u32>,
    /// With --addr: the Redis behind the server, for its INFO (on a
    /// cluster, every primary's URL, comma-separated).
    #[arg(long)]
    redis: Option<String>,
    /// With --addr: the server's `--tokens` file; the bench authenticates
    /// with its first admin token without a prefix.
    #[arg(long)]
    tokens: Option<String>,
    /// With --addr: the server's `--tls-cert`; the bench connects over TLS
    /// trusting it only (it must name `localhost`).
    #[arg(long)]
    tls_cert: Option<String>,
    /// Without --addr: the server to start for one workload (`KIND` or
    /// `KIND:ARGS`).
    #[arg(long, default_value = "delayq-durable")]
    target: Spec,
    /// compare: rounds (each runs every server once per workload).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// compare: the workloads.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "cycle,pipeline,lateness,idle,conns"
    )]
    workloads: Vec<What>,
    /// compare: the servers, side by side (`KIND` or `KIND:ARGS`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "beanstalkd,beanstalkd-b,delayq-memory,delayq-durable,delayq-redis"
    )]
    targets: Vec<Spec>,
    /// compare: the server the ratios are to (one of --targets; default:
    /// the first beanstalkd listed, else the first).
    #[arg(long)]
    baseline: Option<Spec>,
    /// compare: also measure the Redis ceiling.
    #[arg(long)]
    ceiling: bool,
    /// Threads of the load generator (1: all on one core, leaving the
    /// other cores to the server).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The delayq binary (default: the one cargo built).
    #[arg(long)]
    delayq: Option<PathBuf>,
    #[command(flatten)]
    opts: Opts,
}

fn main() {
    // `cargo bench` passes `--bench` to every bench without a harness.
    let cli = Cli::parse_from(std::env::args().filter(|a| a != "--bench"));
    // `conns` opens ten thousand connections, and the servers the bench
    // starts inherit the limit.
    delayq::server::raise_fd_limit();
    let runtime = if cli.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(cli.threads);
        b
    }
    .enable_all()
    .build()
    .expect("a runtime");
    if let Err(e) = runtime.block_on(main_async(cli)) {
        eprintln!("load: {e}");
        std::process::exit(1);
    }
}

async fn main_async(cli: Cli) -> io::Result<()> {
    let programs = Programs {
        delayq: cli
            .delayq
            .clone()
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_delayq").into()),
        beanstalkd: program("beanstalkd", "beanstalkd")?,
        redis_server: program("redis-server", "redis-server")?,
    };
    match cli.what {
        What::Compare => compare(&cli, &programs).await,
        What::Ceiling => {
            ceiling::ceiling(&programs).await?.print();
            Ok(())
        }
        what => {
            let report = match cli.addr {
                Some(addr) => {
                    let probe = Probe {
                        pid: cli.pid,
                        redis: cli.redis.clone(),
                    };
                    let mut args = Vec::new();
                    for (flag, value) in [("--tokens", &cli.tokens), ("--tls-cert", &cli.tls_cert)]
                    {
                        args.extend(value.iter().flat_map(|v| [flag.to_string(), v.clone()]));
                    }
                    let access = Access::from_args(&args)?;
                    let at = |addr| Endpoint {
                        addr,
                        access: access.clone(),
                    };
                    run(
                        what,
                        &at(addr),
                        cli.http_addr.map(at).as_ref(),
                        &probe,
                        &cli.opts,
                    )
                    .await?
                }
                None => {
                    if !fits(what, &cli.target) {
                        return Err(io::Error::other(format!(
                            "{what:?} cannot run on {}",
                            cli.target.label()
                        )));
                    }
                    let mut target = Target::start(&cli.target, &programs, what.needs_http())?;
                    run_on(what, &mut target, &programs, &cli.opts).await?
                }
            };
            report.print();
            Ok(())
        }
    }
}

/// Where `name` is on the PATH; an error says which Debian package has it.
fn program(name: &str, package: &str) -> io::Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            io::Error::other(format!(
                "{name} is not installed: apt-get install {package} redis-tools"
            ))
        })
}

async fn run(
    what: What,
    addr: &Endpoint,
    http: Option<&Endpoint>,
    probe: &Probe,
    o: &Opts,
) -> io::Result<Report> {
    let before = procs::machine_cpu();
    let mut report = run_workload(what, addr, http, probe, o).await?;
    // On a shared virtual machine the host may keep its CPUs waiting: a
    // round with much stolen is no fair comparison with one without.
    if let (Some((total0, stolen0)), Some((total1, stolen1))) = (before, procs::machine_cpu())
        && total1 > total0
    {
        let share = (stolen1 - stolen0) as f64 / (total1 - total0) as f64;
        report.add("CPU stolen (machine)", "%", share * 100.0);
    }
    Ok(report)
}

async fn run_workload(
    what: What,
    addr: &Endpoint,
    http: Option<&Endpoint>,
    probe: &Probe,
    o: &Opts,
) -> io::Result<Report> {
    match what {
        What::HttpCycle => {
            let http = http.ok_or_else(|| {
                io::Error::other("http-cycle needs delayq's HTTP address (--http-addr)")
            })?;
            workloads::http_cycle(http, o, probe).await
        }
        What::Cycle => workloads::cycle(addr, o, probe).await,
        What::Batch => workloads::batch(addr, o, probe).await,
        What::Pipeline => workloads::pipeline(addr, o).await,
        What::Lateness => workloads::lateness(addr, o).await,
        What::Backlog => workloads::backlog(addr, o, probe).await,
        What::Idle => {
            let mut report = workloads::backlog(addr, o, probe).await?;
            report.0.extend(workloads::idle(o, probe).await?.0);
            Ok(report)
        }
        What::Conns => workloads::conns(addr, o, probe).await,
        What::Restart | What::Disk => Err(io::Error::other(
            "restart and disk need a server the bench starts (no --addr)",
        )),
        What::Compare | What::Ceiling => Err(io::Error::other("not a workload")),
    }
}

/// Runs `what` on a server the bench started.
async fn run_on(
    what: What,
    target: &mut Target,
    programs: &Programs,
    o: &Opts,
) -> io::Result<Report> {
    match what {
        What::Restart => durable::restart(target, programs, o).await,
        What::Disk => durable::disk(target, o).await,
        _ => {
            // Only here: `restart` moves the server to new ports, where a
            // scraper would not follow, and `disk` measures bytes, not time.
            let scraper = target
                .spec
                .scrape()
                .zip(target.http_endpoint())
                .map(|(every, at)| tokio::spawn(workloads::scrape(at, every)));
            let http = target.http_endpoint();
            let report = run(what, &target.endpoint(), http.as_ref(), &target.probe(), o).await;
            if let Some(scraper) = scraper {
                if scraper.is_finished() {
                    // It only ever ends by failing.
                    scraper.await.map_err(io::Error::other)??;
                } else {
                    scraper.abort();
                }
            }
            report
        }
    }
}

/// Whether `what` can run on the server `spec` starts.
fn fits(what: What, spec: &Spec) -> bool {
    match what {
        What::Restart => spec.kind.keeps_jobs(),
        What::Disk => spec.kind.keeps_a_dir(),
        What::Batch | What::HttpCycle => !spec.kind.is_beanstalkd(),
        _ => true,
    }
}

async fn compare(cli: &Cli, programs: &Programs) -> io::Result<()> {
    let base = match &cli.baseline {
        Some(b) => Some(cli.targets.iter().position(|t| t == b).ok_or_else(|| {
            io::Error::other(format!("the baseline {} is not among --targets", b.label()))
        })?),
        None => cli.targets.iter().position(|t| t.kind.is_beanstalkd()),
    }
    .unwrap_or(0);
    print_machine(programs);
    if cli.ceiling {
        println!("\n### Redis ceiling (redis-benchmark, 50 connections)\n");
        let report = ceiling::ceiling(programs).await?;
        println!("| call | per second |\n| --- | ---: |");
        for f in &report.0 {
            println!("| {} | {} |", f.name, fmt(f.value));
        }
    }
    for &what in &cli.workloads {
        let mut runs: Vec<(&Spec, Vec<Report>)> =
            cli.targets.iter().map(|s| (s, Vec::new())).collect();
        for round in 1..=cli.rounds {
            for (spec, reports) in &mut runs {
                if !fits(what, spec) {
                    if round == 1 {
                        eprintln!("{what:?} {}: n/a (it cannot run there)", spec.label());
                    }
                    continue;
                }
                let mut target = Target::start(spec, programs, what.needs_http())?;
                let report = run_on(what, &mut target, programs, &cli.opts).await?;
                drop(target);
                let summary: Vec<String> = report
                    .0
                    .iter()
                    .map(|f| format!("{} {}", f.name, fmt(f.value)))
                    .collect();
                eprintln!(
                    "{what:?} round {round} {}: {}",
                    spec.label(),
                    summary.join(", ")
                );
                reports.push(report);
            }
        }
        print_table(what, &runs, base, cli.rounds);
    }
    Ok(())
}

/// One workload's medians, and their ratios to the baseline's (`base`, an
/// index into `runs`). A server that could not run it (see [`fits`]) has a
/// column of "n/a", so that a missing figure reads as not applicable
/// rather than as forgotten.
fn print_table(what: What, runs: &[(&Spec, Vec<Report>)], base: usize, rounds: usize) {
    let mut names: Vec<(String, &str)> = Vec::new();
    for (_, reports) in runs {
        for f in reports.iter().flat_map(|r| &r.0) {
            if !names.iter().any(|(n, _)| *n == f.name) {
                names.push((f.name.clone(), f.unit));
            }
        }
    }
    let ran: Vec<usize> = (0..runs.len()).filter(|&i| !runs[i].1.is_empty()).collect();
    let base = ran.contains(&base).then_some(base);
    let others: Vec<usize> = ran.iter().copied().filter(|&i| Some(i) != base).collect();
    println!("\n### {what:?} (median of {rounds} runs)\n");
    let mut head = String::from("| figure | unit |");
    let mut rule = String::from("| --- | --- |");
    for (spec, _) in runs {
        head += &format!(" {} |", spec.label());
        rule += " ---: |";
    }
    if let Some(b) = base {
        for &i in &others {
            head += &format!(" {} ÷ {} |", runs[i].0.label(), runs[b].0.label());
            rule += " ---: |";
        }
    }
    println!("{head}\n{rule}");
    for (name, unit) in names {
        let medians: Vec<f64> = runs
            .iter()
            .map(|(_, reports)| {
                let mut values: Vec<f64> = reports.iter().filter_map(|r| r.get(&name)).collect();
                median(&mut values)
            })
            .collect();
        let mut row = format!("| {name} | {unit} |");
        for (i, (_, reports)) in runs.iter().enumerate() {
            row += &if reports.is_empty() {
                " n/a |".to_string()
            } else {
                format!(" {} |", fmt(medians[i]))
            };
        }
        if let Some(b) = base {
            for &i in &others {
                let ratio = medians[i] / medians[b];
                row += &if ratio.is_finite() {
                    format!(" {ratio:.2} |")
                } else {
                    " - |".into()
                };
            }
        }
        println!("{row}");
    }
}

fn print_machine(programs: &Programs) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or("?".into(), |kb| format!("{:.1} GiB", kb as f64 / 1048576.0));
    let version = |program: &PathBuf, flag: &str| {
        std::process::Command::new(program)
            .arg(flag)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    println!("## Machine: {cores} cores, {mem} of memory");
    println!("- {}", version(&programs.beanstalkd, "-v"));
    println!("- {}", version(&programs.redis_server, "--version"));
    println!("- delayq: {}", programs.delayq.display());
}
