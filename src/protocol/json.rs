//! JSON-lines mode (extension): a command line that starts with `{` is one
//! JSON object, mapped onto the same [`Command`] values as the text protocol.
//!
//! Commands: `add`, `pop`, `finish`, `delete` (the last three also by the
//! batch: `count`, `ids`), `schedule`, `unschedule`, `schedules`, and
//! `auth`. Ids travel as JSON strings.
//!
//! Any command may also carry a `"token"` ([`parse_with_token`]): the
//! connection authenticates with it first, exactly as an `auth` line would,
//! so a client that opens a connection per job need not send `auth` apart.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::ClientError;
use super::command::{Command, NewSchedule, batch_size, schedule_name};
use super::options;
use crate::job::Lifecycle;
use crate::names::{JobId, Tube, client_id};
use crate::rules::MAX_BATCH;
use crate::schedule::{When, now_ms};

/// Priority of an `add` that gives none (beanstalkd clients' usual default).
pub const DEFAULT_PRIORITY: u32 = 1024;
/// Time to run of an `add` that gives none, in seconds.
pub const DEFAULT_TTR: u32 = 60;

/// Parses one JSON command line; `max_job_size` bounds the decoded body.
/// A `token` field is not looked at (see [`parse_with_token`]).
pub fn parse(line: &[u8], max_job_size: usize) -> Result<Command, ClientError> {
    parse_with_token(line, max_job_size).1
}

/// Parses one JSON command line, and the `token` it carries, if any: the
/// connection is to run `auth` with that token before the command (the
/// codec hands the two over in that order), so the checks, the failure
/// delay, the log line and the replies are `auth`'s, written once. A failed
/// token leaves the connection unauthenticated, so the command that
/// follows is answered `UNAUTHORIZED` and not run.
///
/// With tokens off the `auth` succeeds whatever the token, so the field is
/// in effect ignored rather than an error: beanstalkd has no tokens, and a
/// client configured with one should work against a server without them,
/// as `auth` itself does.
///
/// The `auth` command's own `token` is its argument, not a second `auth`.
/// A `token` that is not a string makes the command `BAD_FORMAT`, with no
/// `auth`: a client that meant to authenticate must not have its command
/// run as whoever the connection was before.
pub fn parse_with_token(
    line: &[u8],
    max_job_size: usize,
) -> (Option<Bytes>, Result<Command, ClientError>) {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return (None, Err(ClientError::BadFormat));
    };
    if obj.get("command") == Some(&Value::String("auth".into())) {
        return (None, command(&obj, max_job_size));
    }
    match obj.get("token") {
        None => (None, command(&obj, max_job_size)),
        Some(Value::String(t)) => (
            Some(Bytes::copy_from_slice(t.as_bytes())),
            command(&obj, max_job_size),
        ),
        Some(_) => (None, Err(ClientError::BadFormat)),
    }
}

/// The command of a parsed JSON object.
fn command(obj: &Map<String, Value>, max_job_size: usize) -> Result<Command, ClientError> {
    let name = match obj.get("command") {
        Some(Value::String(s)) => s.as_str(),
        _ => return Err(ClientError::BadFormat),
    };
    match name {
        "add" => add(obj, topic(obj), max_job_size),
        "pop" => pop(obj, topic(obj)),
        "finish" | "delete" => {
            let finish = name == "finish";
            if let Some(ids) = obj.get("ids") {
                let Value::Array(ids) = ids else {
                    return Err(ClientError::BadFormat);
                };
                if ids.len() > MAX_BATCH {
                    return Err(ClientError::BadFormat);
                }
                let ids = ids.iter().map(id_value).collect::<Result<_, _>>()?;
                return Ok(Command::RemoveBatch { ids, finish });
            }
            let id = job_id(obj)?;
            Ok(if finish {
                Command::Finish(id)
            } else {
                Command::Delete(id)
            })
        }
        "schedule" => {
            let body = match obj.get("body") {
                Some(Value::String(s)) => s.as_bytes(),
                None | Some(Value::Null) => b"",
                _ => return Err(ClientError::BadFormat),
            };
            if body.len() > max_job_size {
                return Err(ClientError::JobTooBig);
            }
            let when = match (obj.get("every"), obj.get("cron")) {
                (Some(every), None) => {
                    let period = match every {
                        Value::String(s) => options::span(s.as_bytes()),
                        Value::Number(n) => n
                            .to_string()
                            .parse()
                            .ok()
                            .and_then(|n: u64| n.checked_mul(1000).map(Duration::from_millis)),
                        _ => None,
                    };
                    When::every(period.ok_or(ClientError::BadSchedule("bad-interval"))?)
                }
                (None, Some(Value::String(expr))) => {
                    let zone = match obj.get("zone") {
                        None | Some(Value::Null) => "UTC",
                        Some(Value::String(z)) => z.as_str(),
                        Some(_) => return Err(ClientError::BadSchedule("bad-zone")),
                    };
                    When::cron(zone, expr, now_ms())
                }
                _ => return Err(ClientError::BadFormat),
            }
            .map_err(ClientError::BadSchedule)?;
            Ok(Command::Schedule(Box::new(NewSchedule {
                name: name_of(obj)?,
                tube: topic(obj)?,
                pri: seconds(obj, "priority")?.unwrap_or(DEFAULT_PRIORITY),
                ttr: seconds(obj, "ttr")?.unwrap_or(DEFAULT_TTR),
                when,
                body: Bytes::copy_from_slice(body),
            })))
        }
        "unschedule" => Ok(Command::Unschedule(name_of(obj)?)),
        "schedules" => Ok(Command::ListSchedules),
        "auth" => match obj.get("token") {
            Some(Value::String(t)) => Ok(Command::Auth(Bytes::copy_from_slice(t.as_bytes()))),
            _ => Err(ClientError::BadFormat),
        },
        _ => Err(ClientError::UnknownCommand),
    }
}

/// An `add`'s job, into `tube` (JSON-lines: the `topic`; HTTP: the tube of
/// the path), or why there is none. The tube's own error comes after the
/// body's and the numbers', as JSON-lines has always answered.
pub(crate) fn add(
    obj: &Map<String, Value>,
    tube: Result<Tube, ClientError>,
    max_job_size: usize,
) -> Result<Command, ClientError> {
    let body = match obj.get("body") {
        Some(Value::String(s)) => s.as_bytes(),
        _ => return Err(ClientError::BadFormat),
    };
    if body.len() > max_job_size {
        return Err(ClientError::JobTooBig);
    }
    let id = match obj.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(client_id(s.as_bytes()).ok_or(ClientError::BadFormat)?),
        Some(_) => return Err(ClientError::BadFormat),
    };
    Ok(Command::Put {
        pri: seconds(obj, "priority")?.unwrap_or(DEFAULT_PRIORITY),
        delay: seconds(obj, "delay")?.unwrap_or(0),
        ttr: seconds(obj, "ttr")?.unwrap_or(DEFAULT_TTR),
        id,
        tube: Some(tube?),
        body: Bytes::copy_from_slice(body),
        life: life(obj)?.boxed(),
    })
}

/// A `pop` from `tube`: `timeout` (none waits for as long as it takes) and
/// `count` (a batch).
pub(crate) fn pop(
    obj: &Map<String, Value>,
    tube: Result<Tube, ClientError>,
) -> Result<Command, ClientError> {
    let (timeout, tube) = (seconds(obj, "timeout")?, Some(tube?));
    Ok(match obj.get("count") {
        None | Some(Value::Null) => Command::Reserve { timeout, tube },
        Some(Value::Number(n)) => Command::ReserveBatch {
            count: batch_size(n.to_string().as_bytes())?,
            timeout,
            tube,
        },
        Some(_) => return Err(ClientError::BadFormat),
    })
}

/// A `release` of job `id`: `priority` (default [`DEFAULT_PRIORITY`], as
/// for `add`) and `delay` (default 0).
pub(crate) fn release(id: JobId, obj: &Map<String, Value>) -> Result<Command, ClientError> {
    Ok(Command::Release {
        id,
        pri: seconds(obj, "priority")?.unwrap_or(DEFAULT_PRIORITY),
        delay: seconds(obj, "delay")?.unwrap_or(0),
    })
}

/// A `bury` of job `id`: `priority` (default [`DEFAULT_PRIORITY`]).
pub(crate) fn bury(id: JobId, obj: &Map<String, Value>) -> Result<Command, ClientError> {
    Ok(Command::Bury {
        id,
        pri: seconds(obj, "priority")?.unwrap_or(DEFAULT_PRIORITY),
    })
}

/// A `kick` of up to `bound` jobs (required: a whole number) of the
/// session's tube.
pub(crate) fn kick(obj: &Map<String, Value>) -> Result<Command, ClientError> {
    match obj.get("bound") {
        Some(Value::Number(n)) => n.as_u64().map(Command::Kick).ok_or(ClientError::BadFormat),
        _ => Err(ClientError::BadFormat),
    }
}

/// A `pause-tube` of `tube` for `delay` seconds (required).
pub(crate) fn pause(tube: Tube, obj: &Map<String, Value>) -> Result<Command, ClientError> {
    let delay = seconds(obj, "delay")?.ok_or(ClientError::BadFormat)?;
    Ok(Command::PauseTube(tube, delay))
}

/// A schedule's `name`.
fn name_of(obj: &Map<String, Value>) -> Result<Arc<str>, ClientError> {
    match obj.get("name") {
        Some(Value::String(s)) => schedule_name(s.as_bytes()),
        _ => Err(ClientError::BadFormat),
    }
}

fn topic(obj: &Map<String, Value>) -> Result<Tube, ClientError> {
    match obj.get("topic") {
        Some(Value::String(s)) => Tube::parse(s.as_bytes()).ok_or(ClientError::BadFormat),
        _ => Err(ClientError::BadFormat),
    }
}

/// Ids are strings; a bare non-negative integer is accepted as a server id.
fn job_id(obj: &Map<String, Value>) -> Result<JobId, ClientError> {
    obj.get("id").map_or(Err(ClientError::BadFormat), id_value)
}

fn id_value(v: &Value) -> Result<JobId, ClientError> {
    match v {
        Value::String(s) => JobId::parse(s.as_bytes()).ok_or(ClientError::BadFormat),
        Value::Number(n) => n.as_u64().map(JobId::Server).ok_or(ClientError::BadFormat),
        _ => Err(ClientError::BadFormat),
    }
}

/// The options of an `add`, each a number or a string as the text
/// protocol spells its value (`"exp:10s"`); a number of seconds for the
/// durations.
fn life(obj: &Map<String, Value>) -> Result<Lifecycle, ClientError> {
    let mut life = Lifecycle::default();
    for name in [
        "tries",
        "backoff",
        "backoff-max",
        "jitter",
        "ttl",
        "unique",
        "rate",
    ] {
        let value = match obj.get(name) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) if n.is_u64() => n.to_string(),
            Some(_) => return Err(ClientError::BadOption),
        };
        options::set(&mut life, name.as_bytes(), value.as_bytes())?;
    }
    options::job_only(life)
}

/// An optional whole number that fits in 32 bits (seconds or a priority).
fn seconds(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, ClientError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or(ClientError::BadFormat),
        Some(_) => Err(ClientError::BadFormat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, ClientError> {
        parse(s.as_bytes(), 10)
    }

    #[test]
    fn add_takes_options() {
        let Ok(Command::Put { life, .. }) = p(
            r#"{"command":"add","topic":"t","body":"x","tries":5,"backoff":"exp:10s","backoff-max":600,"jitter":20}"#,
        ) else {
            panic!("not an add")
        };
        let life = life.expect("options");
        assert_eq!(life.tries, Some(5));
        assert_eq!(life.backoff_max, Some(std::time::Duration::from_secs(600)));
        for bad in [
            r#""tries":0"#,
            r#""tries":"x""#,
            r#""tries":true"#,
            r#""jitter":-1"#,
        ] {
            let line = format!(r#"{{"command":"add","topic":"t","body":"x",{bad}}}"#);
            assert_eq!(p(&line), Err(ClientError::BadOption), "{bad}");
        }
    }

    #[test]
    fn add_with_defaults() {
        let Ok(Command::Put {
            pri,
            delay,
            ttr,
            id,
            tube,
            body,
            life,
        }) = p(r#"{"command":"add","topic":"t","body":"x"}"#)
        else {
            panic!("not an add")
        };
        assert!(life.is_none());
        assert_eq!(
            (pri, delay, ttr, id),
            (DEFAULT_PRIORITY, 0, DEFAULT_TTR, None)
        );
        assert_eq!(tube.unwrap().as_str(), "t");
        assert_eq!(&body[..], b"x");
    }

    #[test]
    fn bad_input_words() {
        assert_eq!(p("{"), Err(ClientError::BadFormat));
        assert_eq!(p("[1]"), Err(ClientError::BadFormat));
        assert_eq!(p(r#"{"command":"nope"}"#), Err(ClientError::UnknownCommand));
        assert_eq!(p(r#"{"command":"pop"}"#), Err(ClientError::BadFormat));
        assert_eq!(
            p(r#"{"command":"pop","topic":"t","timeout":-1}"#),
            Err(ClientError::BadFormat)
        );
        assert_eq!(
            p(r#"{"command":"add","topic":"t","body":"01234567890"}"#),
            Err(ClientError::JobTooBig)
        );
        assert_eq!(
            p(r#"{"command":"add","topic":"t","body":"x","id":"123"}"#),
            Err(ClientError::BadFormat)
        );
    }

    #[test]
    fn a_token_field_rides_along() {
        let t = |s: &str| parse_with_token(s.as_bytes(), 10);
        assert_eq!(
            t(r#"{"command":"finish","id":"7","token":"k"}"#),
            (
                Some(Bytes::from_static(b"k")),
                Ok(Command::Finish(JobId::Server(7)))
            )
        );
        // A bad command still authenticates: the token is good or not
        // whatever the command, and its reply says which.
        assert_eq!(
            t(r#"{"command":"nope","token":"k"}"#),
            (
                Some(Bytes::from_static(b"k")),
                Err(ClientError::UnknownCommand)
            )
        );
        assert_eq!(
            t(r#"{"command":"finish","id":"7","token":7}"#),
            (None, Err(ClientError::BadFormat))
        );
        assert_eq!(
            t(r#"{"command":"auth","token":"k"}"#),
            (None, Ok(Command::Auth(Bytes::from_static(b"k"))))
        );
        assert_eq!(t(r#"{"command":"schedules"}"#).0, None);
    }

    #[test]
    fn ids() {
        assert_eq!(
            p(r#"{"command":"finish","id":"7"}"#),
            Ok(Command::Finish(JobId::Server(7)))
        );
        assert_eq!(
            p(r#"{"command":"delete","id":7}"#),
            Ok(Command::Delete(JobId::Server(7)))
        );
    }
}
