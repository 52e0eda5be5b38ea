//! Reader-writer locks over time: a cut-off writer's intent and a lost
//! reply hold the name no longer than TTL + slack, wake-ups, the readers
//! of one session let in together, and a kept read outliving its session.

use std::time::Duration;

use lock_conformance::kit::poll::{eventually, until};
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::scaled;
use lock_conformance::kit::stores::zookeeper;
use lockcore::backend::Kind;
use lockcore::{Access, Attempt, LockBackend};
use tokio::time::{Instant, timeout};

use super::{request, share, try_share};
use crate::support::{children, connect, locker, raw, round_trip, unique};

/// A waiting writer cut off from the servers (its process as good as
/// dead) keeps readers out only while its session lives: a reader is
/// granted within TTL + slack of the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_writers_intent_lapses_with_its_session() {
    let store = zookeeper::shared();
    let link = FaultProxy::start(store.addr()).await.unwrap();
    let writer = connect(store.endpoint_via(link.addr())).await.unwrap();
    let (holder, reader) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-dead-intent");
    let parent = holder.rw_lock_path(&name);
    let read = share(&holder, &name, Access::Read).await;
    let waiting = tokio::spawn({
        let writer = locker(&writer).rw_lock(&name).unwrap();
        async move { writer.write_timeout(Duration::from_secs(60)).await }
    });
    until(
        Duration::from_secs(5),
        "the writer's node queued",
        || async { children(&observer, &parent).await.len() == 2 },
    )
    .await;
    link.set(Mode::Blackhole);
    let cut = Instant::now();
    assert!(try_share(&reader, &name, Access::Read).await.is_none());
    let ttl = writer.session_timeout();
    let bound = ttl + reader.capabilities().expiry_slack + round_trip(&reader).await;
    let granted = locker(&reader)
        .rw_lock(&name)
        .unwrap()
        .read_timeout(bound)
        .await
        .expect("a reader within TTL + slack of the writer's cut");
    let lapsed = cut.elapsed();
    eprintln!("a cut-off writer's intent lapsed {lapsed:?} after the cut (bound {bound:?})");
    assert!(
        lapsed >= ttl.mul_f64(0.5),
        "the intent went before its session could have: {lapsed:?}"
    );
    granted.release().await.unwrap();
    holder.release(&read).await.unwrap();
    waiting.abort();
}

/// Every reply is lost from the start of a read's attempt: the attempt
/// gets no answer, and its node (whatever became of it) keeps a writer of
/// another client out no longer than TTL + slack; once the network heals,
/// the attempt's client gets definite answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_blocks_the_name_no_longer_than_a_ttl() {
    let store = zookeeper::shared();
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    let a = connect(store.endpoint_via(proxy.addr())).await.unwrap();
    let b = connect(store.endpoint()).await.unwrap();
    let name = unique("rw-lost-reply");
    let warm = share(&a, &name, Access::Read).await;
    a.release(&warm).await.unwrap();
    let ttl = a.session_timeout();
    let bound = ttl + b.capabilities().expiry_slack + round_trip(&b).await;

    proxy.set(Mode::DropDownstream);
    let cut = Instant::now();
    let blind = timeout(
        bound,
        a.try_acquire(&request(&a, &name, Access::Read, "blind")),
    )
    .await;
    assert!(
        !matches!(blind, Ok(Ok(_))),
        "an answer through a proxy that drops replies: {blind:?}"
    );
    let write = locker(&b)
        .rw_lock(&name)
        .unwrap()
        .write_timeout(bound.saturating_sub(cut.elapsed()))
        .await
        .expect("a writer within TTL + slack of the lost reply");
    assert!(write.fencing_token() > warm.fence());
    eprintln!("the name was free {:?} after the lost reply", cut.elapsed());

    proxy.set(Mode::Pass);
    let healed = scaled(Duration::from_secs(10));
    eventually(healed, "a definite refusal after healing", || async {
        match a
            .try_acquire(&request(&a, &name, Access::Read, "healed"))
            .await
        {
            Ok(Attempt::Held { .. }) => Some(()),
            Ok(Attempt::Acquired(lease)) => {
                panic!("a read granted fence {} beside a write", lease.fence())
            }
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("after healing: {e}"),
        }
    })
    .await;
    write.release().await.unwrap();
}

/// `watch(name, ReadWrite)` stays pending while the holders stay, and
/// completes within a round trip of a release; on a free name it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_wakes_when_a_share_goes() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let name = unique("rw-watch");
    let free = b.watch(&name, Kind::ReadWrite).await.unwrap().unwrap();
    timeout(Duration::from_secs(1), free)
        .await
        .expect("ready on a free name");
    let read = share(&a, &name, Access::Read).await;
    let mut woken = b.watch(&name, Kind::ReadWrite).await.unwrap().unwrap();
    assert!(
        timeout(scaled(Duration::from_millis(300)), &mut woken)
            .await
            .is_err()
    );
    a.release(&read).await.unwrap();
    timeout(round_trip(&b).await, woken)
        .await
        .expect("woken by the release");
}

/// Readers of one session queued behind another session's writer share the
/// session's view of the queue: once the writer releases, they all hold at
/// once, while a writer of their session queued after them still waits;
/// it holds once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_readers_behind_a_writer_are_let_in_together() {
    const READERS: usize = 5;
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-local-readers");
    let parent = a.rw_lock_path(&name);
    let write = share(&b, &name, Access::Write).await;
    let lock = locker(&a).rw_lock(&name).unwrap();
    let mut readers = Vec::new();
    for i in 0..READERS {
        let lock = lock.clone();
        readers.push(tokio::spawn(async move { lock.read().await }));
        until(Duration::from_secs(5), "the reader queued", || async {
            children(&observer, &parent).await.len() == i + 2
        })
        .await;
    }
    let writer = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().await }
    });
    until(
        Duration::from_secs(5),
        "the local writer queued",
        || async { children(&observer, &parent).await.len() == READERS + 2 },
    )
    .await;
    let released = Instant::now();
    b.release(&write).await.unwrap();
    let mut reads = Vec::new();
    for reader in readers {
        reads.push(reader.await.unwrap().unwrap());
    }
    eprintln!(
        "{READERS} local readers in {:?} after the release",
        released.elapsed()
    );
    let holders = b.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), READERS);
    assert!(holders.iter().all(|h| h.access == Some(Access::Read)));
    assert!(!writer.is_finished(), "the writer went in beside readers");
    let last_read = reads.iter().map(|r| r.fencing_token()).max().unwrap();
    for read in reads {
        read.release().await.unwrap();
    }
    let write = timeout(scaled(Duration::from_secs(5)), writer)
        .await
        .expect("the writer once the readers are gone")
        .unwrap()
        .unwrap();
    assert!(write.fencing_token() > last_read);
    write.release().await.unwrap();
}

/// A read kept by `set_remaining` outlives its client's session as a TTL
/// node in its place: a writer waits for the remaining time, then is
/// granted with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_read_outlives_its_session() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-kept");
    let parent = a.rw_lock_path(&name);
    let read = share(&a, &name, Access::Read).await;
    let caps = a.capabilities();
    let remaining = caps
        .effective_remaining(scaled(Duration::from_secs(1)))
        .unwrap();
    let sent = Instant::now();
    let kept = a.set_remaining(&read, remaining).await.unwrap();
    assert!(kept.same_grant(&read) && kept.access() == Some(Access::Read));
    a.close().await.unwrap();
    let node = children(&observer, &parent)
        .await
        .pop()
        .expect("the kept read");
    let (_, stat) = observer
        .get_data(&format!("{parent}/{node}"))
        .await
        .unwrap();
    assert_eq!(stat.ephemeral_owner, 0, "a TTL node, no session's");
    let holders = b.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(
        holders
            .iter()
            .map(|h| (h.access, h.fence))
            .collect::<Vec<_>>(),
        vec![(Some(Access::Read), read.fence())]
    );
    let bound = remaining.get() + caps.expiry_slack + round_trip(&b).await;
    let write = locker(&b)
        .rw_lock(&name)
        .unwrap()
        .write_timeout(bound)
        .await
        .expect("the writer once the kept read ran out");
    assert!(
        sent.elapsed() >= remaining.get(),
        "granted before the kept time ran out"
    );
    assert!(write.fencing_token() > read.fence());
    write.release().await.unwrap();
}
