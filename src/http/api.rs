//! The JSON API under `/v1`, and its OpenAPI document (`openapi.json`,
//! served at `/v1/openapi.json`).
//!
//! Every route is an adapter: it reads the path, the query and the JSON
//! body into the [`Command`] the text protocol and JSON lines would make
//! (with the JSON-lines field rules of [`crate::protocol::json`]), runs it
//! in a [`Session`] acting as [`HTTP_CONN`] through
//! [`connection::run`] (in a task of its own, so that a client hanging up
//! never cuts a command off half way), and writes the [`Reply`] as JSON
//! with an HTTP status (`output.rs`). Validation, engine calls and reply
//! shapes are the protocol's, written once.
//!
//! * `input.rs`: tubes and ids from the path, the bounded JSON body, the
//!   query;
//! * `output.rs`: replies as responses (status, JSON body, headers).
//!
//! With tokens on (`--tokens`), every route that runs a command needs an
//! `Authorization: Bearer <token>` header: without one, or with a wrong
//! one (logged and slowed down, as a wrong `auth` is), it answers 401
//! `UNAUTHORIZED`; a command the token does not allow answers 403
//! `FORBIDDEN`. `/v1/openapi.json` and the dashboard's page are served to
//! anyone: they hold no jobs (the page asks for a token and sends it to
//! these routes). `/metrics` checks its own token (`metrics.rs`).
//!
//! A session lives for one request ([`Session::request`]): it counts no
//! connection and uses no tube, so it is dropped with nothing to undo, and
//! the jobs it reserves stay reserved by [`HTTP_CONN`] until finished,
//! released, buried or their TTR runs out. A reserve that finds nothing
//! ready is a long-poll: it waits on the broker as a blocked text
//! connection does ([`crate::protocol::session::Blocked`]), and a client
//! that hangs up meanwhile drops it, which leaves the queue and gives back
//! a job already on its way: hyper drops it when it sees the hang-up, and
//! the long-poll watches the socket itself for one hyper cannot see (behind
//! a pipelined request it does not read).

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::Request;
use axum::extract::State;
use axum::handler::Handler;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use bytes::Bytes;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::HTTP_CONN;
use crate::names::{JobId, Tube};
use crate::protocol::ClientError;
use crate::protocol::command::Command;
use crate::protocol::connection;
use crate::protocol::hangup::{HangUp, hung_up};
use crate::protocol::json;
use crate::protocol::reply::Reply;
use crate::protocol::session::{Outcome, Session, Shared};
use crate::store::Store;

mod input;
pub(super) mod output;

use input::{Fields, InJob, InTube, query_fields};
use output::{document, reply};

/// The OpenAPI document, compiled in.
const OPENAPI: &str = include_str!("openapi.json");

/// Longest a reserve may wait, in seconds (`timeout`). A client that
/// vanishes without closing its connection (a NAT or proxy dropping it
/// silently) goes unnoticed for as long, and a job handed to it comes back
/// only after its TTR: a long wait is better made of several short ones.
pub const MAX_WAIT: u32 = 300;

tokio::task_local! {
    /// The bearer token of the request being served, if it sent one, and
    /// its connection's [`Caller`]: set by [`bearer`] around every route,
    /// read by [`run`], which checks the token (rather than arguments
    /// threaded through every handler).
    static BEARER: (Option<Bytes>, Option<Caller>);
}

/// Who sends an HTTP connection's requests: the client's address, the
/// failed token checks in a row on the connection, which each wait longer
/// (a text connection's do; each request here is a session of its own),
/// and the connection's socket, watched for a hang-up during a long-poll.
#[derive(Debug, Clone)]
pub struct Caller {
    peer: std::net::SocketAddr,
    failures: Arc<AtomicU32>,
    socket: RawFd,
}

impl Caller {
    /// A fresh connection's, from `peer`, over `socket`: the descriptor of
    /// the connection's socket, open as long as the connection serves
    /// requests.
    pub fn new(peer: std::net::SocketAddr, socket: RawFd) -> Caller {
        Caller {
            peer,
            failures: Arc::new(AtomicU32::new(0)),
            socket,
        }
    }

    /// The client's address.
    pub fn peer(&self) -> std::net::SocketAddr {
        self.peer
    }

    /// Counts a token check: a failure adds one to the run of failures, a
    /// success ends it. Returns the run's length.
    pub fn failed(&self, failed: bool) -> u32 {
        if failed {
            self.failures
                .fetch_add(1, Ordering::Relaxed)
                .saturating_add(1)
        } else {
            self.failures.store(0, Ordering::Relaxed);
            0
        }
    }
}

/// Keeps the request's `Authorization: Bearer` token for [`run`]; refuses
/// a request a browser sent from a page of another origin.
async fn bearer(request: Request, next: Next) -> Response {
    if from_another_origin(request.headers()) {
        return reply(Reply::Forbidden);
    }
    let token = bearer_token(request.headers()).map(Bytes::copy_from_slice);
    let caller = request.extensions().get::<Caller>().cloned();
    BEARER.scope((token, caller), next.run(request)).await
}

/// Whether a browser sent the request from a page of another origin than
/// the API's own. Without tokens nothing else would stop any web page open
/// in a browser on the machine from putting, reserving or pausing: a
/// form-like `POST` (`text/plain`, no custom header) needs no CORS
/// preflight, and the API answers every such request. Browsers name the
/// page's origin in `Origin` (on every `POST`) and say in `Sec-Fetch-Site`
/// whether it is this one; clients that are not browsers send neither.
/// The dashboard is served from the API's own origin. `Sec-Fetch-Site`
/// is trusted when it is there (a proxy in front may rewrite `Host`); the
/// browsers too old to send it are judged by `Origin` against `Host`.
fn from_another_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // `scheme://host[:port]`, against the `Host` the browser sent to.
    let authority = origin
        .as_bytes()
        .strip_prefix(b"http://")
        .or_else(|| origin.as_bytes().strip_prefix(b"https://"));
    let host = headers.get(header::HOST).map(|h| h.as_bytes());
    !matches!((authority, host), (Some(a), Some(h)) if a.eq_ignore_ascii_case(h))
}

/// The token of an `Authorization: Bearer <token>` header, if there is one
/// (the scheme's name in any case, as HTTP has it).
pub(super) fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(b"Bearer ".len())?;
    scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
}

/// A route: its path, its method, and what serves it.
type Route<S> = (&'static str, Method, MethodRouter<Arc<Shared<S>>>);

/// `handler` at `method path`.
fn at<S, H, T>(method: Method, path: &'static str, handler: H) -> Route<S>
where
    S: Store,
    H: Handler<T, Arc<Shared<S>>>,
    T: 'static,
{
    let filter =
        MethodFilter::try_from(method.clone()).expect("the table's methods are method filters");
    (path, method, on(filter, handler))
}

/// Every route under `/v1`, written once for the router and [`paths`].
fn table<S: Store>() -> Vec<Route<S>> {
    vec![
        at(Method::GET, "/openapi.json", openapi),
        at(Method::GET, "/stats", stats::<S>),
        at(Method::GET, "/tubes", list_tubes::<S>),
        at(Method::POST, "/tubes/{tube}/jobs", add::<S>),
        at(Method::POST, "/tubes/{tube}/reserve", reserve::<S>),
        at(Method::POST, "/tubes/{tube}/kick", kick::<S>),
        at(Method::POST, "/tubes/{tube}/pause", pause::<S>),
        at(Method::GET, "/tubes/{tube}/stats", stats_tube::<S>),
        at(Method::GET, "/tubes/{tube}/ready", peek_ready::<S>),
        at(Method::GET, "/tubes/{tube}/delayed", peek_delayed::<S>),
        at(Method::GET, "/tubes/{tube}/buried", peek_buried::<S>),
        at(Method::GET, "/jobs/{id}", peek::<S>),
        at(Method::DELETE, "/jobs/{id}", delete::<S>),
        at(Method::GET, "/jobs/{id}/stats", stats_job::<S>),
        at(Method::POST, "/jobs/{id}/finish", finish::<S>),
        at(Method::POST, "/jobs/{id}/release", release::<S>),
        at(Method::POST, "/jobs/{id}/bury", bury::<S>),
        at(Method::POST, "/jobs/{id}/touch", touch::<S>),
        at(Method::POST, "/jobs/{id}/kick", kick_job::<S>),
    ]
}

/// The API's routes, under `/v1`. A path it does not know, or a method a
/// path does not take, gets a JSON error too.
pub fn routes<S: Store>() -> Router<Arc<Shared<S>>> {
    let v1 = table::<S>()
        .into_iter()
        .fold(Router::new(), |router, (path, _, route)| {
            router.route(path, route)
        })
        .fallback(output::unknown_path)
        .method_not_allowed_fallback(output::wrong_method)
        .layer(middleware::from_fn(bearer));
    Router::new().nest("/v1", v1)
}

/// Every route as `(method, path)`, the path as the OpenAPI document
/// writes it (`/v1/tubes/{tube}/jobs`), the method in lower case: the
/// tests check the document against this list.
pub fn paths() -> Vec<(String, String)> {
    table::<crate::store::memory::MemoryStore>()
        .into_iter()
        .map(|(path, method, _)| (method.as_str().to_ascii_lowercase(), format!("/v1{path}")))
        .collect()
}

/// Runs `cmd` in a session of its own with `tube` as its tube, and returns
/// the reply. A reserve that finds nothing ready waits on the broker until
/// a job is handed over or its timeout passes.
async fn run<S: Store>(
    shared: Arc<Shared<S>>,
    tube: Tube,
    cmd: Result<Command, ClientError>,
) -> Reply {
    run_watching(shared, tube, cmd, None).await
}

/// [`run`], for a request whose long-poll also ends when `caller` hangs up.
///
/// hyper drops a request's handler when it sees its client go, and a
/// dropped long-poll leaves nothing behind (see `Blocked`), but it sees the
/// end of the input only while it reads, and with a next request read
/// ahead (pipelined) it reads no further: the departed client stayed a
/// waiter until its timeout (up to 300 s), and a job handed to it stayed
/// reserved until its TTR. The socket is watched for the hang-up itself,
/// as a text connection's is.
async fn run_watching<S: Store>(
    shared: Arc<Shared<S>>,
    tube: Tube,
    cmd: Result<Command, ClientError>,
    caller: Option<&Caller>,
) -> Reply {
    let started = Instant::now();
    let tokens_on = shared.config.tokens.is_some();
    let files = shared.client_files.clone();
    let mut session = Session::request(shared, HTTP_CONN, tube);
    if tokens_on {
        let (token, caller) = BEARER.try_with(Clone::clone).unwrap_or_default();
        // A missing token is no guess: it is refused at once, unlogged.
        let Some(token) = token else {
            return Reply::Unauthorized;
        };
        if let Some(caller) = &caller {
            session.peer = Some(caller.peer);
            session.set_failures(caller.failures.load(Ordering::Relaxed));
        }
        let authenticated = session.authenticate(&token).await;
        if let Some(caller) = &caller {
            caller.failures.store(session.failures(), Ordering::Relaxed);
        }
        if authenticated != Reply::Authenticated {
            return Reply::Unauthorized;
        }
    }
    let cmd = match cmd {
        Ok(cmd) => cmd,
        Err(e) => return e.into(),
    };
    // Carried out in a task of its own, as a connection's commands are
    // never cut off half way: a client that hangs up must not leave a put
    // on the disk but not yet handed out, or a release whose delay the
    // timer was never told of. (Only the long-poll below ends with its
    // client, which `Blocked` is made for.)
    let ran = tokio::spawn(async move {
        let outcome = connection::run(&mut session, cmd).await;
        (session, outcome)
    })
    .await;
    let Ok((mut session, outcome)) = ran else {
        // It panicked; the panic is logged.
        return Reply::InternalError;
    };
    match outcome {
        Outcome::Reply(reply) => reply,
        Outcome::Wait(wanted) => {
            let mut blocked = session.block(wanted, started);
            // Every reserve here has a timeout (`reserve` sees to it).
            let until = blocked
                .timeout_at()
                .unwrap_or_else(|| started + Duration::from_secs(MAX_WAIT.into()));
            let watch = caller.and_then(|caller| {
                // SAFETY: the descriptor is the socket of the connection
                // serving this request, which stays open while the request
                // is served; it is duplicated at once, and only the
                // duplicate is kept.
                HangUp::watch(unsafe { BorrowedFd::borrow_raw(caller.socket) }, &files)
            });
            tokio::select! {
                handed = blocked.handed() => blocked.deliver(&mut session, handed).await,
                () = tokio::time::sleep_until(until) => blocked
                    .end(&mut session, Some(Reply::TimedOut))
                    .await
                    .unwrap_or(Reply::TimedOut),
                // Nobody reads this reply; `blocked`, dropped on the way
                // out, gives back a job handed to it meanwhile.
                () = hung_up(watch.as_ref()) => Reply::TimedOut,
            }
        }
        // No command made here quits.
        Outcome::Quit => Reply::InternalError,
    }
}

/// A command that names no tube runs with `default` as its session's
/// tube; the session does not use it, so it is neither created nor
/// counted.
fn no_tube() -> Tube {
    Tube::default_tube()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn add<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
    Fields(fields): Fields,
) -> Response {
    let cmd = json::add(&fields, Ok(tube.clone()), shared.config.max_job_size);
    reply(run(shared, tube, cmd).await)
}

/// `timeout` (seconds, default 0, at most [`MAX_WAIT`]) and `count` (a
/// batch), in the query or the JSON body.
async fn reserve<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    caller: Option<Extension<Caller>>,
    InTube(tube): InTube,
    uri: Uri,
    Fields(fields): Fields,
) -> Response {
    let cmd = reserve_command(&uri, fields, &tube);
    let caller = caller.map(|Extension(caller)| caller);
    reply(run_watching(shared, tube, cmd, caller.as_ref()).await)
}

/// The reserve a request asks for.
fn reserve_command(
    uri: &Uri,
    mut fields: Map<String, Value>,
    tube: &Tube,
) -> Result<Command, ClientError> {
    query_fields(uri, &mut fields)?;
    // Over HTTP a reserve without a timeout answers at once, not never.
    if matches!(fields.get("timeout"), None | Some(Value::Null)) {
        fields.insert("timeout".into(), Value::from(0));
    }
    let cmd = json::pop(&fields, Ok(tube.clone()))?;
    match cmd {
        Command::Reserve {
            timeout: Some(t), ..
        }
        | Command::ReserveBatch {
            timeout: Some(t), ..
        } if t <= MAX_WAIT => Ok(cmd),
        _ => Err(ClientError::BadFormat),
    }
}

async fn kick<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
    Fields(fields): Fields,
) -> Response {
    reply(run(shared, tube, json::kick(&fields)).await)
}

async fn pause<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
    Fields(fields): Fields,
) -> Response {
    let cmd = json::pause(tube.clone(), &fields);
    reply(run(shared, tube, cmd).await)
}

async fn stats<S: Store>(State(shared): State<Arc<Shared<S>>>) -> Response {
    document(run(shared, no_tube(), Ok(Command::Stats)).await, "stats")
}

async fn list_tubes<S: Store>(State(shared): State<Arc<Shared<S>>>) -> Response {
    // `{"success":true,"tubes":[...]}`, streamed.
    reply(run(shared, no_tube(), Ok(Command::ListTubes)).await)
}

async fn stats_tube<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
) -> Response {
    let cmd = Ok(Command::StatsTube(tube.clone()));
    document(run(shared, tube, cmd).await, "stats")
}

async fn peek_ready<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
) -> Response {
    reply(run(shared, tube, Ok(Command::PeekReady)).await)
}

async fn peek_delayed<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
) -> Response {
    reply(run(shared, tube, Ok(Command::PeekDelayed)).await)
}

async fn peek_buried<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InTube(tube): InTube,
) -> Response {
    reply(run(shared, tube, Ok(Command::PeekBuried)).await)
}

/// Runs a command about one job, made from its id alone.
async fn on_job<S: Store>(shared: Arc<Shared<S>>, make: fn(JobId) -> Command, id: JobId) -> Reply {
    run(shared, no_tube(), Ok(make(id))).await
}

async fn peek<S: Store>(State(shared): State<Arc<Shared<S>>>, InJob(id): InJob) -> Response {
    reply(on_job(shared, Command::Peek, id).await)
}

async fn delete<S: Store>(State(shared): State<Arc<Shared<S>>>, InJob(id): InJob) -> Response {
    reply(on_job(shared, Command::Delete, id).await)
}

async fn stats_job<S: Store>(State(shared): State<Arc<Shared<S>>>, InJob(id): InJob) -> Response {
    document(on_job(shared, Command::StatsJob, id).await, "stats")
}

async fn finish<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InJob(id): InJob,
    Fields(_): Fields,
) -> Response {
    reply(on_job(shared, Command::Finish, id).await)
}

async fn touch<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InJob(id): InJob,
    Fields(_): Fields,
) -> Response {
    reply(on_job(shared, Command::Touch, id).await)
}

async fn kick_job<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InJob(id): InJob,
    Fields(_): Fields,
) -> Response {
    reply(on_job(shared, Command::KickJob, id).await)
}

async fn release<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InJob(id): InJob,
    Fields(fields): Fields,
) -> Response {
    reply(run(shared, no_tube(), json::release(id, &fields)).await)
}

async fn bury<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    InJob(id): InJob,
    Fields(fields): Fields,
) -> Response {
    reply(run(shared, no_tube(), json::bury(id, &fields)).await)
}
