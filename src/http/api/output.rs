//! Replies as HTTP responses: the JSON of [`Reply::to_json`] (the shapes
//! JSON lines answers with), under the status that says the same.
//!
//! | Reply | Status |
//! | --- | --- |
//! | `INSERTED` | 201, with `Location` |
//! | any other success, and `TIMED_OUT` (a long-poll that got nothing) | 200 |
//! | `NOT_FOUND` | 404 |
//! | `EXISTS` (and `NOT_IGNORED`, which no route can get) | 409 |
//! | `BAD_FORMAT`, `BAD_OPTION`, the other client errors | 400 |
//! | `JOB_TOO_BIG` | 413 |
//! | `UNAUTHORIZED` (no bearer token, or a wrong one), with `WWW-Authenticate` | 401 |
//! | `FORBIDDEN` (the token does not allow it) | 403 |
//! | `DRAINING` | 503 |
//! | `OUT_OF_MEMORY`, `INTERNAL_ERROR` | 503, with `Retry-After: 1` |

use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures_util::{StreamExt, stream};
use serde_json::json;

use crate::protocol::ClientError;
use crate::protocol::reply::Reply;
use crate::protocol::stats::document_json;

/// How long a client should wait before trying again after the store
/// failed, in seconds: a Redis failover or a full disk is usually over in
/// seconds, and a later call says if it is not.
const RETRY_AFTER: &str = "1";

/// The response to `reply`.
pub fn reply(reply: Reply) -> Response {
    let status = status(&reply);
    if reply.json_pieces() > 1 {
        return (status, streamed(reply)).into_response();
    }
    let mut response = (status, Json(reply.to_json())).into_response();
    let headers = response.headers_mut();
    match &reply {
        Reply::Inserted(id) => {
            // A path segment may hold every character of an id but `/`.
            let at = format!("/v1/jobs/{}", id.to_string().replace('/', "%2F"));
            if let Ok(at) = HeaderValue::from_str(&at) {
                headers.insert(header::LOCATION, at);
            }
        }
        Reply::OutOfMemory | Reply::InternalError => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
        }
        Reply::Unauthorized => {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        _ => {}
    }
    response
}

/// The body of a reply that may be large (a batch of jobs), made a piece
/// at a time as the client takes it, as the JSON-lines protocol sends it:
/// made whole, 1,000 jobs of 64 KiB of control bytes are 393 MB, held for
/// as long as the client takes to read them.
fn streamed(reply: Reply) -> impl IntoResponse {
    let pieces = stream::iter(0..reply.json_pieces()).map(move |piece| {
        let mut out = BytesMut::new();
        reply.json_piece(piece, &mut out);
        Ok::<_, Infallible>(out.freeze())
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(pieces),
    )
}

/// The response to a command answered with a YAML document (`stats`,
/// `stats-tube`, `stats-job`): the document as JSON under `key`. Any other
/// reply (`NOT_FOUND`, a failure, a list of tubes, which is streamed) is
/// answered as usual.
pub fn document(answer: Reply, key: &str) -> Response {
    match answer {
        Reply::Yaml(doc) => {
            Json(json!({"success": true, key: document_json(&doc)})).into_response()
        }
        other => reply(other),
    }
}

/// The response to a request refused before it became a command.
pub fn refuse(e: ClientError) -> Response {
    reply(Reply::Client(e))
}

/// A path under `/v1` that the API does not have.
pub async fn unknown_path() -> Response {
    (StatusCode::NOT_FOUND, Json(unknown_command())).into_response()
}

/// A method a path of the API does not take.
pub async fn wrong_method() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, Json(unknown_command())).into_response()
}

fn unknown_command() -> serde_json::Value {
    Reply::Client(ClientError::UnknownCommand).to_json()
}

/// The status that says what `reply` says.
fn status(reply: &Reply) -> StatusCode {
    match reply {
        Reply::Inserted(_) | Reply::Imported(_) => StatusCode::CREATED,
        Reply::NotFound => StatusCode::NOT_FOUND,
        Reply::Exists(_) | Reply::NotIgnored => StatusCode::CONFLICT,
        Reply::Client(ClientError::JobTooBig) => StatusCode::PAYLOAD_TOO_LARGE,
        Reply::Client(
            ClientError::BadFormat
            | ClientError::UnknownCommand
            | ClientError::ExpectedCrlf
            | ClientError::BadOption
            | ClientError::BadSchedule(_),
        ) => StatusCode::BAD_REQUEST,
        Reply::Draining | Reply::OutOfMemory | Reply::InternalError => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        // A long-poll that got nothing did what it was asked: the body says
        // `TIMED_OUT`. `DEADLINE_SOON` needs reservations held by the
        // session, which a request's never has.
        Reply::TimedOut | Reply::DeadlineSoon => StatusCode::OK,
        Reply::Unauthorized => StatusCode::UNAUTHORIZED,
        Reply::Forbidden => StatusCode::FORBIDDEN,
        Reply::Using(_)
        | Reply::Authenticated
        | Reply::Reserved(_)
        | Reply::Batch(_)
        | Reply::Removed { .. }
        | Reply::Deleted(_)
        | Reply::Finished(_)
        | Reply::Released
        | Reply::Buried
        | Reply::Touched
        | Reply::Watching(_)
        | Reply::Found(_)
        | Reply::Kicked(_)
        | Reply::KickedJob
        | Reply::Yaml(_)
        | Reply::Tubes(_)
        | Reply::Paused
        | Reply::Set
        | Reply::Scheduled(_)
        | Reply::Unscheduled
        | Reply::Schedules(..)
        | Reply::Exported { .. } => StatusCode::OK,
    }
}
