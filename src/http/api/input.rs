//! What a request says: the tube or job id in its path, its JSON body and
//! its query, each checked as the text protocol and JSON lines check them.
//! A request that cannot be read is refused with the protocol's word and a
//! JSON body, never axum's plain-text rejection.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::Response;
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::{Map, Value};

use super::output::refuse;
use crate::names::{JobId, Tube, parse_u64};
use crate::protocol::ClientError;
use crate::protocol::codec::Limits;
use crate::protocol::session::Shared;
use crate::store::Store;

/// The tube a path names (`{tube}`, percent-decoded), checked as `use`
/// checks it.
pub struct InTube(pub Tube);

impl<St: Send + Sync> FromRequestParts<St> for InTube {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, Response> {
        let raw = one_param(parts, state).await?;
        Tube::parse(raw.as_bytes())
            .map(InTube)
            .ok_or_else(|| refuse(ClientError::BadFormat))
    }
}

/// The job a path names (`{id}`, percent-decoded): digits are a server id,
/// anything else a client id, as [`JobId::parse`] decides.
pub struct InJob(pub JobId);

impl<St: Send + Sync> FromRequestParts<St> for InJob {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, Response> {
        let raw = one_param(parts, state).await?;
        JobId::parse(raw.as_bytes())
            .map(InJob)
            .ok_or_else(|| refuse(ClientError::BadFormat))
    }
}

/// The path's one parameter; text that does not decode to UTF-8 is
/// `BAD_FORMAT`.
async fn one_param<St: Send + Sync>(parts: &mut Parts, state: &St) -> Result<String, Response> {
    Path::<String>::from_request_parts(parts, state)
        .await
        .map(|Path(raw)| raw)
        .map_err(|_| refuse(ClientError::BadFormat))
}

/// The fields of a JSON object body; no body at all is no fields.
///
/// The body is read only up to the longest a JSON-lines command may be
/// ([`Limits::json_line`]: room for the largest job even if every byte of
/// it is escaped): past that it is `JOB_TOO_BIG` at once (a `Content-Length`
/// over it before a byte of the body is read), so a request holds at most
/// that much memory. The rest of a too-big body is still read, and dropped,
/// up to [`DRAIN_LIMIT`] bytes in all: a server that answers and closes
/// while the client is still sending resets the connection, and the client,
/// failing on its write, may never see the 413; drained, the connection
/// even serves the client's next request. One declared over
/// [`DRAIN_LIMIT`] is answered and its connection closed.
///
/// A body must arrive within [`BODY_TIMEOUT`] and a second
/// more for every [`BODY_RATE`] bytes already come, or the request is
/// answered 408 and its connection closed: a client that declares a body
/// and never sends it, or trickles it, would otherwise hold its
/// connection, one of the capped number, for ever; one on a slow link
/// still gets its large body through. A body that is not a JSON object is
/// `BAD_FORMAT`.
pub struct Fields(pub Map<String, Value>);

/// Longest a request's body may take to arrive, from when its head was
/// read: as long as the head itself may take ([`crate::http::HEADER_TIMEOUT`]).
pub const BODY_TIMEOUT: std::time::Duration = crate::http::HEADER_TIMEOUT;

/// The slowest a body may come past [`BODY_TIMEOUT`], in bytes a second:
/// the largest body of the default `-z` (394,234 bytes) then has 49 s.
pub const BODY_RATE: u64 = 10_000;

/// The most of a too-big body that is read (and dropped) so that its
/// client can be answered on a connection that is still whole: a few
/// times the largest body of the default `-z`, which a client that does not
/// know the limit may well send; past it, answering at once and closing
/// costs less than taking in what could be gigabytes.
pub const DRAIN_LIMIT: u64 = 4 << 20;

impl<S: Store> FromRequest<Arc<Shared<S>>> for Fields {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<Shared<S>>) -> Result<Self, Response> {
        let limit = Limits {
            max_job_size: state.config.max_job_size,
        }
        .json_line();
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| parse_u64(v.as_bytes()));
        if declared.is_some_and(|n| n > DRAIN_LIMIT) {
            return Err(closing(refuse(ClientError::JobTooBig)));
        }
        if declared.is_some_and(|n| n > limit as u64) {
            let stream = req.into_body().into_data_stream();
            tokio::spawn(drain(stream, tokio::time::Instant::now(), 0));
            return Err(refuse(ClientError::JobTooBig));
        }
        let bytes = match read_body(req.into_body(), limit).await {
            Ok(bytes) => bytes,
            Err(None) => return Err(too_slow()),
            Err(Some(e)) => return Err(refuse(e)),
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Fields(Map::new()));
        }
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(fields)) => Ok(Fields(fields)),
            _ => Err(refuse(ClientError::BadFormat)),
        }
    }
}

/// The answer to a body that did not arrive in time: 408, `BAD_FORMAT`,
/// and the connection closed (the rest of the body may still come).
fn too_slow() -> Response {
    let mut response = refuse(ClientError::BadFormat);
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    closing(response)
}

/// `response`, with its connection closed after it.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The whole body, if it is at most `limit` bytes and comes in time (see
/// [`Fields`]); `Err(None)`: it did not.
async fn read_body(body: Body, limit: usize) -> Result<BytesMut, Option<ClientError>> {
    let started = tokio::time::Instant::now();
    let mut stream = body.into_data_stream();
    let mut bytes = BytesMut::new();
    loop {
        let came = bytes.len() as u64;
        let until = started
            + BODY_TIMEOUT
            + std::time::Duration::from_millis(came.saturating_mul(1000) / BODY_RATE);
        let Ok(next) = tokio::time::timeout_at(until, stream.next()).await else {
            return Err(None);
        };
        let Some(chunk) = next else {
            break;
        };
        // The client stopped half way through its body.
        let chunk = chunk.map_err(|_| Some(ClientError::BadFormat))?;
        if bytes.len() + chunk.len() > limit {
            tokio::spawn(drain(stream, started, (bytes.len() + chunk.len()) as u64));
            return Err(Some(ClientError::JobTooBig));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Reads and drops the rest of a too-big body, `came` bytes of it already
/// read, within the time [`read_body`] gives a body of its size, up to
/// [`DRAIN_LIMIT`] bytes, while the answer goes out (hyper writes a
/// response and reads its request's body independently). What is left
/// unread when it gives up makes hyper close the connection, as it must.
/// The task ends with the connection at the latest: the stream then ends.
async fn drain(
    mut stream: axum::body::BodyDataStream,
    started: tokio::time::Instant,
    mut came: u64,
) {
    while came <= DRAIN_LIMIT {
        let until = started
            + BODY_TIMEOUT
            + std::time::Duration::from_millis(came.saturating_mul(1000) / BODY_RATE);
        match tokio::time::timeout_at(until, stream.next()).await {
            Ok(Some(Ok(chunk))) => came += chunk.len() as u64,
            _ => return,
        }
    }
}

/// Adds the query's parameters to `fields`: a whole number as a JSON
/// number, anything else as a string (which a number field refuses). A
/// parameter given twice, or in both the query and the body, is
/// `BAD_FORMAT`.
pub fn query_fields(uri: &Uri, fields: &mut Map<String, Value>) -> Result<(), ClientError> {
    let Query(params) =
        Query::<Vec<(String, String)>>::try_from_uri(uri).map_err(|_| ClientError::BadFormat)?;
    for (name, raw) in params {
        let value = match parse_u64(raw.as_bytes()) {
            Some(n) => Value::from(n),
            None => Value::String(raw),
        };
        if fields.insert(name, value).is_some() {
            return Err(ClientError::BadFormat);
        }
    }
    Ok(())
}
