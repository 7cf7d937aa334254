//! The text form of a job's options and a tube's settings: `name=value`
//! words after a put's id or `tube-set`'s tube, and the same names and
//! values in JSON and in the YAML of `stats-job` and `tube-settings`.
//!
//! No job id or tube name has a `=`, so an option is never taken for one.

use std::fmt::Write;
use std::time::Duration;

use super::ClientError;
use crate::job::{Backoff, Lifecycle};
use crate::names::parse_u64;
use crate::rules::{MAX_OPTION_TIME, MAX_RATE, MAX_TRIES, MAX_TTL};

/// Parses `name=value` words into options; a word without `=`, an unknown
/// name, one given twice or a value out of range is `BAD_OPTION`.
pub fn parse(words: &[&[u8]]) -> Result<Lifecycle, ClientError> {
    let mut life = Lifecycle::default();
    for word in words {
        let at = memchr::memchr(b'=', word).ok_or(ClientError::BadOption)?;
        set(&mut life, &word[..at], &word[at + 1..])?;
    }
    Ok(life)
}

/// Sets one option from its text value; an option already set is refused.
pub fn set(life: &mut Lifecycle, name: &[u8], value: &[u8]) -> Result<(), ClientError> {
    let bad = ClientError::BadOption;
    match name {
        b"tries" if life.tries.is_none() => {
            let n = parse_u64(value).filter(|n| (1..=u64::from(MAX_TRIES)).contains(n));
            life.tries = Some(n.ok_or(bad)? as u32);
        }
        b"backoff" if life.backoff.is_none() => {
            life.backoff = Some(match value.strip_prefix(b"exp:") {
                Some(base) => Backoff::Exponential(duration(base).ok_or(bad)?),
                None => Backoff::Fixed(duration(value).ok_or(bad)?),
            });
        }
        b"backoff-max" if life.backoff_max.is_none() => {
            life.backoff_max = Some(duration(value).ok_or(bad)?);
        }
        b"ttl" if life.ttl.is_none() => {
            life.ttl = Some(duration_up_to(value, MAX_TTL).ok_or(bad)?);
        }
        b"rate" if life.rate.is_none() => {
            let n = parse_u64(value).filter(|n| (1..=u64::from(MAX_RATE)).contains(n));
            life.rate = Some(n.ok_or(bad)? as u32);
        }
        b"unique" if life.unique.is_none() => {
            life.unique = Some(duration_up_to(value, MAX_TTL).ok_or(bad)?);
        }
        b"jitter" if life.jitter.is_none() => {
            let n = parse_u64(value).filter(|&n| n <= 100).ok_or(bad)?;
            life.jitter = Some(n as u8);
        }
        _ => return Err(bad),
    }
    Ok(())
}

/// A duration: whole number and an optional unit (`ms`, `s`, `m`, `h`,
/// `d`; seconds without one), from 1 ms to [`MAX_OPTION_TIME`].
pub fn duration(raw: &[u8]) -> Option<Duration> {
    duration_up_to(raw, MAX_OPTION_TIME)
}

/// A duration as [`duration`] reads it, however long or short, zero
/// included (a schedule's interval, whose own bounds are checked where it
/// is made).
pub fn span(raw: &[u8]) -> Option<Duration> {
    let digits = raw.iter().take_while(|b| b.is_ascii_digit()).count();
    let n = parse_u64(&raw[..digits])?;
    let ms_per = match &raw[digits..] {
        b"ms" => 1,
        b"" | b"s" => 1_000,
        b"m" => 60_000,
        b"h" => 3_600_000,
        b"d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(ms_per)?))
}

/// A duration as [`duration`] reads it, from 1 ms to `max`.
fn duration_up_to(raw: &[u8], max: Duration) -> Option<Duration> {
    span(raw).filter(|d| !d.is_zero() && *d <= max)
}

/// A duration as `duration` reads it, in the largest unit that keeps it whole.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    for (per, unit) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ] {
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// A backoff as `set` reads it.
pub fn show_backoff(b: Backoff) -> String {
    match b {
        Backoff::Fixed(d) => show_duration(d),
        Backoff::Exponential(d) => format!("exp:{}", show_duration(d)),
    }
}

/// The options that are set, as the words of a `put` line
/// (`tries=5 backoff=exp:10s`), which [`parse_job`] reads back.
pub fn words(life: &Lifecycle) -> String {
    let mut words = Vec::new();
    if let Some(n) = life.tries {
        words.push(format!("tries={n}"));
    }
    if let Some(b) = life.backoff {
        words.push(format!("backoff={}", show_backoff(b)));
    }
    if let Some(d) = life.backoff_max {
        words.push(format!("backoff-max={}", show_duration(d)));
    }
    if let Some(j) = life.jitter {
        words.push(format!("jitter={j}"));
    }
    if let Some(d) = life.ttl {
        words.push(format!("ttl={}", show_duration(d)));
    }
    if let Some(d) = life.unique {
        words.push(format!("unique={}", show_duration(d)));
    }
    if let Some(n) = life.rate {
        words.push(format!("rate={n}"));
    }
    words.join(" ")
}

/// The options that are set, as `name: value` YAML lines (`tube-settings`).
pub fn yaml(life: &Lifecycle, out: &mut String) {
    // Writing into a String cannot fail.
    if let Some(n) = life.tries {
        let _ = writeln!(out, "tries: {n}");
    }
    if let Some(b) = life.backoff {
        let _ = writeln!(out, "backoff: {}", show_backoff(b));
    }
    if let Some(d) = life.backoff_max {
        let _ = writeln!(out, "backoff-max: {}", show_duration(d));
    }
    if let Some(j) = life.jitter {
        let _ = writeln!(out, "jitter: {j}");
    }
    if let Some(d) = life.ttl {
        let _ = writeln!(out, "ttl: {}", show_duration(d));
    }
    if let Some(d) = life.unique {
        let _ = writeln!(out, "unique: {}", show_duration(d));
    }
    if let Some(n) = life.rate {
        let _ = writeln!(out, "rate: {n}");
    }
}

/// A put's options: those of [`parse`] but `rate`, which is a tube's.
pub fn parse_job(words: &[&[u8]]) -> Result<Lifecycle, ClientError> {
    job_only(parse(words)?)
}

/// Refuses the options a job cannot have (`rate`, a tube's).
pub fn job_only(life: Lifecycle) -> Result<Lifecycle, ClientError> {
    match life.rate {
        Some(_) => Err(ClientError::BadOption),
        None => Ok(life),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(line: &str) -> Result<Lifecycle, ClientError> {
        let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        parse(&words)
    }

    #[test]
    fn options_read_and_show_back() {
        let life = opts("tries=5 backoff=exp:10s backoff-max=10m jitter=20 ttl=1d").unwrap();
        assert_eq!(life.tries, Some(5));
        assert_eq!(
            life.backoff,
            Some(Backoff::Exponential(Duration::from_secs(10)))
        );
        assert_eq!(life.backoff_max, Some(Duration::from_secs(600)));
        assert_eq!(life.jitter, Some(20));
        let mut y = String::new();
        yaml(&life, &mut y);
        assert_eq!(
            y,
            "tries: 5\nbackoff: exp:10s\nbackoff-max: 10m\njitter: 20\nttl: 1d\n"
        );
        assert_eq!(opts("ttl=365d").unwrap().ttl, Some(MAX_TTL));
        for (raw, ms) in [
            ("1", 1000),
            ("500ms", 500),
            ("2h", 7_200_000),
            ("30d", 2_592_000_000),
        ] {
            assert_eq!(
                duration(raw.as_bytes()),
                Some(Duration::from_millis(ms)),
                "{raw}"
            );
        }
        assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show_duration(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn bad_options_are_refused() {
        for line in [
            "tries=0",
            "tries=10001",
            "tries=1000000000000",
            "tries=x",
            "tries=",
            "backoff=0",
            "backoff=31d",
            "backoff=exp:",
            "backoff=1w",
            "backoff=-1",
            "backoff-max=0ms",
            "jitter=101",
            "ttl=0",
            "ttl=366d",
            "unique=0",
            "unique=366d",
            "rate=0",
            "rate=1000001",
            "colour=red",
            "tries=2 tries=3",
            "tries",
            "=5",
        ] {
            assert_eq!(opts(line), Err(ClientError::BadOption), "{line}");
        }
        assert_eq!(duration(b"99999999999999999999d"), None);
        assert_eq!(duration(b"18446744073709551615d"), None);
    }
}
