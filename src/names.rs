//! Job ids and tube names: the two kinds of name a client sends, and the
//! rules that make them safe to store, print and (later) embed in storage keys.

use std::fmt;
use std::sync::Arc;

/// Longest tube name or client-chosen job id, in bytes (beanstalkd's limit).
pub const MAX_NAME_LEN: usize = 200;

/// The largest server id an import may bring, 2^48 - 1: the twelve hex
/// digits the Redis engine keys its jobs by (a larger one would take a key
/// out of order there), so that an export goes into any engine. Every id a
/// server gives is below it unless an import brought one near it: a limit
/// lower than what servers give (it was 2^47 - 1) left the ids put after
/// such an import refused by the next import.
pub const MAX_IMPORTED_ID: u64 = (1 << 48) - 1;

/// A job's id: either a number the server assigned or a name the client chose.
///
/// A client-chosen name is never all digits, so the two kinds never collide and
/// a stock client that parses ids as integers keeps working with server ids.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobId {
    /// Assigned by the server, counting up from 1.
    Server(u64),
    /// Chosen by the client on `put`, such as `order-close:4711`.
    Client(Arc<str>),
}

impl JobId {
    /// Parses an id as it appears on the wire: digits are a server id, anything
    /// else must be a valid client id. `None` means the argument is malformed.
    pub fn parse(raw: &[u8]) -> Option<JobId> {
        if !raw.is_empty() && raw.iter().all(u8::is_ascii_digit) {
            return parse_u64(raw).map(JobId::Server);
        }
        client_id(raw).map(JobId::Client)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobId::Server(n) => write!(f, "{n}"),
            JobId::Client(name) => f.write_str(name),
        }
    }
}

/// Validates a client-chosen id: 1 to 200 bytes of letters, digits and
/// `-+/;.$_():@`, not starting with `-`, not all digits.
pub fn client_id(raw: &[u8]) -> Option<Arc<str>> {
    let ok = (1..=MAX_NAME_LEN).contains(&raw.len())
        && raw[0] != b'-'
        && raw
            .iter()
            .all(|&b| is_name_byte(b) || b == b':' || b == b'@')
        && !raw.iter().all(u8::is_ascii_digit);
    // The bytes were just checked to be ASCII, so `from_utf8` cannot fail.
    ok.then(|| std::str::from_utf8(raw).ok().map(Arc::from))?
}

/// A tube (a "topic" in the JSON protocol): a validated, cheaply cloned name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tube(Arc<str>);

impl Tube {
    /// The tube every connection uses and watches when it opens.
    pub fn default_tube() -> Tube {
        Tube(Arc::from("default"))
    }

    /// Validates a tube name with beanstalkd's rules: 1 to 200 bytes of letters,
    /// digits and `-+/;.$_()`, not starting with `-`.
    pub fn parse(raw: &[u8]) -> Option<Tube> {
        let ok = (1..=MAX_NAME_LEN).contains(&raw.len())
            && raw[0] != b'-'
            && raw.iter().all(|&b| is_name_byte(b));
        ok.then(|| std::str::from_utf8(raw).ok().map(|s| Tube(Arc::from(s))))?
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// A tube hashes and compares as its name, so maps keyed by tubes can be
// searched with a name read off the disk.
impl std::borrow::Borrow<str> for Tube {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tube {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-+/;.$_()".contains(&b)
}

/// Parses a non-empty run of ASCII digits; no sign, no spaces, no overflow.
pub fn parse_u64(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Like [`parse_u64`], for fields beanstalkd keeps in 32 bits.
pub fn parse_u32(raw: &[u8]) -> Option<u32> {
    parse_u64(raw).and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_both_kinds() {
        assert_eq!(JobId::parse(b"42"), Some(JobId::Server(42)));
        assert_eq!(
            JobId::parse(b"order-close:4711"),
            Some(JobId::Client(Arc::from("order-close:4711")))
        );
        assert_eq!(JobId::parse(b"-1"), None);
        assert_eq!(JobId::parse(b""), None);
        assert_eq!(JobId::parse(b"a b"), None);
        assert_eq!(JobId::parse(b"99999999999999999999999"), None);
        assert!(JobId::parse(&[b'a'; 200]).is_some());
        assert_eq!(JobId::parse(&[b'a'; 201]), None);
    }

    #[test]
    fn tube_rules() {
        assert!(Tube::parse(b"a-b+c/d;e.f$g_h(i)").is_some());
        assert!(Tube::parse(b"123").is_some());
        assert_eq!(Tube::parse(b"-a"), None);
        assert_eq!(Tube::parse(b"a:b"), None);
        assert_eq!(Tube::parse(&[b'a'; 201]), None);
        assert_eq!(Tube::parse(b"caf\xc3\xa9"), None);
    }

    #[test]
    fn numbers_are_strict() {
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_u64(b"18446744073709551616"), None);
    }
}
