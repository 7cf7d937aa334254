//! Periodic jobs: a named schedule (a cron expression in a time zone, or a
//! fixed interval) and the job it puts at each of its moments.
//!
//! A schedule fires by putting an ordinary job whose client id is the
//! schedule's name and the moment (`nightly-report@2026-11-27T01:00:00Z`),
//! so every process that shares a store, and every restart, computes the
//! same id for the same moment, and the store's `EXISTS` makes the second
//! put of a moment a no-op. A firing keeps its id taken (a unique window)
//! until well after the next moment, so a moment whose job was already
//! finished is not put again either.
//!
//! Moments are wall-clock times in milliseconds since the Unix epoch. A fixed
//! interval's moments are its multiples since the epoch, so they do not
//! depend on when, or by which process, the schedule was registered.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::names::{MAX_NAME_LEN, Tube};

/// The most schedules a store keeps: each is looked at on every change, by
/// every process.
pub const MAX_SCHEDULES: usize = 1000;

/// The shortest interval between two moments of a schedule.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The longest fixed interval.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 86_400);

/// How far ahead a cron expression's next moment may be: one further away
/// (`0 0 30 2 *`, a February 30th) is taken to mean it never fires.
pub const MAX_CRON_WAIT: Duration = Duration::from_secs(5 * 366 * 86_400);

/// How long after its next moment a firing's id stays taken: a process
/// whose clock is behind by less than this cannot fire a moment twice.
pub const FIRED_MARGIN: Duration = Duration::from_secs(300);

/// The longest schedule name: its firings' ids (`name@` and a moment of up
/// to 24 characters) must be valid client ids.
pub const MAX_SCHEDULE_NAME: usize = MAX_NAME_LEN - 25;

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum When {
    /// Every so often, at the multiples of the interval since the epoch.
    Every(Duration),
    /// At the moments of a cron expression, read in a time zone.
    Cron {
        /// The expression as given.
        expr: Arc<str>,
        /// The time zone it is read in.
        zone: Tz,
        /// The parsed expression.
        cron: Box<Cron>,
    },
}

impl PartialEq for When {
    fn eq(&self, other: &When) -> bool {
        match (self, other) {
            (When::Every(a), When::Every(b)) => a == b,
            (
                When::Cron { expr, zone, .. },
                When::Cron {
                    expr: e, zone: z, ..
                },
            ) => expr == e && zone == z,
            _ => false,
        }
    }
}

/// Why a schedule was refused: one word for the reply.
pub type Refusal = &'static str;

impl When {
    /// A fixed interval: at least [`MIN_PERIOD`], at most [`MAX_INTERVAL`].
    pub fn every(period: Duration) -> Result<When, Refusal> {
        if period < MIN_PERIOD {
            return Err("too-often");
        }
        if period > MAX_INTERVAL {
            return Err("bad-interval");
        }
        Ok(When::Every(period))
    }

    /// A cron expression (five fields, or six with seconds first, or a
    /// nickname such as `@daily`) read in `zone` (an IANA name, or `UTC`);
    /// refused if it has no moment within [`MAX_CRON_WAIT`] of `now`.
    pub fn cron(zone: &str, expr: &str, now: u64) -> Result<When, Refusal> {
        let zone = Tz::from_str(zone).map_err(|_| "bad-zone")?;
        // The stores keep a schedule's fields on lines: a line break in
        // the expression (which the parser takes for a space) would split it.
        if expr.bytes().any(|b| b.is_ascii_control()) {
            return Err("bad-cron");
        }
        let cron = parse_cron(expr).ok_or("bad-cron")?;
        let when = When::Cron {
            expr: Arc::from(expr),
            zone,
            cron: Box::new(cron),
        };
        let limit = now.saturating_add(MAX_CRON_WAIT.as_millis() as u64);
        match when.next_after(now) {
            Some(next) if next <= limit => Ok(when),
            _ => Err("never-fires"),
        }
    }

    /// The first moment after `t` (ms since the epoch).
    pub fn next_after(&self, t: u64) -> Option<u64> {
        match self {
            When::Every(period) => {
                let p = period.as_millis() as u64;
                t.checked_div(p)?.checked_add(1)?.checked_mul(p)
            }
            When::Cron { zone, cron, .. } => {
                let at = zone.from_utc_datetime(&utc(t)?.naive_utc());
                let next = cron.find_next_occurrence(&at, false).ok()?;
                u64::try_from(next.timestamp_millis()).ok()
            }
        }
    }

    /// The last moment at or before `t`.
    pub fn latest_by(&self, t: u64) -> Option<u64> {
        match self {
            When::Every(period) => {
                let p = period.as_millis() as u64;
                Some(t.checked_div(p)? * p)
            }
            When::Cron { zone, cron, .. } => {
                let at = zone.from_utc_datetime(&utc(t)?.naive_utc());
                let prev = cron.find_previous_occurrence(&at, true).ok()?;
                u64::try_from(prev.timestamp_millis()).ok()
            }
        }
    }
}

/// Milliseconds since the epoch, by the wall clock: what moments are.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A cron expression of five fields, or six with seconds first (no year
/// field: a schedule is for ever).
fn parse_cron(expr: &str) -> Option<Cron> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(expr)
        .ok()
}

fn utc(ms: u64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
}

/// A moment as a firing's id shows it: UTC, to the second (and the
/// millisecond when it has one).
pub fn show_moment(ms: u64) -> String {
    match utc(ms) {
        Some(t) if ms.is_multiple_of(1000) => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => ms.to_string(),
    }
}

/// Whether `raw` may name a schedule: a tube name's characters, short
/// enough for its firings' ids.
pub fn valid_name(raw: &[u8]) -> bool {
    raw.len() <= MAX_SCHEDULE_NAME && Tube::parse(raw).is_some()
}

/// A named schedule and the job it puts.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Its name, unique in the store.
    pub name: Arc<str>,
    /// When it fires.
    pub when: When,
    /// Where its jobs go.
    pub tube: Tube,
    /// Their priority.
    pub pri: u32,
    /// Their time to run.
    pub ttr: Duration,
    /// Their body.
    pub body: Bytes,
    /// When it was registered (ms since the epoch): it fires for no
    /// moment before, nor for this one if it is a moment (the first is the
    /// one after, as `SCHEDULED` says).
    pub since: u64,
}

impl Schedule {
    /// The client id of the job it puts at `moment`.
    pub fn job_id(&self, moment: u64) -> Arc<str> {
        Arc::from(format!("{}@{}", self.name, show_moment(moment)))
    }

    /// The moment to fire for on catch-up at `now`: the last one at or
    /// before `now`, if it is not older than the schedule. It may have
    /// fired already; then its id is taken and the put changes nothing.
    pub fn missed(&self, now: u64) -> Option<u64> {
        // Strictly after: a schedule registered on a moment's very
        // millisecond was answered with the next moment as its first, and
        // then fired this one too (CI: `every 1s` registered at a whole
        // second).
        self.when.latest_by(now).filter(|&m| m > self.since)
    }

    /// How long a firing at `moment` keeps its id taken, from `now`: until
    /// [`FIRED_MARGIN`] after the next moment, when no process looks at
    /// this one any more.
    pub fn fired_window(&self, moment: u64, now: u64) -> Duration {
        let next = self.when.next_after(moment).unwrap_or(moment);
        let until = next.saturating_add(FIRED_MARGIN.as_millis() as u64);
        Duration::from_millis(until.saturating_sub(now).max(1))
    }

    /// The schedule as the stores keep it: fields on lines, the body last.
    pub fn encode(&self) -> Vec<u8> {
        let (every, zone, expr) = match &self.when {
            When::Every(p) => (p.as_millis().to_string(), "", ""),
            When::Cron { expr, zone, .. } => ("cron".to_string(), zone.name(), &**expr),
        };
        let mut out = format!(
            "1\n{}\n{}\n{}\n{}\n{}\n{every}\n{zone}\n{expr}\n",
            self.name,
            self.tube,
            self.pri,
            self.ttr.as_millis(),
            self.since
        )
        .into_bytes();
        out.extend_from_slice(&self.body);
        out
    }

    /// A schedule as [`Schedule::encode`] wrote it; `None` if it is not
    /// one that `schedule` could have made (an import's line is decoded
    /// here too, and may have been written by anyone). The body is a part
    /// of `raw`, not a copy: every listing of the schedules decodes them
    /// all, and holds them while its reply is sent.
    pub fn decode(raw: &Bytes) -> Option<Schedule> {
        let mut fields = raw.splitn(10, |&b| b == b'\n');
        let mut text = || std::str::from_utf8(fields.next()?).ok();
        if text()? != "1" {
            return None;
        }
        let name = text()?;
        if !valid_name(name.as_bytes()) {
            return None;
        }
        let tube = Tube::parse(text()?.as_bytes())?;
        let pri = text()?.parse().ok()?;
        let ttr_ms: u64 = text()?.parse().ok()?;
        if ttr_ms > u64::from(u32::MAX) * 1000 {
            return None;
        }
        let ttr = Duration::from_millis(ttr_ms);
        let since: u64 = text()?.parse().ok()?;
        utc(since)?;
        let every = text()?;
        let zone = text()?;
        let expr = text()?;
        let when = if every == "cron" {
            if expr.bytes().any(|b| b.is_ascii_control()) {
                return None;
            }
            When::Cron {
                expr: Arc::from(expr),
                zone: Tz::from_str(zone).ok()?,
                cron: Box::new(parse_cron(expr)?),
            }
        } else {
            When::every(Duration::from_millis(every.parse().ok()?)).ok()?
        };
        let body = raw.slice_ref(fields.next()?);
        Some(Schedule {
            name: Arc::from(name),
            when,
            tube,
            pri,
            ttr,
            body,
            since,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOV_26_0249: u64 = 1_795_661_340_000; // 2026-11-26T02:49:00Z

    fn at(s: &str) -> u64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis() as u64
    }

    #[test]
    fn intervals_fall_on_multiples_of_the_period() {
        let w = When::every(Duration::from_secs(30)).unwrap();
        assert_eq!(
            w.next_after(at("2026-11-26T02:49:07Z")),
            Some(at("2026-11-26T02:49:30Z"))
        );
        assert_eq!(
            w.next_after(at("2026-11-26T02:49:30Z")),
            Some(at("2026-11-26T02:50:00Z"))
        );
        assert_eq!(
            w.latest_by(at("2026-11-26T02:49:30Z")),
            Some(at("2026-11-26T02:49:30Z"))
        );
        assert_eq!(When::every(Duration::from_millis(1)), Err("too-often"));
        assert_eq!(When::every(Duration::from_millis(999)), Err("too-often"));
        assert_eq!(
            When::every(Duration::from_secs(400 * 86_400)),
            Err("bad-interval")
        );
    }

    #[test]
    fn cron_moments_follow_the_zone() {
        // 02:00 in Berlin is 01:00 UTC in winter.
        let w = When::cron("Europe/Berlin", "0 2 * * *", NOV_26_0249).unwrap();
        assert_eq!(w.next_after(NOV_26_0249), Some(at("2026-11-27T01:00:00Z")));
        assert_eq!(w.latest_by(NOV_26_0249), Some(at("2026-11-26T01:00:00Z")));
        let utc = When::cron("UTC", "*/10 * * * * *", NOV_26_0249).unwrap();
        assert_eq!(
            utc.next_after(NOV_26_0249),
            Some(at("2026-11-26T02:49:10Z"))
        );
        assert_eq!(
            When::cron("UTC", "@hourly", NOV_26_0249)
                .unwrap()
                .next_after(NOV_26_0249),
            Some(at("2026-11-26T03:00:00Z"))
        );
    }

    #[test]
    fn bad_cron_is_refused_with_a_reason() {
        // A line break would split the stored schedule (the parser reads
        // it as a space).
        for expr in ["* * * *\n*", "* * * * * *\n", "*\t* * * *"] {
            assert_eq!(
                When::cron("UTC", expr, NOV_26_0249),
                Err("bad-cron"),
                "{expr:?}"
            );
        }
        assert_eq!(
            When::cron("UTC", "0 0 30 2 *", NOV_26_0249).err(),
            Some("never-fires")
        );
        assert_eq!(
            When::cron("UTC", "61 * * * *", NOV_26_0249).err(),
            Some("bad-cron")
        );
        assert_eq!(When::cron("UTC", "x", NOV_26_0249).err(), Some("bad-cron"));
        assert_eq!(
            When::cron("Mars/Olympus", "* * * * *", NOV_26_0249).err(),
            Some("bad-zone")
        );
    }

    #[test]
    fn firings_are_named_by_moment_and_stay_taken_past_the_next() {
        let s = Schedule {
            name: Arc::from("heartbeat"),
            when: When::every(Duration::from_secs(30)).unwrap(),
            tube: Tube::parse(b"beats").unwrap(),
            pri: 5,
            ttr: Duration::from_secs(60),
            body: Bytes::from_static(b"a\nb\r\n"),
            since: at("2026-11-26T02:49:07Z"),
        };
        assert_eq!(
            &*s.job_id(at("2026-11-26T02:49:30Z")),
            "heartbeat@2026-11-26T02:49:30Z"
        );
        assert_eq!(s.missed(at("2026-11-26T02:49:20Z")), None);
        // Registered on a moment: its first is the next, so it never
        // fires for that one.
        let on_a_moment = Schedule {
            since: at("2026-11-26T02:49:30Z"),
            ..s.clone()
        };
        assert_eq!(
            on_a_moment.when.next_after(on_a_moment.since),
            Some(at("2026-11-26T02:50:00Z"))
        );
        assert_eq!(on_a_moment.missed(at("2026-11-26T02:49:30.200Z")), None);
        assert_eq!(
            on_a_moment.missed(at("2026-11-26T02:50:00Z")),
            Some(at("2026-11-26T02:50:00Z"))
        );
        assert_eq!(
            s.missed(at("2026-11-26T02:51:20Z")),
            Some(at("2026-11-26T02:51:00Z"))
        );
        let m = at("2026-11-26T02:49:30Z");
        assert_eq!(s.fired_window(m, m), Duration::from_secs(330));
        assert_eq!(Schedule::decode(&s.encode().into()), Some(s));
    }

    #[test]
    fn a_cron_schedule_survives_its_encoding() {
        let s = Schedule {
            name: Arc::from("nightly-report"),
            when: When::cron("Europe/Berlin", "0 2 * * MON-FRI", NOV_26_0249).unwrap(),
            tube: Tube::parse(b"reports").unwrap(),
            pri: 0,
            ttr: Duration::from_secs(600),
            body: Bytes::new(),
            since: NOV_26_0249,
        };
        let back = Schedule::decode(&s.encode().into()).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            back.when.next_after(NOV_26_0249),
            s.when.next_after(NOV_26_0249)
        );
        assert_eq!(Schedule::decode(&Bytes::from_static(b"2\nx")), None);
        assert_eq!(Schedule::decode(&Bytes::from_static(b"1\nx\n")), None);
    }
}
