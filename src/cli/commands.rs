//! The subcommands that take a round trip or a few: each sends its
//! commands, prints what it found and says whether there was anything to
//! do.

use super::client::{Client, Fault, Job, unexpected};
use super::{Outcome, State, out, yaml};

/// Fields of `stats` whose values are text even when they look like
/// numbers: the instance's hex id and the host's names.
const STATS_TEXT: &[&str] = &["id", "hostname", "os", "platform"];
/// Likewise for `stats-tube`: a tube may be named `2024`.
const TUBE_STATS_TEXT: &[&str] = &["name"];

/// `stats`, or `stats-tube TUBE`: the document as the server wrote it, or
/// as a JSON object.
pub(super) async fn stats(
    client: &mut Client,
    tube: Option<&str>,
    json: bool,
) -> Result<Outcome, Fault> {
    let (line, text_keys) = match tube {
        None => ("stats".to_string(), STATS_TEXT),
        Some(tube) => (format!("stats-tube {tube}"), TUBE_STATS_TEXT),
    };
    let Some(doc) = client.yaml(&line).await? else {
        // Only `stats-tube` can answer NOT_FOUND.
        eprintln!("delayq: no tube {}", tube.unwrap_or_default());
        return Ok(Outcome::Nothing);
    };
    if json {
        let mut text = yaml::to_json(&doc, text_keys).to_string();
        text.push('\n');
        out(text.as_bytes());
    } else {
        out(doc.as_bytes());
    }
    Ok(Outcome::Done)
}

/// `list-tubes`, one name a line.
pub(super) async fn tubes(client: &mut Client) -> Result<Outcome, Fault> {
    let doc = client
        .yaml("list-tubes")
        .await?
        .ok_or_else(|| unexpected("list-tubes", "NOT_FOUND"))?;
    let mut text = String::new();
    for tube in yaml::items(&doc) {
        text.push_str(tube);
        text.push('\n');
    }
    out(text.as_bytes());
    Ok(Outcome::Done)
}

/// `use TUBE`, then `peek-ready`, `peek-delayed` or `peek-buried`.
pub(super) async fn peek(
    client: &mut Client,
    tube: &str,
    state: State,
    body_only: bool,
) -> Result<Outcome, Fault> {
    // The peek commands look in the tube the connection uses. Using an
    // unknown tube creates it only while this connection lasts, and an
    // unknown tube holds no jobs: it answers NOT_FOUND like an empty one.
    use_tube(client, tube).await?;
    let (line, what) = match state {
        State::Ready => ("peek-ready", "ready"),
        State::Delayed => ("peek-delayed", "delayed"),
        State::Buried => ("peek-buried", "buried"),
    };
    match client.job(line).await? {
        Some(job) => {
            show(&job, body_only);
            Ok(Outcome::Done)
        }
        None => {
            eprintln!("delayq: no {what} job in {tube}");
            Ok(Outcome::Nothing)
        }
    }
}

/// `peek ID`.
pub(super) async fn peek_job(
    client: &mut Client,
    id: &str,
    body_only: bool,
) -> Result<Outcome, Fault> {
    match client.job(&format!("peek {id}")).await? {
        Some(job) => {
            show(&job, body_only);
            Ok(Outcome::Done)
        }
        None => {
            eprintln!("delayq: no job {id}");
            Ok(Outcome::Nothing)
        }
    }
}

/// A peeked job: `ID BYTES`, then the body and a newline, so a reader can
/// take exactly BYTES bytes after the first line, whatever they hold; or
/// the body alone.
fn show(job: &Job, body_only: bool) {
    if body_only {
        out(&job.body);
        return;
    }
    let mut text = format!("{} {}\n", job.id, job.body.len()).into_bytes();
    text.extend_from_slice(&job.body);
    text.push(b'\n');
    out(&text);
}

/// `use TUBE`, then `kick N`.
pub(super) async fn kick(client: &mut Client, tube: &str, count: u64) -> Result<Outcome, Fault> {
    use_tube(client, tube).await?;
    let line = format!("kick {count}");
    let reply = client.command(&line).await?;
    let kicked: u64 = reply
        .strip_prefix("KICKED ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| unexpected(&line, &reply))?;
    out(format!("{kicked}\n").as_bytes());
    Ok(if kicked > 0 {
        Outcome::Done
    } else {
        Outcome::Nothing
    })
}

/// `delete ID` for each id, in order, reporting each; a fault stops the
/// rest, since the server or the connection is in trouble.
pub(super) async fn delete(client: &mut Client, ids: &[String]) -> Result<Outcome, Fault> {
    let mut outcome = Outcome::Done;
    for id in ids {
        let line = format!("delete {id}");
        let reply = client.command(&line).await?;
        match reply.as_str() {
            "DELETED" => out(format!("deleted {id}\n").as_bytes()),
            // Either gone or reserved by a worker: the server does not say
            // which, and neither can we.
            "NOT_FOUND" => {
                out(format!("not found {id}\n").as_bytes());
                outcome = Outcome::Nothing;
            }
            _ => return Err(unexpected(&line, &reply)),
        }
    }
    Ok(outcome)
}

/// `pause-tube TUBE SECONDS`.
pub(super) async fn pause(client: &mut Client, tube: &str, seconds: u32) -> Result<Outcome, Fault> {
    let line = format!("pause-tube {tube} {seconds}");
    let reply = client.command(&line).await?;
    match reply.as_str() {
        "PAUSED" if seconds == 0 => out(format!("unpaused {tube}\n").as_bytes()),
        "PAUSED" => out(format!("paused {tube} for {seconds} s\n").as_bytes()),
        "NOT_FOUND" => {
            eprintln!("delayq: no tube {tube}");
            return Ok(Outcome::Nothing);
        }
        _ => return Err(unexpected(&line, &reply)),
    }
    Ok(Outcome::Done)
}

/// `use TUBE`, which must answer `USING TUBE`.
async fn use_tube(client: &mut Client, tube: &str) -> Result<(), Fault> {
    let line = format!("use {tube}");
    let reply = client.command(&line).await?;
    if reply.strip_prefix("USING ") == Some(tube) {
        Ok(())
    } else {
        Err(unexpected(&line, &reply))
    }
}
