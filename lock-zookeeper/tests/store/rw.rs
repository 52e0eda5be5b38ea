//! Reader-writer locks on the wire: Curator's read and write nodes under a
//! parent of their own, a waiting writer's node as its intent (gone with
//! its wait), fences taken at the grant (above a raised floor too), and
//! nodes of another recipe counted by the rules. Over time (`lapses`): a
//! cut-off writer's intent and lost replies, wake-ups, local readers
//! sharing one view, and kept shares.

mod lapses;

use std::time::Duration;

use lock_conformance::kit::poll::until;
use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{ZooKeeperBackend, zk};
use lockcore::backend::{Kind, LockRequest};
use lockcore::{
    Access, FencingToken, HolderLabel, Lease, LockBackend, LockError, LockName, ReleaseOutcome,
};
use uuid::Uuid;

use crate::support::{children, connect, connect_with, locker, raw, session_id, take, unique};

/// A request for `access` of the reader-writer lock `name`, labelled.
pub(super) fn request(
    backend: &ZooKeeperBackend,
    name: &LockName,
    access: Access,
    label: &str,
) -> LockRequest {
    let ttl = backend
        .capabilities()
        .effective_ttl(backend.session_timeout())
        .unwrap();
    LockRequest::new(name.clone(), ttl)
        .with_label(HolderLabel::new(label).unwrap())
        .with_access(access)
}

/// One attempt at `access` of `name`, no waiting.
pub(super) async fn try_share(
    backend: &ZooKeeperBackend,
    name: &LockName,
    access: Access,
) -> Option<Lease> {
    let asked = request(backend, name, access, &format!("{access}er"));
    backend.try_acquire(&asked).await.unwrap().into_lease()
}

/// `access` of `name`, which must be granted at once.
pub(super) async fn share(backend: &ZooKeeperBackend, name: &LockName, access: Access) -> Lease {
    try_share(backend, name, access)
        .await
        .unwrap_or_else(|| panic!("the {access} of {name} was expected to be granted"))
}

/// The `czxid` of node `name` under `parent`.
async fn czxid(observer: &zk::Client, parent: &str, name: &str) -> i64 {
    let (_, stat) = observer
        .get_data(&format!("{parent}/{name}"))
        .await
        .unwrap();
    stat.czxid
}

/// The node of `lease` under `parent` (by its owner's uuid).
async fn node_of(observer: &zk::Client, parent: &str, lease: &Lease) -> String {
    let owner = lease.owner().as_uuid().hyphenated().to_string();
    (children(observer, parent).await.into_iter())
        .find(|n| n.contains(&owner))
        .unwrap_or_else(|| panic!("no node of {owner} under {parent}"))
}

/// Reads and writes are Curator's `__READ__` and `__WRIT__` nodes, in a
/// parent under `<root>/%rw` apart from the lock of the same name; each
/// holds its label, and its `czxid` is its grant's fence, which `holders`
/// shows with its access. A share renews and releases once; a refused
/// `try_acquire` leaves no node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_writes_are_curators_nodes_in_a_parent_of_their_own() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-layout");
    let parent = a.rw_lock_path(&name);
    let segment = a.lock_path(&name).rsplit('/').next().unwrap().to_owned();
    assert_eq!(parent, format!("{}/%rw/{segment}", a.config().root_path()));
    let lock = take(&a, &name).await;
    let reads = [
        share(&a, &name, Access::Read).await,
        share(&b, &name, Access::Read).await,
    ];
    for (read, backend) in reads.iter().zip([&a, &b]) {
        assert_eq!(read.access(), Some(Access::Read));
        let node = node_of(&observer, &parent, read).await;
        let owner = read.owner().as_uuid().hyphenated().to_string();
        assert!(node.starts_with(&format!("_c_{owner}-__READ__")), "{node}");
        let (data, stat) = observer
            .get_data(&format!("{parent}/{node}"))
            .await
            .unwrap();
        assert_eq!(data, b"reader");
        assert_eq!(stat.czxid as u64, read.fence().get(), "fence = czxid");
        assert_eq!(stat.ephemeral_owner, session_id(backend));
    }
    let mut holders = b.holders(&name, Kind::ReadWrite).await.unwrap();
    holders.sort_by_key(|h| h.fence);
    let seen: Vec<_> = holders
        .iter()
        .map(|h| (h.access, h.fence, h.owner))
        .collect();
    let mut want: Vec<_> = (reads.iter())
        .map(|r| (Some(Access::Read), r.fence(), Some(r.owner())))
        .collect();
    want.sort_by_key(|(_, fence, _)| *fence);
    assert_eq!(seen, want);
    assert!(
        holders
            .iter()
            .all(|h| h.label.as_ref().map(|l| l.as_str()) == Some("reader"))
    );
    assert!(try_share(&b, &name, Access::Write).await.is_none());
    assert_eq!(
        children(&observer, &parent).await.len(),
        2,
        "the refused write left a node"
    );

    let renewed = a.renew(&reads[0]).await.unwrap();
    assert_eq!(
        (renewed.fence(), renewed.access()),
        (reads[0].fence(), Some(Access::Read))
    );
    for (read, backend) in reads.iter().zip([&a, &b]) {
        assert_eq!(
            backend.release(read).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(
            backend.release(read).await.unwrap(),
            ReleaseOutcome::NotHeld
        );
        assert!(matches!(
            backend.renew(read).await,
            Err(LockError::NotHeld { .. })
        ));
    }
    let write = share(&b, &name, Access::Write).await;
    let node = node_of(&observer, &parent, &write).await;
    assert!(node.contains("-__WRIT__"), "{node}");
    assert_eq!(
        czxid(&observer, &parent, &node).await as u64,
        write.fence().get()
    );
    assert!(reads.iter().all(|r| write.fence() > r.fence()));
    let holders = a.holders(&name, Kind::ReadWrite).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].access, holders[0].fence),
        (Some(Access::Write), write.fence())
    );
    assert!(try_share(&a, &name, Access::Read).await.is_none());
    assert_eq!(
        children(&observer, &parent).await,
        vec![node],
        "the refused read left a node"
    );
    // The lock of the same name is another thing.
    let held = a.holders(&name, Kind::Lock).await.unwrap();
    assert_eq!(
        held.iter().map(|h| h.fence).collect::<Vec<_>>(),
        vec![lock.fence()]
    );
    b.release(&write).await.unwrap();
    a.release(&lock).await.unwrap();
    assert!(children(&observer, &parent).await.is_empty());
}

/// A writer that waits has its `__WRIT__` node in the queue: that is its
/// intent, and readers are refused while it is there. It goes when the
/// wait times out or its future is dropped, and readers are granted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_node_is_its_intent_and_goes_with_its_wait() {
    let store = zookeeper::shared();
    let (a, b, c) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-intent");
    let parent = a.rw_lock_path(&name);
    let read = share(&a, &name, Access::Read).await;
    let writer = locker(&b).rw_lock(&name).unwrap();
    let intent =
        || async { (children(&observer, &parent).await.iter()).any(|n| n.contains("-__WRIT__")) };

    let timed_out = writer.write_timeout(Duration::from_millis(300)).await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    until(
        Duration::from_secs(2),
        "the timed-out writer's node gone",
        || async { !intent().await },
    )
    .await;
    let next = share(&c, &name, Access::Read).await;
    c.release(&next).await.unwrap();

    let waiting = tokio::spawn({
        let writer = writer.clone();
        async move { writer.write().await }
    });
    until(Duration::from_secs(5), "the writer's node queued", intent).await;
    assert!(
        try_share(&c, &name, Access::Read).await.is_none(),
        "a read beside a waiting writer"
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    until(
        Duration::from_secs(2),
        "the dropped writer's node gone",
        || async { !intent().await },
    )
    .await;
    let next = share(&c, &name, Access::Read).await;
    assert_eq!(
        children(&observer, &parent).await.len(),
        2,
        "two readers' nodes only"
    );
    c.release(&next).await.unwrap();
    a.release(&read).await.unwrap();
}

/// A read's fence is taken when it is granted, not when it queued: two
/// readers queued behind a writer, granted once it releases, have fences
/// above the writer's and above both their creates, each the `czxid` of
/// its node as granted (created again in place, keeping its name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reads_fence_is_taken_at_its_grant() {
    let store = zookeeper::shared();
    let (w, r1, r2) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-fence-at-grant");
    let parent = w.rw_lock_path(&name);
    let write = share(&w, &name, Access::Write).await;
    let mut readers = Vec::new();
    for (i, backend) in [&r1, &r2].into_iter().enumerate() {
        let lock = locker(backend).rw_lock(&name).unwrap();
        readers.push(tokio::spawn(async move { lock.read().await }));
        until(Duration::from_secs(5), "the reader queued", || async {
            children(&observer, &parent).await.len() == i + 2
        })
        .await;
    }
    let mut queued = children(&observer, &parent).await;
    queued.sort();
    let mut created = Vec::new();
    for node in &queued {
        created.push(czxid(&observer, &parent, node).await);
    }
    w.release(&write).await.unwrap();
    let mut reads = Vec::new();
    for reader in readers {
        reads.push(reader.await.unwrap().unwrap());
    }
    let mut now = children(&observer, &parent).await;
    now.sort();
    let queued_reads: Vec<_> = queued.iter().filter(|n| n.contains("__READ__")).collect();
    assert_eq!(
        now.iter().collect::<Vec<_>>(),
        queued_reads,
        "the nodes kept their names"
    );
    let latest_create = created.iter().max().copied().unwrap();
    for read in &reads {
        let node = now
            .iter()
            .find(|n| n.contains(&read.lease().owner().as_uuid().hyphenated().to_string()))
            .unwrap();
        let fence = read.fencing_token().get();
        assert_eq!(fence, czxid(&observer, &parent, node).await as u64);
        assert!(fence > write.fence().get());
        assert!(
            fence as i64 > latest_create,
            "fence {fence} from before the grant"
        );
    }
    assert_ne!(reads[0].fencing_token(), reads[1].fencing_token());
    for read in reads {
        read.release().await.unwrap();
    }
}

/// Under a lock root of its own on the shared server: once the fence floor
/// is raised, every grant of a reader-writer lock is above it, a read
/// queued before the raise included (its fence is taken at the grant, so
/// it keeps its place), and the node carries the offset it was granted with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_above_a_raised_fence_floor() {
    let store = zookeeper::shared();
    let root = format!("/zk-tests-rw-floor-{}", Uuid::new_v4().simple());
    let private = |c: lock_zookeeper::ZooKeeperConfig| c.root(root.clone());
    let (a, b) = (
        connect_with(&store.endpoint(), private).await.unwrap(),
        connect_with(&store.endpoint(), private).await.unwrap(),
    );
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-floor");
    let parent = a.rw_lock_path(&name);
    let earlier = share(&a, &name, Access::Write).await;
    let waiting = tokio::spawn({
        let lock = locker(&b).rw_lock(&name).unwrap();
        async move { lock.read().await }
    });
    until(Duration::from_secs(5), "the reader queued", || async {
        children(&observer, &parent).await.len() == 2
    })
    .await;
    let floor = FencingToken::new(earlier.fence().get() + 1_000_000_000).unwrap();
    a.raise_fence_floor(floor).await.unwrap();
    a.release(&earlier).await.unwrap();
    let read = waiting.await.unwrap().unwrap();
    assert!(
        read.fencing_token() > floor,
        "{} under the floor {floor}",
        read.fencing_token()
    );
    let node = node_of(&observer, &parent, &read.lease()).await;
    let (data, _) = observer
        .get_data(&format!("{parent}/{node}"))
        .await
        .unwrap();
    let data = String::from_utf8(data).unwrap();
    assert!(data.contains("\nfence-offset="), "{data:?}");
    read.release().await.unwrap();
    let mut last = floor;
    for access in [Access::Write, Access::Read] {
        let lease = share(&a, &name, access).await;
        assert!(
            lease.fence() > last,
            "{access} granted {} after {last}",
            lease.fence()
        );
        last = lease.fence();
        a.release(&lease).await.unwrap();
    }
}

/// A node of another recipe in the queue (a Curator client's write or read:
/// no label of ours) counts by the same rules: its write keeps reads and
/// writes out and `holders` shows it as the writer; its read lets reads in
/// beside it and keeps writes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_recipes_nodes_count_by_the_rules() {
    let store = zookeeper::shared();
    let a = connect(store.endpoint()).await.unwrap();
    let observer = raw(&store.endpoint()).await;
    let name = unique("rw-curator");
    let parent = a.rw_lock_path(&name);
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    observer.mkdir(&parent, &open).await.unwrap();
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let foreign = Uuid::new_v4();
    for (mark, reads_allowed) in [("__WRIT__", false), ("__READ__", true)] {
        let prefix = format!("{parent}/_c_{}-{mark}", foreign.hyphenated());
        let (stat, sequence) = observer.create(&prefix, &[], &ephemeral).await.unwrap();
        let path = format!("{prefix}{sequence}");
        assert!(
            try_share(&a, &name, Access::Write).await.is_none(),
            "a write beside {mark}"
        );
        let read = try_share(&a, &name, Access::Read).await;
        assert_eq!(read.is_some(), reads_allowed, "a read beside {mark}");
        let holders = a.holders(&name, Kind::ReadWrite).await.unwrap();
        let theirs = (holders.iter())
            .find(|h| h.owner.map(|o| o.as_uuid()) == Some(foreign))
            .expect("the foreign node among the holders");
        assert_eq!(theirs.fence.get(), stat.czxid as u64);
        assert_eq!(theirs.label, None);
        let access = if reads_allowed {
            Access::Read
        } else {
            Access::Write
        };
        assert_eq!(theirs.access, Some(access));
        assert_eq!(holders.len(), 1 + usize::from(read.is_some()));
        if let Some(read) = read {
            a.release(&read).await.unwrap();
        }
        observer.delete(&path, None).await.unwrap();
        let write = share(&a, &name, Access::Write).await;
        a.release(&write).await.unwrap();
    }
    observer.delete(&parent, None).await.unwrap();
}

/// A session that read beside another reader, let its read go and then
/// asks to write is refused while that reader holds. Its new node's
/// sequence number right after its read's proves only that nobody created
/// a node in between, not that nothing is ahead: a grant made beside
/// another node vouches for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_beside_another_vouches_for_no_write_after_it() {
    let store = zookeeper::shared();
    let (a, b) = (
        connect(store.endpoint()).await.unwrap(),
        connect(store.endpoint()).await.unwrap(),
    );
    let name = unique("read-beside");
    let first = share(&a, &name, Access::Read).await;
    let beside = share(&b, &name, Access::Read).await;
    assert_eq!(b.release(&beside).await.unwrap(), ReleaseOutcome::Released);
    let write = try_share(&b, &name, Access::Write).await;
    assert!(
        write.is_none(),
        "a write granted while another session reads: {write:?}"
    );
    assert_eq!(a.release(&first).await.unwrap(), ReleaseOutcome::Released);
    let write = share(&b, &name, Access::Write).await;
    b.release(&write).await.unwrap();
}
