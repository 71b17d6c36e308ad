//! The service's clock: times at the store's precision, so that what a client is told equals
//! what a later read returns.

use chrono::{DateTime, SubsecRound, Utc};

/// Now, at the store's precision (microseconds).
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}
