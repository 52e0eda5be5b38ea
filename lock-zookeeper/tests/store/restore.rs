//! The restore procedure (docs/operations.md §5) on ZooKeeper: fences are
//! `czxid`s, and restoring an older copy of a server's data directory takes
//! the zxids back with it. Without the procedure, the next fence repeats
//! one already handed out; raising the floor to the highest fence in use
//! before clients come back makes every later fence larger.

use std::path::Path;
use std::time::Duration;

use lock_conformance::kit::poll::eventually;
use lock_conformance::kit::proxy::{FaultProxy, Mode};
use lock_conformance::kit::stores::{Store, zookeeper};
use lock_zookeeper::ZooKeeperBackend;
use lockcore::{FencingToken, LockBackend, LockName};
use tokio::time::{Instant, timeout};

use crate::support::{children, connect, connect_with, locker, raw, session_id, take, unique};

/// Copies the directory tree `from` to `to` (which must not exist).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Takes and releases `name`: its fence.
async fn cycle(backend: &ZooKeeperBackend, name: &LockName) -> FencingToken {
    let lease = take(backend, name).await;
    backend.release(&lease).await.unwrap();
    lease.fence()
}

/// Stops `store`, puts the data directory `backup` in place of its own,
/// and starts it again.
fn restore(store: &Store, data: &Path, backup: &Path) {
    store.stop_now().unwrap();
    std::fs::remove_dir_all(data).unwrap();
    copy_tree(backup, data);
    store.restart_now().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_data_dir_repeats_fences_unless_the_floor_is_raised() {
    if !crate::support::may_launch_servers("a_restored_data_dir_repeats_fences") {
        return;
    }
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let data = store.data_dir().unwrap().join("data");
    let backup = store.data_dir().unwrap().join("backup");
    let (name, fresh) = (unique("restored"), unique("restored-fresh"));

    let backend = connect(store.endpoint()).await.unwrap();
    let in_backup = cycle(&backend, &name).await;
    drop(backend);
    // The backup: a copy of the data directory of the stopped server.
    store.stop_now().unwrap();
    copy_tree(&data, &backup);
    store.restart_now().unwrap();
    let backend = connect(store.endpoint()).await.unwrap();
    let mut newest = in_backup;
    for _ in 0..5 {
        newest = cycle(&backend, &name).await;
    }
    drop(backend);

    restore(&store, &data, &backup);
    let careless = connect(store.endpoint()).await.unwrap();
    let repeated = cycle(&careless, &name).await;
    assert!(
        repeated <= newest,
        "without the procedure the zxids restart from the backup: {repeated} after {newest}"
    );
    drop(careless);

    restore(&store, &data, &backup);
    let operator = connect(store.endpoint()).await.unwrap();
    operator.raise_fence_floor(newest).await.unwrap();
    drop(operator);
    let client = connect(store.endpoint()).await.unwrap();
    for lock in [&name, &fresh] {
        let next = cycle(&client, lock).await;
        assert!(
            next > newest,
            "after raising the floor to {newest}, {lock} was granted fence {next}"
        );
    }
    // Raising it again to an older fence moves nothing back.
    let before = cycle(&client, &name).await;
    client.raise_fence_floor(in_backup).await.unwrap();
    let after = cycle(&client, &name).await;
    assert!(after > before, "fence {after} after {before}");
    eprintln!(
        "fences: {in_backup} in the backup, {newest} before the restore, {repeated} after a \
         careless restore, {before} after the procedure"
    );
}

/// When the running clients are let back in, relative to the restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reopen {
    /// As the procedure says (docs/operations.md §5, step 5): once the
    /// longest lease TTL in use has passed since the old store stopped
    /// answering them.
    AfterTheirTtl,
    /// As soon as the floor is raised: step 5 skipped on purpose, so that
    /// the running clients come back while their sessions, restored from
    /// the backup, are still on the server.
    AtOnce,
}

/// Clients with a long session hold and wait across both the backup and the
/// restore, cut off from the store (a refusing proxy) from before the
/// restore until `reopen`; returns how long after the reopening the nodes
/// of their sessions in the backup were gone.
///
/// Their sessions, restored from the backup, are on the server with nodes
/// from back then: the lock `c` held then (released since), the lock `h`
/// held then, `c`'s place in line behind it. ZooKeeper lets a client resume
/// such a session once the server's zxids are past what the client saw (as
/// they soon are on a busy server: here, filler writes). A session resumed
/// after the floor was raised is from before the floor: the backend retires
/// it (its leases lost, its waiters queued again on a new session) and
/// closes it, so its nodes from the backup go at once. Checked either way:
/// no lease from before the restore is kept once a grant that contradicts
/// it is made (no second holder), every grant afterwards is above the
/// floor, and no name stays blocked by a node nobody knows of.
async fn across_a_restore(reopen: Reopen) -> Duration {
    let store = tokio::task::spawn_blocking(|| zookeeper::start(zookeeper::Options::default()))
        .await
        .unwrap()
        .unwrap();
    let data = store.data_dir().unwrap().join("data");
    let backup = store.data_dir().unwrap().join("backup");
    let proxy = FaultProxy::start(store.addr()).await.unwrap();
    // Long enough to outlive a stop and a start of the server.
    let long = Duration::from_secs(20)
        .mul_f64(crate::support::time_scale())
        .min(Duration::from_secs(60));
    let running = || {
        let url = store.endpoint_via(proxy.addr());
        async move {
            connect_with(&url, |c| c.session_timeout(long))
                .await
                .unwrap()
        }
    };
    let (c, h) = (running().await, running().await);
    let (c_sid, h_sid) = (session_id(&c), session_id(&h));
    let (held, waited, busy) = (
        unique("running-held"),
        unique("running-waited"),
        unique("running-busy"),
    );
    let observer = raw(&store.endpoint()).await;

    // In the backup: `c` holds `held`, `h` holds `waited`, `c` waits for it.
    let c_locker = locker(&c);
    let before = c_locker.acquire(&held).await.unwrap();
    let h_guard = locker(&h).acquire(&waited).await.unwrap();
    let waiter = tokio::spawn({
        let (locker, name) = (locker(&c), waited.clone());
        async move { locker.acquire(&name).await }
    });
    eventually(Duration::from_secs(5), "the waiter queueing", || async {
        (children(&observer, &c.lock_path(&waited)).await.len() == 2).then_some(())
    })
    .await;
    drop(observer);
    store.stop_now().unwrap();
    copy_tree(&data, &backup);
    store.restart_now().unwrap();

    // After the backup (lost by the restore): `c` takes `held` again, and
    // other grants move fences on.
    let d = connect(store.endpoint()).await.unwrap();
    let mut newest = before.fencing_token();
    before.release().await.unwrap();
    let held_guard = c_locker.acquire(&held).await.unwrap();
    newest = newest.max(held_guard.fencing_token());
    for _ in 0..20 {
        newest = newest.max(cycle(&d, &busy).await);
    }
    drop(d);
    assert!(h_guard.is_held() && held_guard.is_held());
    let seen = crate::support::zxid(store.addr());

    // 1. Running clients cut off (the server's stop ends their connections).
    proxy.set(Mode::Refuse);
    let cut_off = Instant::now();
    // 2. The largest fence in use: `newest`. 3. The restore.
    restore(&store, &data, &backup);
    // 4. The floor, raised by a client of its own.
    let operator = connect(store.endpoint()).await.unwrap();
    let floor = newest;
    operator.raise_fence_floor(floor).await.unwrap();
    drop(operator);
    // A busy server: its zxids pass what the running clients saw, so they
    // may resume their sessions.
    let filler = raw(&store.endpoint()).await;
    let open = lock_zookeeper::zk::CreateMode::Persistent
        .with_acls(lock_zookeeper::zk::Acls::anyone_all());
    while crate::support::zxid(store.addr()) <= seen {
        filler.create("/filler", b"", &open).await.unwrap();
        filler.delete("/filler", None).await.unwrap();
    }
    let observer = raw(&store.endpoint()).await;
    let zombies = |sid: i64, name: &LockName| {
        let (observer, parent) = (&observer, c.lock_path(name));
        async move {
            let mut owned = Vec::new();
            for child in children(observer, &parent).await {
                let path = format!("{parent}/{child}");
                if let Ok(Some(stat)) = observer.check_stat(&path).await
                    && stat.ephemeral_owner == sid
                {
                    owned.push(path);
                }
            }
            owned
        }
    };
    // 5. Their longest TTL since the old store stopped answering them.
    if reopen == Reopen::AfterTheirTtl {
        tokio::time::sleep_until(cut_off + long).await;
        assert!(
            !held_guard.is_held() && !h_guard.is_held(),
            "a lease from before the restore reads held a TTL after the store stopped answering"
        );
    } else {
        assert!(
            !zombies(c_sid, &held).await.is_empty(),
            "the backup's node of `held` is back"
        );
        assert!(
            !zombies(h_sid, &waited).await.is_empty(),
            "the backup's node of `waited` is back"
        );
    }
    // 6. Traffic reopened.
    let reopened = Instant::now();
    proxy.set(Mode::Pass);

    // The backup's nodes of the running clients' sessions go (closed by
    // the backend when the session was resumed; else expired), and no lease
    // from before the restore is kept.
    let within = long / 2;
    for (sid, name) in [(c_sid, &held), (c_sid, &waited), (h_sid, &waited)] {
        eventually(within, "the restored session's nodes deleted", || async {
            zombies(sid, name).await.is_empty().then_some(())
        })
        .await;
    }
    let gone = reopened.elapsed();
    for (what, guard) in [("held", &held_guard), ("waited", &h_guard)] {
        let reason = timeout(within, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("the lease of {what} from before the restore is kept"));
        eprintln!("{what}: lost ({reason})");
    }

    // Every grant afterwards is above the floor, and made while nobody
    // else reads held: the waiter's (queued again on a new session), a
    // fresh client's of the name held in the backup.
    let granted = timeout(within, waiter)
        .await
        .expect("the waiter is granted")
        .unwrap()
        .unwrap();
    assert!(!h_guard.is_held(), "two holders of `waited`");
    let _ = h_guard.release().await;
    assert!(
        granted.fencing_token() > floor,
        "the waiter was granted fence {} under the floor {floor}",
        granted.fencing_token()
    );
    granted.release().await.unwrap();
    let e = connect(store.endpoint()).await.unwrap();
    let next = take(&e, &held).await;
    assert!(!held_guard.is_held(), "two holders of `held`");
    assert!(
        next.fence() > floor,
        "`held` was granted fence {} under the floor {floor}",
        next.fence()
    );
    e.release(&next).await.unwrap();
    let _ = held_guard.release().await;
    gone
}

/// The procedure of docs/operations.md §5 with clients running across the
/// restore (holding, and waiting behind another running client), cut off
/// from before it until their TTL has passed: no second holder, every
/// later fence above the floor, nothing of theirs left from the backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restore_procedure_with_running_clients_makes_no_second_holder() {
    if !crate::support::may_launch_servers("the_restore_procedure_with_running_clients") {
        return;
    }
    let gone = across_a_restore(Reopen::AfterTheirTtl).await;
    eprintln!("the backup's sessions gone {gone:?} after the store reopened");
}

/// The same, with the running clients let back as soon as the floor is
/// raised: they resume their sessions from the backup, which the backend
/// retires and closes at once (before, the backup's nodes stayed, the lease
/// from before the restore stayed held, and the waiter was granted a fence
/// under the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_clients_let_back_early_never_resume_sessions_from_before_the_floor() {
    if !crate::support::may_launch_servers("running_clients_let_back_early") {
        return;
    }
    let gone = across_a_restore(Reopen::AtOnce).await;
    eprintln!("restored sessions closed {gone:?} after the store reopened");
}
