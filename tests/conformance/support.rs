//! Constants shared by several conformance modules.

use std::time::Duration;

/// One second.
pub const SEC: Duration = Duration::from_secs(1);

/// A client-chosen job id used throughout.
pub const OID: &str = "order-close:4711";
