//! JSON-lines mode (extension): a command line that starts with `{` is one
//! JSON object, mapped onto the same [`Command`] values as the text protocol.
//!
//! Commands: `add`, `pop`, `finish`, `delete`. Ids travel as JSON strings.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::ClientError;
use super::command::Command;
use crate::names::{JobId, Tube, client_id};

/// Priority of an `add` that gives none (beanstalkd clients' usual default).
pub const DEFAULT_PRIORITY: u32 = 1024;
/// Time to run of an `add` that gives none, in seconds.
pub const DEFAULT_TTR: u32 = 60;

/// Parses one JSON command line; `max_job_size` bounds the decoded body.
pub fn parse(line: &[u8], max_job_size: usize) -> Result<Command, ClientError> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return Err(ClientError::BadFormat);
    };
    let name = match obj.get("command") {
        Some(Value::String(s)) => s.as_str(),
        _ => return Err(ClientError::BadFormat),
    };
    match name {
        "add" => {
            let body = match obj.get("body") {
                Some(Value::String(s)) => s.as_bytes(),
                _ => return Err(ClientError::BadFormat),
            };
            if body.len() > max_job_size {
                return Err(ClientError::JobTooBig);
            }
            let id = match obj.get("id") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => {
                    Some(client_id(s.as_bytes()).ok_or(ClientError::BadFormat)?)
                }
                Some(_) => return Err(ClientError::BadFormat),
            };
            Ok(Command::Put {
                pri: seconds(&obj, "priority")?.unwrap_or(DEFAULT_PRIORITY),
                delay: seconds(&obj, "delay")?.unwrap_or(0),
                ttr: seconds(&obj, "ttr")?.unwrap_or(DEFAULT_TTR),
                id,
                tube: Some(topic(&obj)?),
                body: Bytes::copy_from_slice(body),
            })
        }
        "pop" => Ok(Command::Reserve {
            timeout: seconds(&obj, "timeout")?,
            tube: Some(topic(&obj)?),
        }),
        "finish" => Ok(Command::Finish(job_id(&obj)?)),
        "delete" => Ok(Command::Delete(job_id(&obj)?)),
        _ => Err(ClientError::UnknownCommand),
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
    match obj.get("id") {
        Some(Value::String(s)) => JobId::parse(s.as_bytes()).ok_or(ClientError::BadFormat),
        Some(Value::Number(n)) => n.as_u64().map(JobId::Server).ok_or(ClientError::BadFormat),
        _ => Err(ClientError::BadFormat),
    }
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
    fn add_with_defaults() {
        let Ok(Command::Put {
            pri,
            delay,
            ttr,
            id,
            tube,
            body,
        }) = p(r#"{"command":"add","topic":"t","body":"x"}"#)
        else {
            panic!("not an add")
        };
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
