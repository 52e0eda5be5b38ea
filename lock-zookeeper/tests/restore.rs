//! The restore procedure (docs/operations.md §5) on ZooKeeper: fences are
//! `czxid`s, and restoring an older copy of a server's data directory takes
//! the zxids back with it. Without the procedure, the next fence repeats
//! one already handed out; raising the floor to the highest fence in use
//! before clients come back makes every later fence larger.

mod support;

use std::path::Path;

use lock_conformance::stores::{Store, zookeeper};
use lock_zookeeper::ZooKeeperBackend;
use lockcore::{FencingToken, LockBackend, LockName};
use support::{connect, take, unique};

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
    if !support::may_launch_servers("a_restored_data_dir_repeats_fences") {
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
