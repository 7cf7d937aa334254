//! `delayq export` and `delayq import`: every job of a server, with its
//! tubes' settings and its schedules, to JSON lines and back (the format is
//! `protocol::export`'s), to move a deployment from one engine to another.
//!
//! An export reads pages with `export <cursor> <count>` until the cursor
//! comes back `0`. The settings and schedules, which the first page begins
//! with, are written first. A shared engine's scan may give a job twice,
//! so ids already written are skipped. Jobs with server ids are written
//! before those with client ids: an import gives client-id jobs new
//! internal numbers, and in that order they take none that a server-id job
//! of the file wants to keep.
//!
//! An import sends each line as an `import`, many in flight at once (the
//! replies come back in order); a job that is there already (`EXISTS`)
//! counts as done, so an import that stopped half-way is simply run again.

use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, IsTerminal, Seek, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::client::{Client, Fault, unexpected};
use super::{Outcome, yaml};

/// Jobs asked for in one `export` page.
pub const PAGE: usize = 500;

/// `import` commands sent ahead of their replies: enough to hide the round
/// trip, few enough that the replies waiting in the socket stay small.
const WINDOW: usize = 64;

/// Writes the server's tube settings and schedules, then every job, to
/// `out`, one JSON line each.
pub(super) async fn export(client: &mut Client, out: &mut impl Write) -> Result<Outcome, Fault> {
    let total = current_jobs(client).await?;
    let bar = bar(total, "exporting");
    let mut seen: HashSet<String> = HashSet::new();
    let (mut written, mut others) = (0u64, 0u64);
    // Client-id jobs wait in a file of their own until the end.
    let mut later = tempfile::tempfile()
        .map(std::io::BufWriter::new)
        .map_err(|e| Fault::Io(format!("cannot make a scratch file: {e}")))?;
    let mut cursor = String::from("0");
    loop {
        let line = format!("export {cursor} {PAGE}");
        let reply = client.command(&line).await?;
        let (next, len) = reply
            .strip_prefix("EXPORTED ")
            .and_then(|rest| rest.split_once(' '))
            .and_then(|(next, len)| Some((next.to_string(), len.parse::<usize>().ok()?)))
            .ok_or_else(|| unexpected(&line, &reply))?;
        let data = client.data(len).await?;
        for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let to: &mut dyn Write = match line_kind(line) {
                // Settings and schedules come first in the first page, and
                // go first into the file, before the jobs they are for.
                Kind::Other => {
                    others += 1;
                    out
                }
                Kind::Job(id) => {
                    let server_id = id.bytes().all(|b| b.is_ascii_digit());
                    if !seen.insert(id) {
                        continue;
                    }
                    written += 1;
                    bar.inc(1);
                    if server_id { out } else { &mut later }
                }
                Kind::Broken => {
                    return Err(Fault::Server("an export line without an id or kind".into()));
                }
            };
            to.write_all(line)
                .and_then(|()| to.write_all(b"\n"))
                .map_err(|e| Fault::Io(format!("cannot write the export: {e}")))?;
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let copied = later
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|mut file| {
            file.seek(std::io::SeekFrom::Start(0))?;
            std::io::copy(&mut file, out)?;
            out.flush()
        });
    copied.map_err(|e| Fault::Io(format!("cannot write the export: {e}")))?;
    bar.finish_and_clear();
    eprintln!("delayq: exported {written} jobs, and {others} tube settings and schedules");
    Ok(Outcome::Done)
}

/// What an import did with its lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    imported: u64,
    others: u64,
    existing: u64,
    refused: u64,
}

/// Imports every line of `input`; `size` is its length in bytes if known
/// (a file), for the progress bar.
pub(super) async fn import(
    client: &mut Client,
    input: &mut impl BufRead,
    size: Option<u64>,
) -> Result<Outcome, Fault> {
    let bar = bar(size, "importing");
    bar.set_style(style(if size.is_some() {
        BYTES_TEMPLATE
    } else {
        STREAM_TEMPLATE
    }));
    let mut tally = Tally::default();
    // The line numbers of the imports sent and not yet answered, in order.
    let mut in_flight: VecDeque<u64> = VecDeque::new();
    let mut number = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .map_err(|e| Fault::Io(format!("cannot read the input: {e}")))?;
        if n == 0 {
            break;
        }
        number += 1;
        bar.inc(n as u64);
        let job = line.strip_suffix(b"\n").unwrap_or(&line);
        let job = job.strip_suffix(b"\r").unwrap_or(job);
        if job.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if in_flight.len() == WINDOW {
            answer(client, &mut in_flight, &mut tally, &bar).await?;
        }
        client
            .send_with_body(&format!("import {}", job.len()), Some(job))
            .await?;
        in_flight.push_back(number);
    }
    while !in_flight.is_empty() {
        answer(client, &mut in_flight, &mut tally, &bar).await?;
    }
    bar.finish_and_clear();
    let Tally {
        imported,
        others,
        existing,
        refused,
    } = tally;
    eprintln!(
        "delayq: imported {imported} jobs, {existing} were there already, {refused} refused; \
         {others} tube settings and schedules set"
    );
    if refused > 0 {
        return Err(Fault::Server(format!(
            "{refused} lines were refused (see above); importing again skips the jobs that are in"
        )));
    }
    Ok(Outcome::Done)
}

/// Reads the reply to the oldest import in flight.
async fn answer(
    client: &mut Client,
    in_flight: &mut VecDeque<u64>,
    tally: &mut Tally,
    bar: &ProgressBar,
) -> Result<(), Fault> {
    let reply = client.reply().await?;
    let number = in_flight.pop_front().unwrap_or_default();
    if reply.starts_with("IMPORTED settings ") || reply.starts_with("IMPORTED schedule ") {
        tally.others += 1;
    } else if reply.starts_with("IMPORTED ") {
        tally.imported += 1;
    } else if reply.starts_with("EXISTS ") {
        tally.existing += 1;
    } else {
        tally.refused += 1;
        bar.suspend(|| eprintln!("delayq: line {number}: {reply}"));
        if matches!(
            reply.as_str(),
            "UNAUTHORIZED" | "FORBIDDEN" | "UNKNOWN_COMMAND"
        ) {
            // Every other line would get the same.
            return Err(Fault::Server(reply));
        }
    }
    Ok(())
}

/// What an export line is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// A job, with its id as text, to tell repeated lines apart.
    Job(String),
    /// A tube's settings or a schedule.
    Other,
    /// Neither: the server sent something else.
    Broken,
}

fn line_kind(line: &[u8]) -> Kind {
    #[derive(serde::Deserialize)]
    struct Head {
        id: Option<serde_json::Value>,
        kind: Option<String>,
    }
    let Ok(head) = serde_json::from_slice::<Head>(line) else {
        return Kind::Broken;
    };
    match (head.kind, head.id) {
        (Some(_), _) => Kind::Other,
        (None, Some(serde_json::Value::Number(n))) => Kind::Job(n.to_string()),
        (None, Some(serde_json::Value::String(s))) => Kind::Job(s),
        _ => Kind::Broken,
    }
}

/// The jobs the server holds now, in every state, for the bar's length.
async fn current_jobs(client: &mut Client) -> Result<Option<u64>, Fault> {
    let Some(doc) = client.yaml("stats").await? else {
        return Ok(None);
    };
    let states = [
        "current-jobs-ready",
        "current-jobs-delayed",
        "current-jobs-reserved",
        "current-jobs-buried",
    ];
    Ok(states
        .iter()
        .map(|key| yaml::number(&doc, key))
        .sum::<Option<u64>>())
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants, checked by the tests of this module.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// A bar on standard error when it is a terminal (a redrawn bar in a log
/// file or a pipe would be noise), hidden otherwise.
fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    let bar = match len {
        Some(len) => ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden()),
        None => ProgressBar::hidden(),
    };
    bar.set_style(style(BAR_TEMPLATE));
    bar.set_prefix(what.to_string());
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
    bar
}

/// How the bar looks: jobs done of the jobs there were, how long it took.
const BAR_TEMPLATE: &str = "{prefix} [{bar:30}] {pos}/{len} jobs ({elapsed})";

/// An import from a file: how much of it is read.
const BYTES_TEMPLATE: &str = "{prefix} [{bar:30}] {bytes}/{total_bytes} ({elapsed})";

/// An import from a pipe, whose length is not known.
const STREAM_TEMPLATE: &str = "{prefix} {bytes} read ({elapsed})";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_valid() {
        for template in [BAR_TEMPLATE, BYTES_TEMPLATE, STREAM_TEMPLATE] {
            assert!(ProgressStyle::with_template(template).is_ok(), "{template}");
        }
    }

    #[test]
    fn lines_are_told_apart() {
        assert_eq!(
            line_kind(br#"{"id":42,"tube":"t"}"#),
            Kind::Job("42".into())
        );
        assert_eq!(
            line_kind(br#"{"id":"order:1"}"#),
            Kind::Job("order:1".into())
        );
        assert_eq!(line_kind(br#"{"kind":"settings","tube":"t"}"#), Kind::Other);
        assert_eq!(line_kind(br#"{"tube":"t"}"#), Kind::Broken);
        assert_eq!(line_kind(b"not json"), Kind::Broken);
    }
}
