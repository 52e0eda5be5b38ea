//! `fenced_write`: a write through a fence node is applied only with a
//! token not older than the newest applied, in one transaction with the
//! write itself.

mod support;

use lock_conformance::kit::stores::zookeeper;
use lock_zookeeper::{fenced_write, zk};
use lockcore::{FencingToken, LockError};
use support::raw;

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

/// Newer and equal tokens write, an older one is refused without writing,
/// and a write that fails leaves the fence where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_tokens_are_refused_and_failed_writes_move_no_fence() {
    let store = zookeeper::shared();
    let client = raw(&store.endpoint()).await;
    let base = format!("/zk-fenced-{}", uuid::Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&base, &[], &open).await.unwrap();
    let (fence, data) = (format!("{base}/fence"), format!("{base}/data"));
    client.create(&data, b"none", &open).await.unwrap();
    let set = |value: &'static [u8]| {
        let data = data.clone();
        move |multi: &mut zk::MultiWriter<'_>| multi.add_set_data(&data, value, None)
    };
    let read = || async { client.get_data(&data).await.unwrap().0 };

    assert!(
        fenced_write(&client, &fence, token(7), set(b"seven"))
            .await
            .unwrap()
            .is_ok()
    );
    assert!(
        fenced_write(&client, &fence, token(7), set(b"seven again"))
            .await
            .unwrap()
            .is_ok()
    );
    let refused = fenced_write(&client, &fence, token(6), set(b"six"))
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err().highest, token(7));
    assert_eq!(read().await, b"seven again");
    assert!(
        fenced_write(&client, &fence, token(9), set(b"nine"))
            .await
            .unwrap()
            .is_ok()
    );
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"9");

    // The write fails (its node is missing): nothing is written, the fence
    // included, so token 10 did not move it.
    let missing = format!("{base}/missing");
    let failed = fenced_write(&client, &fence, token(10), |multi| {
        multi.add_set_data(&missing, b"x", None)
    })
    .await;
    assert!(matches!(failed, Err(LockError::Store { .. })), "{failed:?}");
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"9");
    assert!(
        fenced_write(&client, &fence, token(9), set(b"nine again"))
            .await
            .unwrap()
            .is_ok()
    );
}

/// Writers racing with tokens 1..=16: every accepted write was, when it was
/// applied, the newest so far; the data ends with the highest token's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_apply_an_older_token_after_a_newer_one() {
    let store = zookeeper::shared();
    let client = raw(&store.endpoint()).await;
    let base = format!("/zk-fenced-race-{}", uuid::Uuid::new_v4().simple());
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&base, &[], &open).await.unwrap();
    let (fence, log) = (format!("{base}/fence"), format!("{base}/log"));
    client.create(&log, &[], &open).await.unwrap();
    let writers: Vec<_> = (1..=16_u64)
        .map(|n| {
            let (fence, log, url) = (fence.clone(), log.clone(), store.endpoint());
            tokio::spawn(async move {
                let client = raw(&url).await;
                // Each accepted write appends its token to the log.
                let entry = format!("{log}/w-");
                let mode = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
                let written = fenced_write(&client, &fence, token(n), |multi| {
                    multi.add_create(&entry, n.to_string().as_bytes(), &mode)
                })
                .await
                .unwrap();
                written.is_ok()
            })
        })
        .collect();
    let mut accepted = 0;
    for writer in writers {
        accepted += usize::from(writer.await.unwrap());
    }
    let mut entries = client.list_children(&log).await.unwrap();
    entries.sort();
    let mut applied = Vec::new();
    for entry in &entries {
        let (data, _) = client.get_data(&format!("{log}/{entry}")).await.unwrap();
        applied.push(String::from_utf8(data).unwrap().parse::<u64>().unwrap());
    }
    assert_eq!(applied.len(), accepted);
    assert!(
        applied.windows(2).all(|w| w[0] < w[1]),
        "applied out of token order: {applied:?}"
    );
    assert_eq!(applied.last(), Some(&16));
    assert_eq!(client.get_data(&fence).await.unwrap().0, b"16");
}
