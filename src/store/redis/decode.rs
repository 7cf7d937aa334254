//! Turning what the library's functions return into the domain's types, and
//! Redis's errors into the store's.

use std::time::Duration;

use bytes::Bytes;
use redis::{FromRedisValue, RedisError, Value};

use crate::error::{StoreError, StoreResult};
use crate::job::{
    Counts, JobBody, JobCounters, JobState, JobStats, Reserved, StoreStats, TubeStats,
};
use crate::names::{JobId, Tube};

/// A Redis error as the store's: a refusal for memory is the client's
/// `OUT_OF_MEMORY`, anything else the server's.
pub(super) fn fail(e: RedisError) -> StoreError {
    if e.code() == Some("OOM") {
        StoreError::OutOfMemory
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

/// A reply that is not what the library returns.
pub(super) fn corrupt(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from Redis: {what}"))
}

pub(super) fn parse<T: FromRedisValue>(v: Value) -> StoreResult<T> {
    redis::from_redis_value(v).map_err(|e| corrupt(&e.to_string()))
}

/// A job id as the scripts return it: a server id as a number, a
/// client-chosen one as text.
pub(super) fn job_id(v: Value) -> StoreResult<JobId> {
    match v {
        Value::Int(n) => u64::try_from(n)
            .map(JobId::Server)
            .map_err(|_| corrupt("job id")),
        Value::BulkString(raw) => JobId::parse(&raw).ok_or_else(|| corrupt("job id")),
        _ => Err(corrupt("job id")),
    }
}

pub(super) fn tube(raw: &str) -> StoreResult<Tube> {
    Tube::parse(raw.as_bytes()).ok_or_else(|| corrupt("tube name"))
}

/// A tube name as the scripts return it; one of `known` if it is one, so
/// that the usual reply costs no allocation.
fn returned_tube(v: Value, known: &[Tube]) -> StoreResult<Tube> {
    let Value::BulkString(raw) = v else {
        return Err(corrupt("tube name"));
    };
    match known
        .iter()
        .find(|t| t.as_str().as_bytes() == raw.as_slice())
    {
        Some(t) => Ok(t.clone()),
        None => Tube::parse(&raw).ok_or_else(|| corrupt("tube name")),
    }
}

/// A job as the scripts return it, `{id, tube, body, ...}`, or nothing;
/// what follows the body is left in `rest`.
pub(super) fn job_body(v: Value, known: &[Tube]) -> StoreResult<Option<(JobBody, Vec<Value>)>> {
    let fields = match v {
        Value::Nil => return Ok(None),
        Value::Array(fields) => fields,
        _ => return Err(corrupt("a job")),
    };
    let mut fields = fields.into_iter();
    let (Some(id), Some(t), Some(Value::BulkString(body))) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err(corrupt("a job"));
    };
    let job = JobBody {
        id: job_id(id)?,
        tube: returned_tube(t, known)?,
        body: Bytes::from(body),
    };
    Ok(Some((job, fields.collect())))
}

/// A reserved job, `{id, tube, body, ttr ms}`, or nothing.
pub(super) fn reserved(v: Value, known: &[Tube]) -> StoreResult<Option<Reserved>> {
    let Some((job, rest)) = job_body(v, known)? else {
        return Ok(None);
    };
    let [ttr] = <[Value; 1]>::try_from(rest).map_err(|_| corrupt("a reserved job"))?;
    Ok(Some(Reserved {
        job,
        ttr: Duration::from_millis(parse(ttr)?),
    }))
}

fn ms(v: Value) -> StoreResult<Duration> {
    parse::<u64>(v).map(Duration::from_millis)
}

/// `stats_job`'s reply: `{id, tube, state, pri, age, delay, ttr, time-left
/// (all ms), reserves, timeouts, releases, buries, kicks}`.
pub(super) fn job_stats(v: Vec<Value>) -> StoreResult<JobStats> {
    let [
        id,
        t,
        state,
        pri,
        age,
        delay,
        ttr,
        left,
        reserves,
        timeouts,
        releases,
        buries,
        kicks,
    ] = <[Value; 13]>::try_from(v).map_err(|_| corrupt("stats-job"))?;
    let state = match parse::<String>(state)?.as_str() {
        "ready" => JobState::Ready,
        "delayed" => JobState::Delayed,
        "reserved" => JobState::Reserved,
        "buried" => JobState::Buried,
        _ => return Err(corrupt("job state")),
    };
    Ok(JobStats {
        id: job_id(id)?,
        tube: tube(&parse::<String>(t)?)?,
        state,
        pri: parse(pri)?,
        age: ms(age)?,
        delay: ms(delay)?,
        ttr: ms(ttr)?,
        time_left: ms(left)?,
        counters: JobCounters {
            reserves: parse(reserves)?,
            timeouts: parse(timeouts)?,
            releases: parse(releases)?,
            buries: parse(buries)?,
            kicks: parse(kicks)?,
        },
    })
}

/// `stats_tube`'s reply: `{urgent, ready, reserved, delayed, buried, total,
/// using, watching, cmd-delete, cmd-pause-tube, pause ms, pause ms left}`.
pub(super) fn tube_stats(name: &Tube, v: Vec<u64>) -> StoreResult<TubeStats> {
    let [
        urgent,
        ready,
        reserved,
        delayed,
        buried,
        total,
        using,
        watching,
        deletes,
        pauses,
        pause,
        left,
    ] = <[u64; 12]>::try_from(v).map_err(|_| corrupt("stats-tube"))?;
    Ok(TubeStats {
        name: name.clone(),
        counts: Counts {
            urgent,
            ready,
            reserved,
            delayed,
            buried,
        },
        total_jobs: total,
        using,
        watching,
        cmd_delete: deletes,
        cmd_pause_tube: pauses,
        pause: Duration::from_millis(pause),
        pause_time_left: Duration::from_millis(left),
    })
}

/// `stats`'s reply: `{urgent, ready, reserved, delayed, buried, timeouts,
/// total jobs, tubes}`.
pub(super) fn store_stats(v: Vec<u64>) -> StoreResult<StoreStats> {
    let [
        urgent,
        ready,
        reserved,
        delayed,
        buried,
        timeouts,
        total,
        tubes,
    ] = <[u64; 8]>::try_from(v).map_err(|_| corrupt("stats"))?;
    Ok(StoreStats {
        counts: Counts {
            urgent,
            ready,
            reserved,
            delayed,
            buried,
        },
        job_timeouts: timeouts,
        total_jobs: total,
        tubes,
        log: None,
    })
}
