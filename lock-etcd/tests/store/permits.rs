//! Semaphores in etcd: slot keys, their fences and labels, the agreed
//! number of permits, and waiters woken by a slot's delete.

use std::time::Duration;

use lock_conformance::kit::stores::etcd;
use lock_etcd::etcd_client::GetOptions;
use lock_etcd::{EtcdBackend, EtcdConfig};
use lockcore::backend::LockBackendExt;
use lockcore::backend::LockRequest;
use lockcore::backend::wait::WaitPolicy;
use lockcore::{Attempt, HolderLabel, LockBackend, LockError, LockName, ReleaseOutcome};
use tokio::time::Instant;

use crate::support::*;

fn request(backend: &EtcdBackend, name: &LockName, label: &str) -> LockRequest {
    let ttl = backend
        .capabilities()
        .effective_ttl(Duration::from_secs(10))
        .unwrap();
    LockRequest::new(name.clone(), ttl).with_label(HolderLabel::new(label).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_keys_whose_create_revision_is_the_fence() {
    let url = etcd::shared().endpoint();
    let prefix = format!("permits-test-{:08x}/", rand_u32());
    let config = EtcdConfig::new([url.as_str()]).prefix(prefix.clone());
    let backend = EtcdBackend::connect_with(config.clone()).await.unwrap();
    let other = EtcdBackend::connect_with(config).await.unwrap();
    let mut raw = raw(&url).await;
    let pool = LockName::new("pool/a").unwrap();
    let take = |label: &str| {
        let request = request(&backend, &pool, label);
        let backend = backend.clone();
        async move { backend.try_acquire_permit(&request, 2).await.unwrap() }
    };
    let first = take("first").await.into_lease().expect("a free slot");
    let second = take("second").await.into_lease().expect("the other slot");
    assert!(
        matches!(take("third").await, Attempt::Held { .. }),
        "two permits"
    );
    assert_eq!((first.slot(), second.slot()), (Some(0), Some(1)));

    let base = format!("{prefix}/permits/pool%2Fa/");
    let count = raw.get(format!("{base}count"), None).await.unwrap();
    assert_eq!(count.kvs()[0].value_str().unwrap(), "2", "the agreed count");
    let slots = raw
        .get(
            format!("{base}slot/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let keys: Vec<_> = slots
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, [format!("{base}slot/0"), format!("{base}slot/1")]);
    for (kv, lease) in slots.kvs().iter().zip([&first, &second]) {
        assert_eq!(
            kv.create_revision() as u64,
            lease.fence().get(),
            "fence = create revision"
        );
        assert_ne!(kv.lease(), 0, "attached to the holder's session");
    }
    let holders = backend.inspect_permits(&pool).await.unwrap();
    let seen: Vec<_> = holders
        .iter()
        .map(|h| {
            (
                h.slot,
                h.fence,
                h.label.as_ref().map(|l| l.as_str().to_owned()),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Some(0), first.fence(), Some("first".to_owned())),
            (Some(1), second.fence(), Some("second".to_owned()))
        ]
    );
    // Locks and semaphores of one name are apart.
    assert!(backend.inspect(&pool).await.unwrap().is_none());

    // While permits are held, another count is refused; renewals keep the fence.
    let mismatch = other
        .try_acquire_permit(&request(&other, &pool, "x"), 3)
        .await;
    assert!(
        matches!(
            mismatch,
            Err(LockError::PermitsMismatch {
                requested: 3,
                existing: 2,
                ..
            })
        ),
        "{mismatch:?}"
    );
    let renewed = backend.renew(&first).await.unwrap();
    assert_eq!(
        (renewed.fence(), renewed.slot()),
        (first.fence(), first.slot())
    );

    // A slot taken again gets a larger fence; with none held, the count may change.
    assert_eq!(
        backend.release(&first).await.unwrap(),
        ReleaseOutcome::Released
    );
    let again = take("again").await.into_lease().expect("slot 0 is free");
    assert_eq!(again.slot(), Some(0));
    assert!(again.fence() > second.fence());
    backend.release(&again).await.unwrap();
    backend.release(&second).await.unwrap();
    let three = other
        .try_acquire_permit(&request(&other, &pool, "three"), 3)
        .await
        .unwrap()
        .into_lease()
        .expect("nobody holds a permit: the count may change");
    let count = raw.get(format!("{base}count"), None).await.unwrap();
    assert_eq!(count.kvs()[0].value_str().unwrap(), "3");
    other.release(&three).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_is_woken_by_the_release_not_its_recheck() {
    let url = etcd::shared().endpoint();
    let (holder, waiter) = (connect(&url).await, connect(&url).await);
    let pool = name("woken");
    let held = holder
        .try_acquire_permit(&request(&holder, &pool, "holder"), 1)
        .await
        .unwrap()
        .into_lease()
        .expect("free");
    let waiting = {
        let (waiter, request) = (waiter.clone(), request(&waiter, &pool, "waiter"));
        tokio::spawn(async move {
            // Re-checks every 60 s: only etcd's notification can be on time.
            let wait = WaitPolicy::new(Instant::now() + Duration::from_secs(60))
                .recheck(Duration::from_secs(60));
            waiter.acquire_permit(&request, 1, &wait).await
        })
    };
    tokio::time::sleep(scaled(Duration::from_millis(300))).await;
    assert!(
        !waiting.is_finished(),
        "granted while the only permit is held"
    );
    let released = Instant::now();
    holder.release(&held).await.unwrap();
    let lease = tokio::time::timeout(scaled(Duration::from_secs(5)), waiting)
        .await
        .expect("the waiter is granted on the release")
        .unwrap()
        .unwrap()
        .expect("granted");
    eprintln!(
        "permit handed over {:?} after the release",
        released.elapsed()
    );
    assert!(released.elapsed() < scaled(Duration::from_secs(2)));
    assert!(lease.fence() > held.fence());
    waiter.release(&lease).await.unwrap();
}

/// Listing a name's holders looks at each etcd lease once, however many
/// of them share it: three permits of one client (one session) cost one
/// `LeaseTimeToLive`, and each holder reports the time its session has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_on_one_session_cost_one_look_at_its_lease() {
    use lockcore::backend::Kind;
    let store = private_etcd().await;
    let backend = connect(&store.endpoint()).await;
    let pool = name("one-look");
    let mut held = Vec::new();
    for label in ["a", "b", "c"] {
        let attempt = backend
            .try_acquire_permit(&request(&backend, &pool, label), 3)
            .await
            .unwrap();
        held.push(attempt.into_lease().expect("a free permit"));
    }
    let before = handled(&metrics(&store).await, "LeaseTimeToLive");
    let holders = backend.holders(&pool, Kind::Semaphore).await.unwrap();
    let looks = handled(&metrics(&store).await, "LeaseTimeToLive") - before;
    assert_eq!(holders.len(), 3);
    assert!(
        holders.iter().all(|h| h.expires_in.is_some()),
        "{holders:?}"
    );
    assert_eq!(looks, 1.0, "looks at the session's lease");
    for lease in &held {
        backend.release(lease).await.unwrap();
    }
}
