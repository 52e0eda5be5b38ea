//! Holder labels: stored with the lease and shown by `inspect`, never a
//! credential (who owns a lease is its owner token's business alone).

use std::time::Duration;

use lockcore::backend::LockBackendExt;
use lockcore::{Attempt, HolderLabel, LockError, ReleaseOutcome};

use crate::{CaseResult, Ctx, Failure, Outcome, ensure};

/// A label set with `Locker::label` comes back from `inspect` on another
/// client exactly as given: spaces, quotes, separators and non-ASCII, up to
/// the longest label allowed (128 bytes of two-byte characters). Permit
/// labels come back from `inspect_permits` the same way where the backend
/// has semaphores.
pub async fn labels_round_trip_through_inspect(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let labels = [
        HolderLabel::new("settlement worker 3 (eu-west/1) – «billing» ✓")?,
        HolderLabel::new(r#"quote " backslash \ percent %2F colon : semi ; star *"#)?,
        HolderLabel::new("é".repeat(HolderLabel::MAX_BYTES / 2))?,
    ];
    for (i, label) in labels.iter().enumerate() {
        let name = cx.name(&format!("labelled-{i}"));
        let locker = cx.locker(&a, cx.long_ttl()).label(label.clone());
        let guard = locker.acquire(&name).await?;
        let holder = b
            .inspect(&name)
            .await?
            .ok_or_else(|| Failure::new(format!("inspect saw no holder of held lock {name}")))?;
        ensure!(
            holder.fence == guard.fencing_token(),
            "inspect shows fence {}, the holder has {}",
            holder.fence,
            guard.fencing_token()
        );
        ensure!(
            holder.label.as_ref() == Some(label),
            "the lock was taken with label {label:?}, inspect from another client shows {:?}",
            holder.label
        );
        guard.release().await?;
    }
    if cx.caps().semaphores {
        let name = cx.name("labelled-permits");
        let label = &labels[0];
        let permits = cx
            .locker(&a, cx.long_ttl())
            .label(label.clone())
            .semaphore(&name, 2)?;
        let guard = permits
            .try_acquire()
            .await?
            .ok_or_else(|| Failure::new("a permit of a free semaphore was refused"))?;
        let holders = b.inspect_permits(&name).await?;
        ensure!(
            holders.len() == 1
                && holders[0].label.as_ref() == Some(label)
                && holders[0].slot == guard.slot(),
            "a permit taken with label {label:?} in slot {:?}: inspect_permits shows {holders:?}",
            guard.slot()
        );
        guard.release().await?;
    }
    Ok(Outcome::Passed)
}

/// Without `Locker::label`, leases carry this process's `hostname:pid`
/// (`HolderLabel::this_process()`), so an operator can find the holder.
pub async fn default_label_is_host_and_pid(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("default-label");
    let guard = cx.locker(&a, cx.long_ttl()).acquire(&name).await?;
    let holder = b
        .inspect(&name)
        .await?
        .ok_or_else(|| Failure::new("inspect saw no holder of a held lock"))?;
    let me = HolderLabel::this_process();
    ensure!(
        me.as_str().ends_with(&format!(":{}", std::process::id())),
        "this process's label {me} does not end with its pid"
    );
    ensure!(
        holder.label.as_ref() == Some(&me),
        "a lock taken with the default label shows {:?}, expected {me:?} (hostname:pid)",
        holder.label
    );
    guard.release().await?;
    Ok(Outcome::Passed)
}

/// A second client using the holder's very label is still someone else: it
/// cannot take the held lock (neither at once nor by waiting), and the lease
/// it held under that label before cannot release or renew the holder's.
pub async fn labels_never_decide_ownership(cx: &Ctx) -> CaseResult {
    let (a, b) = (cx.client().await?, cx.client().await?);
    let name = cx.name("same-label");
    let label = HolderLabel::new("the same label on two clients")?;
    let request = cx.request(&name, cx.long_ttl())?.with_label(label.clone());
    // `b` held the lock under the label once and let it go: a stale lease.
    let stale = match b.try_acquire(&request).await? {
        Attempt::Acquired(lease) => lease,
        Attempt::Held { .. } => return Err(Failure::new(format!("{name} is new but was held"))),
    };
    ensure!(
        b.release(&stale).await? == ReleaseOutcome::Released,
        "releasing a fresh lease must report Released"
    );
    let guard = cx
        .locker(&a, cx.long_ttl())
        .label(label.clone())
        .acquire(&name)
        .await?;
    let fence = guard.fencing_token();
    if let Attempt::Acquired(lease) = b.try_acquire(&request).await? {
        let _ = b.release(&lease).await;
        return Err(Failure::new(format!(
            "S1 violated: {name} (held, fence {fence}) was granted again (fence {}) to a client with the holder's label",
            lease.fence()
        )));
    }
    let waited = cx
        .locker(&b, cx.long_ttl())
        .label(label.clone())
        .acquire_timeout(&name, cx.scaled(Duration::from_millis(300)))
        .await;
    ensure!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "acquire under the holder's label must time out, got {waited:?}"
    );
    let released = b.release(&stale).await?;
    ensure!(
        released == ReleaseOutcome::NotHeld,
        "S2 violated: a stale lease under the holder's label released the holder's lock ({released:?})"
    );
    let renewed = b.renew(&stale).await;
    ensure!(
        matches!(renewed, Err(LockError::NotHeld { .. })),
        "S2 violated: a stale lease under the holder's label was renewed: {renewed:?}"
    );
    let holder = b.inspect(&name).await?;
    ensure!(
        holder.as_ref().map(|h| h.fence) == Some(fence)
            && holder
                .as_ref()
                .and_then(|h| h.owner)
                .is_none_or(|o| o == guard.lease().owner()),
        "the holder (fence {fence}) must still hold {name}, inspect shows {holder:?}"
    );
    ensure!(guard.is_held(), "the holder's guard must still be held");
    ensure!(
        guard.release().await? == ReleaseOutcome::Released,
        "the holder's own release must succeed"
    );
    Ok(Outcome::Passed)
}
