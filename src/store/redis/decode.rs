//! Turning what the library's functions return into the domain's types, and
//! Redis's errors into the store's.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use redis::{FromRedisValue, RedisError, Value};

use crate::error::{StoreError, StoreResult};
use crate::job::{
    Backoff, Counts, JobBody, JobCounters, JobState, JobStats, LifeStats, Lifecycle, Reserved,
    StoreStats, TubeStats, WholeJob,
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

/// `v` as a `T`, or an error that says Redis answered what was not expected.
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

/// A tube name the library returned.
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

/// A job's options or a tube's settings as the library keeps them:
/// `tries|kind|base|max|jitter|ttl|unique|rate`, each empty when unset (kind `f` fixed, `e`
/// exponential; times in ms); all unset is the empty string.
pub(super) fn encode_options(o: &Lifecycle) -> String {
    if o.is_empty() {
        return String::new();
    }
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let (kind, base) = match o.backoff {
        Some(Backoff::Fixed(d)) => ("f", Some(millis(d))),
        Some(Backoff::Exponential(d)) => ("e", Some(millis(d))),
        None => ("", None),
    };
    format!(
        "{}|{kind}|{}|{}|{}|{}|{}|{}",
        opt(o.tries.map(u64::from)),
        opt(base),
        opt(o.backoff_max.map(millis)),
        opt(o.jitter.map(u64::from)),
        opt(o.ttl.map(millis)),
        opt(o.unique.map(millis)),
        opt(o.rate.map(u64::from)),
    )
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Reads what [`encode_options`] wrote.
pub(super) fn decode_options(raw: &str) -> StoreResult<Lifecycle> {
    if raw.is_empty() {
        return Ok(Lifecycle::default());
    }
    let bad = || corrupt("options");
    let fields: Vec<&str> = raw.split('|').collect();
    let [tries, kind, base, max, jitter, ttl, unique, rate] = fields[..] else {
        return Err(bad());
    };
    fn num<T: std::str::FromStr>(s: &str) -> Result<Option<T>, ()> {
        if s.is_empty() {
            return Ok(None);
        }
        s.parse().map(Some).map_err(|_| ())
    }
    let ms = |s: &str| num::<u64>(s).map(|v| v.map(Duration::from_millis));
    let base = ms(base).map_err(|_| bad())?;
    Ok(Lifecycle {
        tries: num(tries).map_err(|_| bad())?,
        backoff: match (kind, base) {
            ("f", Some(b)) => Some(Backoff::Fixed(b)),
            ("e", Some(b)) => Some(Backoff::Exponential(b)),
            ("", None) => None,
            _ => return Err(bad()),
        },
        backoff_max: ms(max).map_err(|_| bad())?,
        jitter: num(jitter).map_err(|_| bad())?,
        ttl: ms(ttl).map_err(|_| bad())?,
        unique: ms(unique).map_err(|_| bad())?,
        rate: num(rate).map_err(|_| bad())?,
    })
}

/// `stats_job`'s reply: `{id, tube, state, pri, age, delay, ttr, time-left
/// (all ms), reserves, timeouts, releases, buries, kicks, options, tries,
/// dead}`, the last three for a job with options only.
pub(super) fn job_stats(mut v: Vec<Value>) -> StoreResult<JobStats> {
    let life = if v.len() == 16 {
        let dead = v.pop().expect("16 fields");
        let tries = v.pop().expect("16 fields");
        let options = v.pop().expect("16 fields");
        Some(LifeStats {
            options: decode_options(&parse::<String>(options)?)?,
            tries: parse(tries)?,
            dead: parse::<i64>(dead)? == 1,
        })
    } else {
        None
    };
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
    let state = job_state(state)?;
    Ok(JobStats {
        life,
        id: job_id(id)?,
        tube: tube(&parse::<String>(t)?)?,
        state,
        pri: parse(pri)?,
        age: ms(age)?,
        delay: ms(delay)?,
        ttr: ms(ttr)?,
        time_left: ms(left)?,
        counters: counters([reserves, timeouts, releases, buries, kicks])?,
    })
}

/// One job of `export`'s reply: `{id, tube, state, pri, when it was put
/// (ms since the epoch), delay, ttr,
/// time left, burial order, reserves, timeouts, releases, buries, kicks,
/// options, tries, dead, body}` (times in ms).
pub(super) fn whole_job(v: Value) -> StoreResult<WholeJob> {
    let Value::Array(v) = v else {
        return Err(corrupt("an exported job"));
    };
    let [
        id,
        t,
        state,
        pri,
        put_at,
        delay,
        ttr,
        left,
        order,
        reserves,
        timeouts,
        releases,
        buries,
        kicks,
        options,
        tries,
        dead,
        body,
    ] = <[Value; 18]>::try_from(v).map_err(|_| corrupt("an exported job"))?;
    let put_at = SystemTime::UNIX_EPOCH + ms(put_at)?;
    let Value::BulkString(body) = body else {
        return Err(corrupt("an exported job's body"));
    };
    Ok(WholeJob {
        id: job_id(id)?,
        tube: tube(&parse::<String>(t)?)?,
        state: job_state(state)?,
        pri: parse(pri)?,
        age: SystemTime::now().duration_since(put_at).unwrap_or_default(),
        put_at: Some(put_at),
        delay: ms(delay)?,
        time_left: ms(left)?,
        bury_order: parse(order)?,
        ttr: ms(ttr)?,
        counters: counters([reserves, timeouts, releases, buries, kicks])?,
        options: decode_options(&parse::<String>(options)?)?,
        tries: parse(tries)?,
        dead: parse::<i64>(dead)? == 1,
        body: Bytes::from(body),
    })
}

/// A job's counters as the scripts return them, in `JobCounters`' order.
fn counters([reserves, timeouts, releases, buries, kicks]: [Value; 5]) -> StoreResult<JobCounters> {
    Ok(JobCounters {
        reserves: parse(reserves)?,
        timeouts: parse(timeouts)?,
        releases: parse(releases)?,
        buries: parse(buries)?,
        kicks: parse(kicks)?,
    })
}

fn job_state(v: Value) -> StoreResult<JobState> {
    JobState::from_name(&parse::<String>(v)?).ok_or_else(|| corrupt("job state"))
}

/// `stats_tube`'s reply: `{urgent, ready, reserved, delayed, buried, total,
/// using, watching, cmd-delete, cmd-pause-tube, pause ms, pause ms left,
/// expired}`.
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
        expired,
    ] = <[u64; 13]>::try_from(v).map_err(|_| corrupt("stats-tube"))?;
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
        expired,
        using,
        watching,
        cmd_delete: deletes,
        cmd_pause_tube: pauses,
        pause: Duration::from_millis(pause),
        pause_time_left: Duration::from_millis(left),
    })
}

/// `stats`'s reply: `{urgent, ready, reserved, delayed, buried, timeouts,
/// total jobs, tubes, expired}`.
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
        expired,
    ] = <[u64; 9]>::try_from(v).map_err(|_| corrupt("stats"))?;
    Ok(StoreStats {
        counts: Counts {
            urgent,
            ready,
            reserved,
            delayed,
            buried,
        },
        job_timeouts: timeouts,
        expired,
        total_jobs: total,
        tubes,
        log: None,
    })
}
