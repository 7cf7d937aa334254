//! Who may run what, when tokens are on (`--tokens`): the role each command
//! needs ([`needs`], the one table), the tube prefix checks, and `auth`.
//!
//! With tokens off every session is [`Access::Open`] and the only cost is
//! one branch per command.
//!
//! A refusal on a tube the command names is `FORBIDDEN`; a job outside the
//! token's prefix is `NOT_FOUND`, as a job that does not exist, so that
//! one team cannot learn which ids another team's jobs have.

use tracing::warn;

use super::command::Command;
use super::failure::failed;
use super::reply::Reply;
use super::session::Session;
use crate::auth::{Access, Grant, Role, failure_delay};
use crate::names::{JobId, Tube};
use crate::store::Store;

/// What a command needs of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any valid token.
    Any,
    /// A token with this role (an admin has every role).
    Role(Role),
    /// The worker role if the connection holds every job named (it
    /// reserved them), else the admin role: a worker deletes what it
    /// reserved, only an admin deletes any job.
    HolderOrAdmin,
    /// An admin token without a prefix: schedules are named server-wide,
    /// so a prefix could not keep one team off another's.
    WholeAdmin,
}

/// The role each command needs: the one table (protocol.md repeats it).
pub fn needs(cmd: &Command) -> Need {
    match cmd {
        Command::Auth(_)
        | Command::Quit
        | Command::Use(_)
        | Command::Watch(_)
        | Command::Ignore(_)
        | Command::ListTubeUsed
        | Command::ListTubesWatched
        | Command::ListTubes
        | Command::Peek(_)
        | Command::PeekReady
        | Command::PeekDelayed
        | Command::PeekBuried
        | Command::StatsJob(_)
        | Command::StatsTube(_)
        | Command::TubeSettings(_)
        | Command::Stats => Need::Any,
        Command::Put { .. } => Need::Role(Role::Producer),
        Command::Reserve { .. }
        | Command::ReserveBatch { .. }
        | Command::ReserveJob(_)
        | Command::Finish(_)
        | Command::Release { .. }
        | Command::Bury { .. }
        | Command::Touch(_)
        | Command::RemoveBatch { finish: true, .. } => Need::Role(Role::Worker),
        Command::Delete(_) | Command::RemoveBatch { finish: false, .. } => Need::HolderOrAdmin,
        Command::Kick(_) | Command::KickJob(_) | Command::PauseTube(..) | Command::TubeSet(..) => {
            Need::Role(Role::Admin)
        }
        Command::Schedule(_)
        | Command::Unschedule(_)
        | Command::ListSchedules
        | Command::Export { .. }
        | Command::Import(_)
        | Command::ImportSettings(..)
        | Command::ImportSchedule(_) => Need::WholeAdmin,
    }
}

/// The tube a command names or acts on, given the session's used tube (a
/// reserve from the watch list is limited where it runs, in `dispatch`).
fn tube_of<'a>(cmd: &'a Command, used: &'a Tube) -> Option<&'a Tube> {
    match cmd {
        Command::Put { tube, .. } => Some(tube.as_ref().unwrap_or(used)),
        Command::Use(t)
        | Command::Watch(t)
        | Command::StatsTube(t)
        | Command::TubeSettings(t)
        | Command::PauseTube(t, _)
        | Command::TubeSet(t, _) => Some(t),
        Command::Reserve { tube, .. } | Command::ReserveBatch { tube, .. } => tube.as_ref(),
        Command::PeekReady | Command::PeekDelayed | Command::PeekBuried | Command::Kick(_) => {
            Some(used)
        }
        _ => None,
    }
}

/// The one job a command acts on by its id.
fn job_of(cmd: &Command) -> Option<&JobId> {
    match cmd {
        Command::ReserveJob(id)
        | Command::Delete(id)
        | Command::Finish(id)
        | Command::Touch(id)
        | Command::Peek(id)
        | Command::KickJob(id)
        | Command::StatsJob(id)
        | Command::Release { id, .. }
        | Command::Bury { id, .. } => Some(id),
        _ => None,
    }
}

impl<S: Store> Session<S> {
    /// The refusal of `cmd`, if the session's token does not allow it,
    /// without looking at any job: the role, and the tube it names.
    pub(super) fn refusal(&self, cmd: &Command) -> Option<Reply> {
        let grant = match &self.access {
            Access::Open => return None,
            Access::Anonymous if matches!(cmd, Command::Quit | Command::Auth(_)) => return None,
            Access::Anonymous => return Some(Reply::Unauthorized),
            Access::Granted(grant) => grant,
        };
        let allowed = match needs(cmd) {
            Need::Any => true,
            Need::Role(role) => grant.has(role),
            Need::HolderOrAdmin => {
                grant.has(Role::Admin) || (grant.has(Role::Worker) && self.holds_all(cmd))
            }
            Need::WholeAdmin => grant.has(Role::Admin) && grant.prefix().is_none(),
        };
        let tube_ok = tube_of(cmd, &self.used).is_none_or(|t| grant.may_touch(t.as_str()));
        (!allowed || !tube_ok).then_some(Reply::Forbidden)
    }

    /// `cmd` as the session's token allows it, or its refusal. A prefix
    /// token's command on a job by id first looks up the job's tube,
    /// unless the connection holds the job (it reserved it from a tube it
    /// may touch); a batch loses the ids the token may not touch.
    pub(super) async fn permit(&mut self, cmd: Command) -> Result<Command, Reply> {
        if let Some(refusal) = self.refusal(&cmd) {
            return Err(refusal);
        }
        let Access::Granted(grant) = &self.access else {
            return Ok(cmd);
        };
        if grant.prefix().is_none() {
            return Ok(cmd);
        }
        let grant = grant.clone();
        if let Some(id) = job_of(&cmd) {
            return match self.may_touch_job(&grant, id).await {
                Ok(true) => Ok(cmd),
                Ok(false) => Err(Reply::NotFound),
                Err(reply) => Err(reply),
            };
        }
        if let Command::RemoveBatch { ids, finish } = cmd {
            let mut kept = Vec::with_capacity(ids.len());
            for id in ids {
                if self.may_touch_job(&grant, &id).await? {
                    kept.push(id);
                }
            }
            return Ok(Command::RemoveBatch { ids: kept, finish });
        }
        Ok(cmd)
    }

    /// Whether the tube of job `id` is one `grant` may touch; a job that
    /// is not there is not.
    async fn may_touch_job(&self, grant: &Grant, id: &JobId) -> Result<bool, Reply> {
        if self.deadlines.contains_key(id) {
            return Ok(true);
        }
        match self.shared.broker.stats_job(id).await {
            Ok(found) => Ok(found.is_some_and(|job| grant.may_touch(job.tube.as_str()))),
            Err(e) => Err(failed(self.id, e)),
        }
    }

    /// Whether the connection holds every job `cmd` names.
    fn holds_all(&self, cmd: &Command) -> bool {
        match cmd {
            Command::RemoveBatch { ids, .. } => {
                ids.iter().all(|id| self.deadlines.contains_key(id))
            }
            _ => job_of(cmd).is_some_and(|id| self.deadlines.contains_key(id)),
        }
    }

    /// Whether the session's token may reserve from `tube` (a reserve
    /// from the watch list takes only from these).
    pub(super) fn may_reserve_from(&self, tube: &Tube) -> bool {
        match &self.access {
            Access::Granted(grant) => grant.may_touch(tube.as_str()),
            _ => true,
        }
    }

    /// Answers `auth`: with tokens off it always succeeds, so that a
    /// client configured with a token works against either kind of server.
    /// A failure is logged (never with the token) and answered only after
    /// a delay that grows with the connection's failures in a row.
    pub async fn authenticate(&mut self, token: &[u8]) -> Reply {
        let Some(tokens) = self.shared.config.tokens.clone() else {
            return Reply::Authenticated;
        };
        match tokens.check(token) {
            Some(grant) => {
                self.failures = 0;
                self.access = Access::Granted(grant);
                Reply::Authenticated
            }
            None => {
                self.failures = self.failures.saturating_add(1);
                // A failed attempt also drops an earlier grant: the client
                // meant to be someone else, and is not.
                self.access = Access::Anonymous;
                warn!(conn = self.id, peer = ?self.peer, failures = self.failures, "authentication failed");
                tokio::time::sleep(failure_delay(self.failures)).await;
                Reply::Unauthorized
            }
        }
    }
}
