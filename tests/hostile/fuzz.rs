//! Random byte streams at a real server: commands with random arguments,
//! numbers at and past every limit, bodies of the wrong length, JSON lines
//! mangled, plain noise, all cut at random points into separate writes.
//! Every stream must be answered with well-formed replies and the
//! connection closed after the client's end of input, within a deadline;
//! nothing in delayq may panic; and afterwards the server's counters still
//! add up.
//!
//! The streams come from a seed: `DELAYQ_FUZZ_SEED=<n>` replays a run (the
//! seed is printed), `DELAYQ_SOAK=1` runs many more with a fresh seed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delayq::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Backend, TestServer, Yaml};

backend_tests!(random_streams_get_well_formed_replies_and_no_panic);

/// Small, so bodies at and past the limit come up often.
const MAX_JOB: usize = 64;

/// How long one stream may take to be answered and closed.
const DEADLINE: Duration = Duration::from_secs(10);

/// How many streams are in flight at once, on separate connections.
const CONCURRENT: usize = 4;

/// Panics anywhere outside the test code itself: in delayq, whichever
/// thread or task it runs on.
static SERVER_PANICS: AtomicU64 = AtomicU64::new(0);

fn count_server_panics() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_tests = info
                .location()
                .is_some_and(|l| l.file().starts_with("tests"));
            if !in_tests {
                SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

fn seed() -> u64 {
    match std::env::var("DELAYQ_FUZZ_SEED") {
        Ok(s) => s.parse().expect("DELAYQ_FUZZ_SEED is a number"),
        Err(_) if crate::soak() => fastrand::u64(..),
        // CI replays the same streams every time.
        Err(_) => 0x64_656c_6179,
    }
}

async fn random_streams_get_well_formed_replies_and_no_panic(backend: Backend) {
    count_server_panics();
    let streams = crate::scale(200, 20_000);
    let seed = seed();
    // Printed first, so a run that fails anywhere can be replayed.
    println!("{backend:?}: fuzz seed {seed} (DELAYQ_FUZZ_SEED replays it)");
    let config = Config {
        max_job_size: MAX_JOB,
        ..Config::default()
    };
    let server = TestServer::start_with(backend, config).await;
    let start = Instant::now();
    let mut bytes = 0;
    let mut replies = 0;
    let mut next = 0;
    let mut flying = tokio::task::JoinSet::new();
    while next < streams || !flying.is_empty() {
        while next < streams && flying.len() < CONCURRENT {
            let mut g = Gen::new(seed.wrapping_add(next as u64));
            let input = g.stream();
            let cuts = g.cuts(input.len());
            let addr = server.addr;
            let index = next;
            flying.spawn(async move {
                let out = tokio::time::timeout(DEADLINE, exchange(addr, &input, &cuts))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "stream {index} (seed {seed}) not answered and closed within \
                             {DEADLINE:?}: {:?}",
                            String::from_utf8_lossy(&input)
                        )
                    });
                let n = check_replies(&out).unwrap_or_else(|e| {
                    panic!(
                        "stream {index} (seed {seed}): {e}\ninput: {:?}\noutput: {:?}",
                        String::from_utf8_lossy(&input),
                        String::from_utf8_lossy(&out)
                    )
                });
                (input.len(), n)
            });
            next += 1;
        }
        let (b, n) = flying
            .join_next()
            .await
            .expect("a stream in flight")
            .expect("a stream failed");
        bytes += b;
        replies += n;
    }
    assert_eq!(SERVER_PANICS.load(Ordering::SeqCst), 0, "delayq panicked");

    // The server is still whole: every connection let go, no job left
    // reserved by one, and the tubes' counters add up to the server's.
    let mut c = server.client().await;
    let stats = c.wait_stat("current-connections", 1).await;
    assert_eq!(stats.num("current-jobs-reserved"), 0);
    // Delayed jobs come due while the tubes are read, so ready and delayed
    // are compared together; nothing else can change with no one connected.
    let groups: [&[&str]; 3] = [&["ready", "delayed"], &["buried"], &["reserved"]];
    let count = |y: &Yaml, kinds: &[&str]| -> u64 {
        kinds
            .iter()
            .map(|k| y.num(&format!("current-jobs-{k}")))
            .sum()
    };
    let mut sums = [0u64; 3];
    for tube in c.tubes().await {
        let t = c.stats_tube(&tube).await;
        for (sum, kinds) in sums.iter_mut().zip(groups) {
            *sum += count(&t, kinds);
        }
    }
    for (sum, kinds) in sums.iter().zip(groups) {
        assert_eq!(
            *sum,
            count(&stats, kinds),
            "{kinds:?} jobs per tube do not add up to the server's count"
        );
    }
    println!(
        "{backend:?}: {streams} random streams (seed {seed}), {bytes} bytes, answered \
         with {replies} well-formed replies in {:.1?}; no panic; {} jobs left, counters \
         consistent",
        start.elapsed(),
        sums.iter().sum::<u64>()
    );
}

/// Writes `input` in the pieces `cuts` marks, closes the writing half and
/// returns everything the server sent before it closed.
async fn exchange(addr: std::net::SocketAddr, input: &[u8], cuts: &[usize]) -> Vec<u8> {
    let s = TcpStream::connect(addr).await.expect("connect");
    s.set_nodelay(true).expect("TCP_NODELAY");
    let (mut rd, mut wr) = s.into_split();
    // Read while writing, so a stream with many replies cannot fill both
    // directions' buffers and stall on itself.
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        out
    });
    let mut from = 0;
    for &to in cuts.iter().chain([&input.len()]) {
        // The server may have closed already (after `quit`).
        if wr.write_all(&input[from..to]).await.is_err() {
            break;
        }
        from = to;
        tokio::task::yield_now().await;
    }
    let _ = wr.shutdown().await;
    reader.await.expect("reader")
}

/// What a text reply may start with.
const WORDS: &[&str] = &[
    "BAD_FORMAT",
    "BURIED",
    "DEADLINE_SOON",
    "DELETED",
    "DRAINING",
    "EXISTS",
    "EXPECTED_CRLF",
    "EXPORTED",
    "FINISHED",
    "FOUND",
    "IMPORTED",
    "INSERTED",
    "INTERNAL_ERROR",
    "JOB_TOO_BIG",
    "KICKED",
    "NOT_FOUND",
    "NOT_IGNORED",
    "OK",
    "OUT_OF_MEMORY",
    "PAUSED",
    "RELEASED",
    "RESERVED",
    "TIMED_OUT",
    "TOUCHED",
    "UNKNOWN_COMMAND",
    "USING",
    "WATCHING",
];

/// Checks that `out` is a sequence of whole replies and returns how many.
fn check_replies(mut out: &[u8]) -> Result<usize, String> {
    let mut n = 0;
    while !out.is_empty() {
        let end = memchr::memmem::find(out, b"\r\n")
            .ok_or_else(|| format!("reply {n} does not end in CRLF"))?;
        let line =
            std::str::from_utf8(&out[..end]).map_err(|_| format!("reply {n} is not UTF-8"))?;
        out = &out[end + 2..];
        n += 1;
        if line.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("JSON reply {line:?} does not parse: {e}"))?;
            if !v["success"].is_boolean() {
                return Err(format!("JSON reply {line:?} has no success"));
            }
            if v["success"] == false && !v["error"].as_str().is_some_and(|e| WORDS.contains(&e)) {
                return Err(format!("JSON reply {line:?} has no known error"));
            }
            continue;
        }
        let words: Vec<&str> = line.split(' ').collect();
        if !WORDS.contains(&words[0]) {
            return Err(format!("reply {line:?} is not a known reply"));
        }
        let len = match words[..] {
            ["OK", len] | ["FOUND" | "RESERVED" | "EXPORTED", _, len] => len,
            ["OK" | "FOUND" | "RESERVED" | "EXPORTED", ..] => {
                return Err(format!("malformed {line:?}"));
            }
            _ => continue,
        };
        let len: usize = len
            .parse()
            .map_err(|_| format!("bad byte count in {line:?}"))?;
        if out.len() < len + 2 || &out[len..len + 2] != b"\r\n" {
            return Err(format!("data of {line:?} is not {len} bytes and CRLF"));
        }
        out = &out[len + 2..];
    }
    Ok(n)
}

/// Builds random streams from a seed.
struct Gen {
    rng: fastrand::Rng,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// One connection's worth of input.
    fn stream(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..self.rng.usize(1..40) {
            let piece = self.piece();
            out.extend_from_slice(&piece);
        }
        out
    }

    /// Where to cut `len` bytes into separate writes: mostly nowhere
    /// special, sometimes into single bytes.
    fn cuts(&mut self, len: usize) -> Vec<usize> {
        if len == 0 {
            return Vec::new();
        }
        let mut cuts: Vec<usize> = (0..self.rng.usize(0..12))
            .map(|_| self.rng.usize(0..len))
            .collect();
        if self.rng.u8(..) < 16 {
            cuts.extend(0..len.min(200));
        }
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.usize(0..from.len())]
    }

    fn number(&mut self) -> String {
        match self.rng.u8(0..16) {
            0..4 => self.rng.u32(0..5).to_string(),
            4..7 => self.rng.u32(..).to_string(),
            _ => self
                .pick(&[
                    "4294967295",
                    "4294967296",
                    "18446744073709551615",
                    "18446744073709551616",
                    "99999999999999999999999999",
                    "-1",
                    "+1",
                    "01",
                    "",
                    "1e3",
                    "0x10",
                    " 1",
                    "1 ",
                ])
                .to_string(),
        }
    }

    fn tube(&mut self) -> String {
        match self.rng.u8(0..8) {
            0..5 => self.pick(&["default", "t1", "t2", "t3"]).to_string(),
            5 => "x".repeat(self.rng.usize(199..202)),
            _ => self.name_noise(),
        }
    }

    fn id(&mut self) -> String {
        match self.rng.u8(0..8) {
            0..4 => self.rng.u32(0..60).to_string(),
            4..6 => format!("j-{}", self.rng.u8(0..20)),
            6 => self.number(),
            _ => self.name_noise(),
        }
    }

    /// A name with a random byte in it (valid text only if it happens to
    /// be a name character).
    fn name_noise(&mut self) -> String {
        let b = self.rng.u8(..);
        let b = if b == b'\n' { b'{' } else { b };
        String::from_utf8_lossy(&[b'n', b, b'{', b'}']).into_owned()
    }

    /// A body of about `len` bytes, any byte values.
    fn body(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.rng.u8(..)).collect()
    }

    fn piece(&mut self) -> Vec<u8> {
        let mut piece = match self.rng.u8(0..20) {
            0..8 => self.command().into_bytes(),
            8..11 => self.put(),
            11 => {
                let len = self.rng.usize(0..64);
                self.body(len)
            }
            12 => {
                let mut long = vec![b'x'; self.rng.usize(1000..1100)];
                long.extend_from_slice(b"\r\n");
                long
            }
            13..15 => self.json(),
            15 => self.import(),
            16 => self
                .pick(&["\r", "\n", "\r\r\n", "\r\n\r\n", " \r\n"])
                .into(),
            _ => {
                let mut c = self.command().into_bytes();
                self.mutate(&mut c);
                c
            }
        };
        if self.rng.u8(..) < 8 {
            self.mutate(&mut piece);
        }
        piece
    }

    fn mutate(&mut self, bytes: &mut Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let at = self.rng.usize(0..bytes.len());
        match self.rng.u8(0..3) {
            0 => bytes[at] = self.rng.u8(..),
            1 => drop(bytes.remove(at)),
            _ => bytes.insert(at, self.rng.u8(..)),
        }
    }

    fn command(&mut self) -> String {
        let line = match self.rng.u8(0..28) {
            0 => format!("use {}", self.tube()),
            1 => format!("watch {}", self.tube()),
            2 => format!("ignore {}", self.tube()),
            3..6 => format!("reserve-with-timeout {}", self.pick(&["0", "0", "1"])),
            6 => format!("reserve-job {}", self.id()),
            7 => format!("delete {}", self.id()),
            8 => format!("finish {}", self.id()),
            9 => format!("release {} {} {}", self.id(), self.number(), self.number()),
            10 => format!("bury {} {}", self.id(), self.number()),
            11 => format!("touch {}", self.id()),
            12 => format!("peek {}", self.id()),
            13 => self
                .pick(&["peek-ready", "peek-delayed", "peek-buried"])
                .into(),
            14 => format!("kick {}", self.number()),
            15 => format!("kick-job {}", self.id()),
            16 => "stats".into(),
            17 => format!("stats-job {}", self.id()),
            18 => format!("stats-tube {}", self.tube()),
            19 => self
                .pick(&["list-tubes", "list-tube-used", "list-tubes-watched"])
                .into(),
            20 => format!("pause-tube {} {}", self.tube(), self.pick(&["0", "1"])),
            24 => format!(
                "export {} {}",
                self.pick(&["0", "0", "1", "3.7", "x", "99999999999999999999"]),
                self.pick(&["1", "2", "1000", "0", "-1"])
            ),
            21 => self
                .pick(&[
                    "",
                    "foo",
                    "PUT 0 0 1 1",
                    "delete",
                    "stats x",
                    "reserve-with-timeout",
                ])
                .into(),
            // Rare, since everything after it goes unread: a plain reserve
            // (which may wait until the end of input) and quit.
            22 if self.rng.u8(..) < 32 => "reserve".into(),
            23 if self.rng.u8(..) < 16 => "quit".into(),
            _ => "list-tube-used".into(),
        };
        let end = if self.rng.u8(..) < 240 { "\r\n" } else { "\n" };
        line + end
    }

    fn put(&mut self) -> Vec<u8> {
        // Bodies around the limit, and declared lengths that lie.
        let len = match self.rng.u8(0..4) {
            0 => self.rng.usize(0..8),
            1 => self.rng.usize(MAX_JOB - 2..MAX_JOB + 3),
            2 => self.rng.usize(0..200),
            _ => self.rng.usize(0..MAX_JOB),
        };
        let declared = match self.rng.u8(0..10) {
            0 => self.number(),
            1 => (len + 1).to_string(),
            2 if len > 0 => (len - 1).to_string(),
            _ => len.to_string(),
        };
        let pri = self.number_or(|g| g.rng.u32(0..3000).to_string());
        let delay = self.number_or(|g| g.pick(&["0", "0", "1"]).to_string());
        let ttr = self.number_or(|g| g.pick(&["1", "60"]).to_string());
        let id = match self.rng.u8(0..4) {
            0 => format!(" {}", self.id()),
            _ => String::new(),
        };
        let mut out = format!("put {pri} {delay} {ttr} {declared}{id}\r\n").into_bytes();
        let body = self.body(len);
        out.extend_from_slice(&body);
        out.extend_from_slice(
            self.pick(&["\r\n", "\r\n", "\r\n", "\n", "xx", ""])
                .as_bytes(),
        );
        out
    }

    /// An `import` of a job line as `export` writes them, sometimes bent:
    /// a field out of range or missing, a body too big, a length that lies.
    fn import(&mut self) -> Vec<u8> {
        let body = match self.rng.u8(0..4) {
            0 => "x".repeat(self.rng.usize(MAX_JOB - 2..MAX_JOB + 3)),
            _ => "hello".into(),
        };
        let state = self.pick(&["ready", "delayed", "buried", "reserved", "gone"]);
        let mut line = format!(
            r#"{{"id":{},"tube":"{}","state":"{state}","pri":{},"created":"2026-01-01T00:00:00Z","due":"2026-01-01T00:00:01Z","ttr-ms":{},"body":"{body}"}}"#,
            self.pick(&["1", "2", "0", "\"j-1\"", "\"j 1\""]),
            self.tube(),
            self.number_or(|g| g.rng.u32(0..3000).to_string()),
            self.pick(&["0", "1000", "-5"]),
        )
        .into_bytes();
        if self.rng.u8(0..4) == 0 {
            self.mutate(&mut line);
        }
        let declared = match self.rng.u8(0..8) {
            0 => self.number(),
            1 => (line.len() + 1).to_string(),
            _ => line.len().to_string(),
        };
        let mut out = format!("import {declared}\r\n").into_bytes();
        out.extend_from_slice(&line);
        out.extend_from_slice(self.pick(&["\r\n", "\r\n", "\n", ""]).as_bytes());
        out
    }

    /// Usually a sensible value from `f`, sometimes a hostile number.
    fn number_or(&mut self, f: impl FnOnce(&mut Gen) -> String) -> String {
        if self.rng.u8(0..6) == 0 {
            self.number()
        } else {
            f(self)
        }
    }

    fn json(&mut self) -> Vec<u8> {
        let topic = self.tube();
        let id = self.id();
        let body: String = (0..self.rng.usize(0..MAX_JOB + 4))
            .map(|_| char::from_u32(self.rng.u32(0..0x800)).unwrap_or('?'))
            .collect();
        let mut v = match self.rng.u8(0..6) {
            0 | 1 => serde_json::json!({"command": "add", "topic": topic, "body": body,
                "delay": self.rng.u8(0..2), "ttr": 60}),
            2 => serde_json::json!({"command": "add", "topic": topic, "body": body, "id": id}),
            3 => serde_json::json!({"command": "pop", "topic": topic, "timeout": 0}),
            4 => serde_json::json!({"command": self.pick(&["finish", "delete"]), "id": id}),
            _ => serde_json::json!({"command": self.pick(&["nope", "", "ADD"]), "topic": 1}),
        };
        if self.rng.u8(0..4) == 0 {
            // A field of the wrong type, or a number out of range.
            let field = self.pick(&["topic", "body", "id", "delay", "ttr", "timeout", "command"]);
            v[field] = match self.rng.u8(0..4) {
                0 => serde_json::json!(null),
                1 => serde_json::json!(-1),
                2 => serde_json::json!(1u64 << 40),
                _ => serde_json::json!([1, {"a": "b"}]),
            };
        }
        let mut line = v.to_string().into_bytes();
        if self.rng.u8(0..5) == 0 {
            // Anywhere, even inside a character.
            line.truncate(self.rng.usize(0..line.len()));
        }
        line.extend_from_slice(b"\r\n");
        line
    }
}
