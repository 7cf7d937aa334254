//! The durable embedded engine's write-ahead log: the embedded engine's
//! state in memory, every change also appended to a log in a data
//! directory, so that a restart, a crash or a power cut loses nothing
//! acknowledged.
//!
//! * `record.rs`: the bytes of a record (length, CRC-32C, number, payload);
//! * `files.rs`: the directory: its lock, file names and headers, spares;
//! * `append.rs`: taking a transition's records under the state's lock,
//!   once there is room for them;
//! * `writer.rs`: the writer thread that writes and syncs groups of records
//!   (group commit);
//! * `keeper.rs`: the thread that prepares spare files and compacts the log
//!   into snapshots;
//! * `recovery.rs`: the snapshot and the log back into the state at start.
//!
//! The engine's state knows nothing of this: it writes its
//! [`Record`](crate::store::memory::journal::Record)s to a journal, and
//! [`Wal`] is the journal's log. [`open`] recovers a directory and returns
//! the engine over it.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::sync::watch;
use tracing::{info, warn};

mod append;
mod files;
mod keeper;
mod record;
mod recovery;
mod waiters;
mod writer;

pub use writer::SyncPolicy;

use crate::clock::Clock;
use crate::error::{StoreError, StoreResult};
use crate::job::LogStats;
use crate::store::held;
use crate::store::memory::journal::{Log, Record};
use crate::store::memory::{MemoryStore, State};
use append::Appender;
use files::{HEADER, Head, HeadFile, Kind, header, log_path, sync_dir};
use keeper::Source;
use waiters::{Ended, Waiters};
use writer::{Marks, Shared, Spare};

/// The durable embedded engine.
pub type DurableStore = MemoryStore<Wal>;

/// beanstalkd's `-s` is 10 MiB; smaller files let the directory of a queue
/// with few live jobs stay small (the file being written and one spare,
/// each this size, are most of it), and a file is still thousands of records.
pub const DEFAULT_FILE_SIZE: u64 = 2 << 20;

/// How a data directory is opened.
#[derive(Debug, Clone)]
pub struct Options {
    /// The directory; created if missing.
    pub dir: PathBuf,
    /// When a change counts as safe.
    pub policy: SyncPolicy,
    /// The size of each log file, raised if need be so that the largest
    /// job fits in one.
    pub file_size: u64,
    /// The largest job body, in bytes.
    pub max_job_size: usize,
    /// Start despite damage, skipping damaged records.
    pub salvage: bool,
}

impl Options {
    /// Default options for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Options {
        Options {
            dir: dir.into(),
            policy: SyncPolicy::Always,
            file_size: DEFAULT_FILE_SIZE,
            max_job_size: crate::config::DEFAULT_MAX_JOB_SIZE,
            salvage: false,
        }
    }
}

/// The log behind the durable engine.
pub struct Wal {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The connections waiting for their records, woken as the writer's
    /// marks, passed on by [`relay_marks`], reach them.
    public: Arc<Waiters>,
    /// The task that passes them on, started by the first connection to
    /// wait (it needs the runtime, which `open` may run outside of).
    relay: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Held while the engine runs.
    _lock: std::fs::File,
}

/// Whether a spare found at start may become a log file: it is fresh (its
/// header still zeros), or a recycled log file, whose records all come
/// before `log_end`, where the log found on disk ends. A spare that was
/// being made the next log file when the server stopped holds records from
/// there on that never reached the log; reused, the next life's records
/// would be followed in it by those, some perhaps numbered on from them,
/// and a later start would replay them.
fn reusable(file: &std::fs::File, log_end: u64) -> bool {
    let mut head = [0u8; HEADER as usize];
    if std::os::unix::fs::FileExt::read_exact_at(file, &mut head, 0).is_err() {
        return false;
    }
    head.iter().all(|&b| b == 0)
        || files::read_header(Kind::Log, &head).is_ok_and(|(_, first, _)| first < log_end)
}

/// Makes the head file say `head`, creating it if there is none.
fn write_head(
    file: &mut Option<HeadFile>,
    dir: &std::path::Path,
    head: &Head,
) -> std::io::Result<()> {
    match file {
        Some(file) => file.write(head),
        None => {
            *file = Some(HeadFile::create(dir, head)?);
            Ok(())
        }
    }
}

/// The state, as the keeper reads it.
struct StateSource(Arc<Mutex<State>>);

impl StateSource {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Source for StateSource {
    fn locked(&self, f: &mut dyn FnMut()) {
        let _state = self.lock();
        f();
    }

    fn dump(&self, from: usize, max: usize, out: &mut dyn FnMut(Record<'_>)) -> Option<usize> {
        self.lock().dump(from, max, &mut |r| out(r))
    }

    fn dump_rest(&self, out: &mut dyn FnMut(Record<'_>)) {
        self.lock().dump_rest(&mut |r| out(r));
    }
}

/// Puts the calling thread under `SCHED_BATCH`: woken (a sync done, records
/// to write), it runs on an idle core or when the running thread's turn
/// ends, instead of preempting it. On a server with few cores the thread it
/// would preempt is most often the runtime's, in the middle of answering
/// the connections whose records the log thread then waits for; each
/// preemption costs both threads a switch and their caches. Measured on 2
/// cores (see the README's figures), the default policy's cycles went up a
/// third and its CPU a cycle down a quarter. Needs no privilege; where the
/// kernel refuses, the thread runs as before.
fn not_preempting() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the calling thread's own policy (0: this thread);
        // `param` outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "the log thread keeps the default scheduling policy"
            );
        }
    }
}

/// How long a change refused for want of prepared room waits for the
/// keeper to prepare more before it is refused for good.
const ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens (or creates) the data directory, recovers its jobs, and returns the
/// engine over it, its log running. The error says what stopped it (another
/// process holds the directory, damage and where, an I/O error).
pub fn open(options: Options, clock: Clock) -> Result<DurableStore, String> {
    std::fs::create_dir_all(&options.dir).map_err(|e| {
        let dir = options.dir.display();
        match std::fs::metadata(&options.dir) {
            Ok(m) if !m.is_dir() => format!("the data directory {dir} is a file, not a directory"),
            _ => format!("cannot create the data directory {dir}: {e}"),
        }
    })?;
    // Said in full at start, so nobody has to guess which directory it was.
    let dir = &std::fs::canonicalize(&options.dir).map_err(|e| {
        format!(
            "cannot find the data directory {}: {e}",
            options.dir.display()
        )
    })?;
    let lock = files::lock(dir)?;
    let listing = files::list(dir).map_err(|e| format!("cannot read the data directory: {e}"))?;
    // The largest record, a job with the largest body and names, must fit
    // in a file of its own.
    let largest = options.max_job_size as u64 + 1024;
    let file_size = options.file_size.max(HEADER + largest);
    if file_size > options.file_size {
        warn!(
            log_file_size = options.file_size,
            max_job_size = options.max_job_size,
            "-s is too small for the largest job (-z) and its header; using {file_size}"
        );
    }
    let mut state = State::new();
    state.begin_replay();
    let started = std::time::Instant::now();
    let got = recovery::recover(&listing, &mut state, options.salvage, file_size)?;
    state.replayed(clock.now());
    // Recovery's buffers are freed; hand the memory back to the system, so
    // a restarted server holds no more than the one it replaced.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    let (mut next_key, mut rest_bytes) = (1, 0u64);
    state.dump_rest(&mut |r| {
        rest_bytes += record::encoded_len(&r) as u64;
        if let Record::Sequences { next_key: n, .. } = r {
            next_key = n;
        }
    });
    let (mut live_jobs, mut live_bytes) = (0u64, 0u64);
    let mut from = Some(0);
    while let Some(at) = from {
        from = state.dump(at, usize::MAX, &mut |r| {
            live_jobs += 1;
            live_bytes += match &r {
                Record::Job(job) => record::weight(job),
                other => record::encoded_len(other),
            } as u64;
        });
    }
    // Not after a salvage that skipped records: those files and an older
    // snapshot may then be the only whole copy of what was lost.
    if !got.leftovers.is_empty() && got.skipped == 0 {
        for path in &got.leftovers {
            if let Err(e) = std::fs::remove_file(path) {
                warn!(file = %path.display(), error = %e, "cannot remove a needless file");
            }
        }
        if let Err(e) = sync_dir(dir) {
            warn!(dir = %dir.display(), error = %e, "cannot sync the data directory");
        }
        info!(
            files = got.leftovers.len(),
            "removed log files wholly before the snapshot, and older snapshots (a compaction was cut short)"
        );
    }
    // Before any new log file is made: it may take the number of a file
    // with a bad header, which must not be overwritten.
    for path in &got.damaged {
        let to = files::set_aside(path)
            .map_err(|e| format!("cannot set aside {}: {e}", path.display()))?;
        warn!(file = %path.display(), to = %to.display(), "set aside a file with a bad header (--salvage)");
    }
    if !got.damaged.is_empty() {
        sync_dir(dir).map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
    }
    let mut files = got.files;
    let mut head_file = match &listing.head {
        Some(Ok((_, generation))) => HeadFile::open(dir, *generation).ok(),
        _ => None,
    };
    let says = |number| Head {
        number,
        next_key,
        file_size,
    };
    if got.head_lowered {
        // The head names files that are gone: lowered to the newest here
        // before a file of a number up to it is made, which the next start
        // would otherwise take for the newest, missing those after it. It
        // also keeps the raised server ids for the starts to come.
        let newest = files.keys().next_back().copied().unwrap_or(0);
        write_head(&mut head_file, dir, &says(newest))
            .map_err(|e| format!("cannot write the head file in {}: {e}", dir.display()))?;
    }
    let (number, current, used) = match got.current {
        Some(current) => current,
        None => {
            let number = files.keys().next_back().map_or(1, |n| n + 1);
            let path = log_path(dir, number);
            let head = header(Kind::Log, number, got.next_seq);
            let file = files::create_log(&path, file_size, &head)
                .and_then(|file| sync_dir(dir).map(|()| file))
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            files.insert(number, got.next_seq);
            (number, file, HEADER)
        }
    };
    // A head file that cannot be written (a full disk, for a directory
    // that has none yet) costs only the check it allows: this run goes on
    // without, and its log files are written all the same.
    if let Err(e) = write_head(&mut head_file, dir, &says(number)) {
        warn!(
            dir = %dir.display(), error = %e,
            "cannot write the head file: until a start writes it, a start cannot \
             tell that the newest log files are missing"
        );
        head_file = None;
    }
    // Everything recovered is on disk (recovery synced the newest files;
    // the older ones were synced before their successors began), and
    // nothing above it is: a mark left higher (synced records lost from
    // the end of the log) would take records numbered anew there for
    // synced ones.
    let recovered = got.next_seq - 1;
    if listing.synced > recovered {
        warn!(
            dir = %dir.display(), synced = listing.synced, log_ends = recovered,
            "the log ends before the last record known synced: the newest log \
             file lost records from its end"
        );
    }
    if let Some(file) = head_file.as_mut()
        && let Err(e) = file.mark_synced(recovered, true)
    {
        warn!(dir = %dir.display(), error = %e, "cannot write the head file's synced mark");
        head_file = None;
    }
    if listing.stopped && head_file.is_none() {
        // Left saying the last run stopped cleanly, the head would let the
        // start after a crash of this run number new jobs from the end of
        // a log that may have lost puts (see `files::SYNCED_AT`).
        return Err(format!(
            "cannot clear the clean stop's mark in the head file in {}",
            dir.display()
        ));
    }
    info!(
        dir = %dir.display(), jobs = live_jobs, records = got.records,
        skipped = got.skipped, damaged_rests_skipped = got.rests_skipped,
        took_ms = started.elapsed().as_millis() as u64,
        "recovered the data directory"
    );
    // With -f or -F records reach the kernel through the mapped file (see
    // `writer::Mapped`); under the default policy nobody waits for less than
    // a sync, which the writer thread does after its `pwrite` anyway.
    let map = (options.policy != SyncPolicy::Always)
        .then(|| writer::Mapped::new(&current, number))
        .flatten();
    let dir_file =
        std::fs::File::open(dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let shared = Arc::new(Shared::new(
        dir.clone(),
        options.policy,
        file_size,
        got.next_seq,
        number,
        used,
        files,
        current,
        dir_file,
    ));
    *shared.head.lock().unwrap_or_else(PoisonError::into_inner) = head_file;
    let mut next_spare = 0;
    {
        let mut b = shared.lock();
        b.map = map;
        b.next_key = next_key;
        b.live_jobs = live_jobs;
        b.live_bytes = live_bytes;
        b.rest_bytes = rest_bytes;
        b.appended = got.replayed_bytes;
        b.snapshot_bytes = got.snapshot_bytes;
        // A start that skipped damage compacts at once: the snapshot then
        // holds what was served, and the damaged files are removed with
        // the others before it, so the next start needs no `--salvage`.
        b.compact = got.salvaged;
        for path in &listing.spares {
            let n = path
                .extension()
                .and_then(|e| e.to_str()?.parse::<u64>().ok())
                .unwrap_or(0);
            next_spare = next_spare.max(n + 1);
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path);
            match opened {
                Ok(file)
                    if b.spares.len() < append::spares_kept(&b, shared.file_size)
                        && reusable(&file, got.log_end) =>
                {
                    b.spares.push_back(Spare {
                        path: path.clone(),
                        file,
                    })
                }
                _ => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
    let state = Arc::new(Mutex::new(state));
    let source: Arc<dyn Source> = Arc::new(StateSource(state.clone()));
    let writer = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("delayq-log".into())
            .spawn(move || writer::run(shared))
            .map_err(|e| format!("cannot start the log writer: {e}"))?
    };
    let keeper = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("delayq-keeper".into())
            .spawn(move || keeper::run(shared, source, next_spare))
            .map_err(|e| format!("cannot start the log keeper: {e}"))?
    };
    let public = Arc::new(Waiters::new(shared.marks.borrow().synced));
    let wal = Wal {
        shared,
        threads: vec![writer, keeper],
        public,
        relay: Mutex::new(None),
        _lock: lock,
    };
    Ok(MemoryStore::from_parts(state, clock, wal))
}

impl Wal {
    /// Starts [`relay_marks`] on the current runtime unless it runs already (a
    /// test may have dropped the runtime it first ran on).
    fn start_relay(&self) {
        let mut relay = self.relay.lock().unwrap_or_else(PoisonError::into_inner);
        if relay.as_ref().is_none_or(|r| r.is_finished()) {
            let raw = self.shared.marks.subscribe();
            let synced = matches!(self.shared.policy, SyncPolicy::Always);
            *relay = Some(tokio::spawn(relay_marks(
                raw,
                Arc::clone(&self.public),
                synced,
            )));
        }
    }
}

/// Passes the writer thread's marks on to the connections waiting on them.
///
/// A wake-up from outside the runtime costs a write to its eventfd per task
/// woken; with every connection waiting on the writer's own channel, the
/// cycle benchmark made about 80 such writes per sync. This task is the one
/// the writer wakes, and its wake-ups of the connections, from inside the
/// runtime, are cheap. It passes on only what a waiter can be waiting for
/// (`synced` under the default policy, else `written`, and a failure).
async fn relay_marks(mut raw: watch::Receiver<Marks>, public: Arc<Waiters>, synced: bool) {
    loop {
        let m = raw.borrow_and_update().clone();
        // Before the failure: a record made safe before the log failed is
        // still answered as made.
        public.reach(if synced { m.synced } else { m.written });
        if let Some(why) = m.failed {
            public.fail(why);
        }
        if raw.changed().await.is_err() {
            public.close();
            return;
        }
    }
}

/// Whether the change up to record `upto` is as safe as the policy asks.
fn reached(shared: &Shared, m: &Marks, upto: u64) -> bool {
    match shared.policy {
        SyncPolicy::Always => m.synced >= upto,
        SyncPolicy::Every(_) | SyncPolicy::Never => m.written >= upto || in_kernel(shared, upto),
    }
}

/// Whether record `upto` is in the kernel: written, or copied into the
/// mapped log file (with -f or -F, where that is as safe as it must be).
fn in_kernel(shared: &Shared, upto: u64) -> bool {
    shared.in_kernel.load(Ordering::Acquire) >= upto
}

/// Waits until the records up to `upto` are safe, or the log has failed.
async fn wait_safe(shared: Arc<Shared>, public: Arc<Waiters>, upto: u64) -> StoreResult<()> {
    if !matches!(shared.policy, SyncPolicy::Always) {
        // With -f or -F a change is safe once the kernel has it. Here its
        // records could not be copied into the mapped log file (they
        // begin a new file, not yet named, or came after such records):
        // write them from here rather than wait for the writer thread to
        // wake (a pwrite into the page cache, in order under the file's
        // lock, with whatever else has gathered). Every other task
        // ready to run goes first, so that the changes they make join
        // this write: one pwrite for a whole pass of the runtime's
        // queue instead of one per change.
        tokio::task::yield_now().await;
        if reached(&shared, &shared.marks.borrow(), upto) {
            return Ok(());
        }
        shared.flush();
        if reached(&shared, &shared.marks.borrow(), upto) {
            return Ok(());
        }
    }
    match public.wait(upto).await {
        Ended::Reached => Ok(()),
        Ended::Failed(why) => Err(StoreError::Unavailable(format!(
            "the change could not be made safe: {why}"
        ))),
        Ended::Closed => Err(StoreError::Unavailable("the log writer has stopped".into())),
    }
}

impl Log for Wal {
    type Journal<'a> = Appender<'a>;

    fn journal(&self) -> Appender<'_> {
        Appender::new(&self.shared)
    }

    async fn settle(&self, upto: u64) -> StoreResult<()> {
        // The usual case with -f or -F: the records were copied into the
        // mapped log file as they were taken, and the reply goes at once.
        if self.shared.policy != SyncPolicy::Always && in_kernel(&self.shared, upto) {
            return Ok(());
        }
        if reached(&self.shared, &self.shared.marks.borrow(), upto) {
            return Ok(());
        }
        self.start_relay();
        let wait = wait_safe(Arc::clone(&self.shared), Arc::clone(&self.public), upto);
        if !held::can_hold() {
            return wait.await;
        }
        match held::hold(Box::pin(wait)) {
            None => Ok(()),
            Some(wait) => wait.await,
        }
    }

    async fn wait_for_room(&self) -> bool {
        let shared = &self.shared;
        let room = shared.room.notified();
        tokio::pin!(room);
        // Registered before looking, so that a spare prepared in between is
        // not missed.
        room.as_mut().enable();
        {
            let b = shared.lock();
            if b.short_of_disk || b.failed.is_some() || b.stopping {
                return false;
            }
            if !b.room_wanted {
                // Prepared since the refusal: try again at once.
                return true;
            }
        }
        // A file is prepared in milliseconds; longer means the disk is in
        // trouble, and the change is refused after all.
        tokio::time::timeout(ROOM_WAIT, room).await.is_ok() && !shared.lock().short_of_disk
    }

    fn stats(&self) -> Option<LogStats> {
        let b = self.shared.lock();
        Some(LogStats {
            oldest_file: b.files.keys().next().copied().unwrap_or(b.number),
            current_file: b.number,
            records_written: self.shared.records_written.load(Ordering::Relaxed),
            records_migrated: self.shared.records_migrated.load(Ordering::Relaxed),
            syncs: self.shared.syncs.load(Ordering::Relaxed),
            sync_times: self.shared.sync_times.snapshot(),
            file_size: self.shared.file_size,
        })
    }

    fn describe(&self) -> String {
        let policy = match self.shared.policy {
            SyncPolicy::Always => "synced before every reply".to_string(),
            SyncPolicy::Every(every) => format!("synced at most every {} ms", every.as_millis()),
            SyncPolicy::Never => "never synced".to_string(),
        };
        format!("durable, in {} ({policy})", self.shared.dir.display())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        if let Some(relay) = self
            .relay
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            relay.abort();
        }
        self.shared.stop();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // The relay is gone: what the writer made safe while stopping is
        // passed on here, and nothing moves after.
        let m = self.shared.marks.borrow().clone();
        let synced = matches!(self.shared.policy, SyncPolicy::Always);
        self.public.reach(if synced { m.synced } else { m.written });
        self.public.close();
    }
}
