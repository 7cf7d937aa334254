//! Access tokens (`--tokens FILE`, off by default): the token file, the
//! grant each token carries (its roles and an optional tube prefix), and
//! the constant-time check of a presented token.
//!
//! What each command needs of a grant is the protocol's business
//! (`protocol/access.rs`); this module knows nothing of commands.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use subtle::ConstantTimeEq;

/// A role a token can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Puts jobs.
    Producer,
    /// Reserves jobs and finishes, releases, buries or touches them.
    Worker,
    /// Everything, including kicking, pausing and other clients' jobs.
    Admin,
}

impl Role {
    fn parse(word: &str) -> Option<Role> {
        match word {
            "producer" => Some(Role::Producer),
            "worker" => Some(Role::Worker),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    fn bit(self) -> u8 {
        match self {
            Role::Producer => 1,
            Role::Worker => 2,
            Role::Admin => 4,
        }
    }
}

/// What one token may do: its roles, and the tubes it may name or touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    roles: u8,
    prefix: Option<Arc<str>>,
}

impl Grant {
    /// A grant of `roles`, limited to tubes starting with `prefix` if given.
    pub fn new(roles: &[Role], prefix: Option<&str>) -> Grant {
        Grant {
            roles: roles.iter().fold(0, |all, r| all | r.bit()),
            prefix: prefix.map(Arc::from),
        }
    }

    /// Whether the grant has `role`; an admin has every role.
    pub fn has(&self, role: Role) -> bool {
        self.roles & (role.bit() | Role::Admin.bit()) != 0
    }

    /// The tube prefix the grant is limited to, if any.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// Whether the grant may name or touch the tube called `tube`.
    pub fn may_touch(&self, tube: &str) -> bool {
        self.prefix.as_deref().is_none_or(|p| tube.starts_with(p))
    }
}

/// Where a session stands with the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Tokens are off: everything is allowed, as in beanstalkd.
    Open,
    /// Tokens are on and the client has not authenticated (or its last
    /// attempt failed).
    Anonymous,
    /// Authenticated with a token that grants this.
    Granted(Grant),
}

/// The tokens of a token file.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(Box<[u8]>, Grant)>,
}

// By hand, so that no log or panic message ever prints a token.
impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokens({} configured)", self.entries.len())
    }
}

impl Tokens {
    /// Reads a token file; an error names the file and the bad line.
    pub fn load(path: &std::path::Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--tokens {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("--tokens {}: {e}", path.display()))
    }

    /// Parses a token file: one `TOKEN ROLE[,ROLE...] [PREFIX]` a line,
    /// blank lines and lines starting with `#` ignored.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries: Vec<(Box<[u8]>, Grant)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("line {}: {why}", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            let (token, roles, prefix) = match words[..] {
                [token, roles] => (token, roles, None),
                [token, roles, prefix] => (token, roles, Some(prefix)),
                _ => return Err(bad("expected TOKEN ROLE[,ROLE...] [PREFIX]")),
            };
            let roles = roles
                .split(',')
                .map(|r| Role::parse(r).ok_or_else(|| bad(&format!("unknown role `{r}`"))))
                .collect::<Result<Vec<_>, _>>()?;
            if entries.iter().any(|(t, _)| **t == *token.as_bytes()) {
                return Err(bad("this token is already on an earlier line"));
            }
            entries.push((token.as_bytes().into(), Grant::new(&roles, prefix)));
        }
        if entries.is_empty() {
            return Err("no tokens in the file".into());
        }
        Ok(Tokens { entries })
    }

    /// The grant of `presented`, if it is a configured token.
    ///
    /// Every configured token is compared, each in constant time, so how
    /// long the check takes says nothing of how close a guess came or which
    /// token it resembled.
    pub fn check(&self, presented: &[u8]) -> Option<Grant> {
        let mut found = None;
        for (token, grant) in &self.entries {
            if same(token, presented) {
                found = Some(grant.clone());
            }
        }
        found
    }
}

/// Whether `a` and `b` are equal, taking the same time whichever bytes
/// differ (only the lengths are not hidden).
fn same(a: &[u8], b: &[u8]) -> bool {
    // subtle's comparison looks at every byte whatever the first
    // difference (only the lengths are compared at once).
    a.ct_eq(b).into()
}

/// How long a failed attempt waits before it is answered: 100 ms after the
/// first of a run of failures, doubling with each further one, up to 1 s.
pub fn failure_delay(failures: u32) -> Duration {
    let ms = 100u64 << failures.saturating_sub(1).min(4);
    Duration::from_millis(ms.min(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_parses_and_checks() {
        let tokens =
            Tokens::parse("# the team tokens\n\nsecret-a producer,worker team-a/\nroot admin\n")
                .unwrap();
        let a = tokens.check(b"secret-a").unwrap();
        assert!(a.has(Role::Producer) && a.has(Role::Worker) && !a.has(Role::Admin));
        assert!(a.may_touch("team-a/x") && !a.may_touch("team-b/x"));
        let root = tokens.check(b"root").unwrap();
        assert!(root.has(Role::Worker) && root.may_touch("anything"));
        assert_eq!(tokens.check(b"secret"), None);
        assert_eq!(tokens.check(b"secret-ab"), None);
        assert_eq!(tokens.check(b""), None);
        assert!(!format!("{tokens:?}").contains("secret"));
    }

    #[test]
    fn bad_token_files_say_where() {
        assert!(Tokens::parse("").is_err());
        assert!(Tokens::parse("t boss").unwrap_err().contains("line 1"));
        assert!(Tokens::parse("t\n").is_err());
        assert!(Tokens::parse("t admin p extra").is_err());
        assert!(
            Tokens::parse("t admin\nt worker")
                .unwrap_err()
                .contains("line 2")
        );
    }

    #[test]
    fn failures_wait_longer_and_longer() {
        assert_eq!(failure_delay(1), Duration::from_millis(100));
        assert_eq!(failure_delay(2), Duration::from_millis(200));
        assert_eq!(failure_delay(4), Duration::from_millis(800));
        assert_eq!(failure_delay(50), Duration::from_millis(1000));
    }
}
