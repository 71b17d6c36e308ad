//! [`Revoked`]: what ends what a request opened (its event streams, its `/acp` connection) when
//! the key it was made with is removed or its token expires. The auth layer (`auth.rs`) attaches
//! it to each request.

use tokio_util::sync::CancellationToken;

/// Cancelled when the key a request was made with is removed, or its token expires; `id` tells
/// the keys and tokens apart (the same for a key kept across reloads). Absent without keys.
#[derive(Clone)]
pub struct Revoked {
    pub id: u64,
    pub token: CancellationToken,
}

impl Revoked {
    /// A new one, with an id no other has in this process.
    pub fn fresh() -> Revoked {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Revoked {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            token: CancellationToken::new(),
        }
    }
}
