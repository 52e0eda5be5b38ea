//! T4: bad input gets a typed error before any I/O; odd but valid input works
//! and maps to distinct store keys.

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Lease, LockError, LockName, OwnerToken, ReleaseOutcome};

use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// Valid names that trip naive encoders: path, glob, hash-tag and SQL
/// specials, dots, unicode, and near-collisions of each other.
fn odd_suffixes() -> Vec<String> {
    let mut names: Vec<String> = [
        "a/b",
        "a_b",
        "a%2Fb",
        "a%2fb",
        "a:b",
        "a.b",
        ".",
        "..",
        "../../escape",
        "/zookeeper/quota",
        "*",
        "?",
        "[ab]",
        "\\",
        "{tag}",
        "{",
        "}",
        "'; DROP TABLE x; --",
        "\"quoted\"",
        "a b",
        "tab\\t",
        "emoji 🔒",
        "\u{202e}rtl",
        "\u{fffd}",
        "\u{e000}private",
        "\u{fff0}",
        "zero\u{200b}width",
        "Ünïcode",
        "Unicode",
        "unicode",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("%".repeat(50));
    names.push("%25".repeat(16));
    names
}

/// Odd valid names are all accepted, each locks independently of the others
/// (the name-to-key mapping is injective), and the longest valid names work.
/// The names are held through a `Locker`, whose renewer keeps them while the
/// case works: a backend whose leases are its session's (ZooKeeper) holds a
/// lease only a session timeout without renewal, and this case holds some
/// forty names while another client probes each.
pub async fn odd_names_are_distinct_locks(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let locker = cx.locker(&a, cx.long_ttl());
    let mut names: Vec<LockName> = odd_suffixes().iter().map(|s| cx.name(s)).collect();
    // The longest valid names, whole (no prefix), ASCII and multi-byte.
    let tag = format!("{:08x}", rand::random::<u32>());
    for fill in ["x", "é", "/", "."] {
        let mut s = tag.clone();
        while s.len() + fill.len() <= LockName::MAX_BYTES {
            s.push_str(fill);
        }
        names.push(LockName::new(&s).map_err(|e| Failure::new(format!("suite bug: {e}")))?);
    }
    let mut guards = Vec::new();
    for name in &names {
        let guard = locker.try_acquire(name.clone()).await?.ok_or_else(|| {
            Failure::new(format!(
                "{name:?}: held already (two names share a store key, or the name was mangled)"
            ))
        })?;
        guards.push(guard);
    }
    for (name, guard) in names.iter().zip(&guards) {
        cx.must_be_held(&b, name, "a held it").await?;
        let holder = b.inspect(name).await?;
        ensure!(
            holder.map(|h| h.fence) == Some(guard.fencing_token()),
            "{name:?}: inspect does not show its holder"
        );
    }
    for (name, guard) in names.iter().zip(guards) {
        ensure!(
            guard.release().await? == ReleaseOutcome::Released,
            "{name:?}: release failed"
        );
    }
    Ok(Outcome::Passed)
}

/// Zero, too large and too small TTLs, and impossible waits, are typed
/// errors before any I/O; nothing is locked by them.
pub async fn invalid_ttls_and_waits_are_rejected(cx: &Ctx) -> CaseResult {
    let a = cx.client().await?;
    let caps = cx.caps().clone();
    let name = cx.name("bad-ttl");
    let mut bad = vec![
        Duration::ZERO,
        caps.max_ttl.saturating_add(Duration::from_secs(1)),
        Duration::MAX,
    ];
    if let Some(below) = caps.min_ttl.checked_sub(Duration::from_nanos(1))
        && !below.is_zero()
    {
        bad.push(below);
    }
    for ttl in bad {
        let outcome = a.try_acquire_for(&name, ttl).await;
        ensure!(
            matches!(outcome, Err(LockError::InvalidTtl { .. })),
            "TTL {ttl:?} should be InvalidTtl, got {outcome:?}"
        );
        let via_locker = cx.locker(&a, ttl).try_acquire(&name).await;
        ensure!(
            matches!(via_locker, Err(LockError::InvalidTtl { .. })),
            "Locker with TTL {ttl:?} should be InvalidTtl, got {via_locker:?}"
        );
    }
    ensure!(
        a.inspect(&name).await?.is_none(),
        "a rejected TTL must not lock anything"
    );
    let wait = cx
        .locker(&a, cx.long_ttl())
        .acquire_timeout(&name, Duration::MAX)
        .await;
    ensure!(
        matches!(wait, Err(LockError::InvalidTimeout { .. })),
        "an unbounded wait should be InvalidTimeout, got {wait:?}"
    );
    let renew = cx
        .locker(&a, cx.long_ttl())
        .renew_every(cx.long_ttl() * 2)
        .try_acquire(&name)
        .await;
    ensure!(
        matches!(renew, Err(LockError::InvalidConfig { .. })),
        "a renew interval above the TTL should be InvalidConfig, got {renew:?}"
    );
    ensure!(
        a.inspect(&name).await?.is_none(),
        "rejected settings must not lock anything"
    );
    Ok(Outcome::Passed)
}

/// Invalid names are `InvalidName` errors through the client layer.
pub async fn invalid_names_are_rejected(cx: &Ctx) -> CaseResult {
    let a = cx.client().await?;
    let locker = cx.locker(&a, cx.long_ttl());
    let long = "n".repeat(LockName::MAX_BYTES + 1);
    let huge = "h".repeat(1 << 20);
    for bad in [
        "",
        "nul\0",
        "line\nbreak",
        "del\u{7f}",
        "c1\u{9b}",
        long.as_str(),
        huge.as_str(),
    ] {
        let outcome = locker.try_acquire(bad).await;
        ensure!(
            matches!(outcome, Err(LockError::InvalidName { .. })),
            "name {:?} should be InvalidName, got {outcome:?}",
            bad.chars().take(20).collect::<String>()
        );
        if let Err(e) = outcome {
            ensure!(
                e.to_string().len() < 300,
                "the error message should stay short: {e}"
            );
        }
    }
    Ok(Outcome::Passed)
}

/// Leases for names never acquired, with foreign owners or made-up fences,
/// are refused with `NotHeld`, never a panic or another error.
pub async fn forged_leases_are_refused(cx: &Ctx) -> CaseResult {
    let a = cx.client().await?;
    let name = cx.name("never-acquired");
    for fence in [1, 2, u64::MAX / 2, u64::MAX] {
        let fence = lockcore::FencingToken::new(fence).expect("non-zero");
        let forged = Lease::new(
            name.clone(),
            OwnerToken::new(),
            fence,
            cx.caps().effective_ttl(cx.long_ttl())?,
            lockcore::backend::Moment::now(),
        );
        let renewed = a.renew(&forged).await;
        ensure!(
            matches!(renewed, Err(LockError::NotHeld { .. })),
            "renew of a forged lease (fence {fence}) should be NotHeld, got {renewed:?}"
        );
        let released = a.release(&forged).await?;
        ensure!(
            released == ReleaseOutcome::NotHeld,
            "release of a forged lease reported {released:?}"
        );
    }
    ensure!(
        a.inspect(&name).await?.is_none(),
        "forged leases must not create a lock"
    );
    Ok(Outcome::Passed)
}
