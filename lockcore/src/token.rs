//! Owner tokens (who holds a lease) and fencing tokens (which grant it is).

use std::fmt;

use uuid::Uuid;

/// 128 random bits identifying one acquisition; stores compare it before
/// renewing or releasing.
///
/// `Display` and `Debug` show only the first 8 hex digits so a token never
/// ends up whole in a log; backends store [`OwnerToken::encode`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(Uuid);

impl OwnerToken {
    /// A fresh random (UUID v4) token, from the thread's cryptographically
    /// secure generator (seeded from the OS once, not a system call per
    /// token).
    #[allow(clippy::new_without_default)] // a default token would be a shared secret
    pub fn new() -> Self {
        OwnerToken(uuid::Builder::from_random_bytes(rand::random()).into_uuid())
    }

    /// Wraps an existing UUID (for backends decoding stored values).
    pub fn from_uuid(uuid: Uuid) -> Self {
        OwnerToken(uuid)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The full token as 32 lowercase hex digits: what backends store.
    pub fn encode(&self) -> String {
        self.0.simple().to_string()
    }

    /// Parses what [`encode`](Self::encode) produced (any UUID form is accepted).
    pub fn decode(s: &str) -> Option<Self> {
        Uuid::parse_str(s).ok().map(OwnerToken)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let simple = self.0.simple().to_string();
        write!(f, "{}…", &simple[..8])
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

/// A number that grows with every grant of a lock name and never goes back.
///
/// Pass it to the protected resource with every write; the resource refuses
/// writes carrying a token older than the newest it has seen. That is what
/// makes a paused or partitioned former holder harmless.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FencingToken(u64);

impl FencingToken {
    /// `None` for 0: fencing tokens start at 1.
    pub fn new(value: u64) -> Option<Self> {
        (value > 0).then_some(FencingToken(value))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A token read from a store (a counter, a revision, a zxid), which must
    /// be positive.
    ///
    /// # Errors
    /// [`LockError::Store`](crate::LockError::Store) for zero or a negative
    /// value: the store did not hold what the backend wrote.
    pub fn from_store(backend: &'static str, value: i64) -> Result<Self, crate::LockError> {
        u64::try_from(value)
            .ok()
            .and_then(FencingToken::new)
            .ok_or_else(|| {
                crate::LockError::store(
                    backend,
                    format!("the store returned fencing token {value}, which is not positive"),
                )
            })
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_token_round_trips_and_never_prints_whole() {
        let t = OwnerToken::new();
        assert_eq!(t.as_uuid().get_version_num(), 4);
        let full = t.encode();
        assert_eq!(full.len(), 32);
        assert_eq!(OwnerToken::decode(&full), Some(t));
        assert!(!format!("{t} {t:?}").contains(&full));
        assert_ne!(OwnerToken::new(), t);
    }

    #[test]
    fn fencing_tokens_start_at_one_and_order() {
        assert!(FencingToken::new(0).is_none());
        assert!(FencingToken::new(1) < FencingToken::new(2));
        assert_eq!(FencingToken::new(7).unwrap().to_string(), "7");
    }
}
