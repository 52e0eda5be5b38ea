//! Resource-side fencing (`fenced_write`) and the fence floor.

mod support;

use lock_conformance::stores::redis::{self as launcher};
use lock_redis::redis::{self, AsyncCommands};
use lock_redis::{RedisBackend, fenced_write};
use lockcore::{Fenced, StaleToken};
use lockcore::{FencingToken, LockError};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_refuse_older_tokens() {
    let url = launcher::shared().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let mut con = backend.connection();
    let tag = format!("{{order:{:x}}}", rand_u64());
    let (fence_key, data_key) = (format!("{tag}:fence"), format!("{tag}:data"));
    let token = |n: u64| FencingToken::new(n).unwrap();
    let set = |v: &str| redis::cmd("SET").arg(&data_key).arg(v).clone();

    let applied: Fenced<String> = fenced_write(&mut con, &fence_key, token(5), &set("five"))
        .await
        .unwrap();
    assert_eq!(applied, Ok("OK".into()));
    let again: Fenced<String> = backend
        .fenced_write(&fence_key, token(5), &set("five again"))
        .await
        .unwrap();
    assert!(again.is_ok(), "equal tokens pass");
    let stale: Fenced<String> = fenced_write(&mut con, &fence_key, token(4), &set("four"))
        .await
        .unwrap();
    assert_eq!(
        stale,
        Err(StaleToken {
            token: token(4),
            highest: token(5)
        })
    );
    let data: String = con.get(&data_key).await.unwrap();
    assert_eq!(data, "five again");

    // Exact for every u64, beyond Lua's 2^53.
    let big = u64::MAX - 1;
    let applied: Fenced<String> = fenced_write(&mut con, &fence_key, token(big), &set("big"))
        .await
        .unwrap();
    assert!(applied.is_ok());
    let stale: Fenced<String> = fenced_write(&mut con, &fence_key, token(big - 1), &set("no"))
        .await
        .unwrap();
    assert_eq!(stale.unwrap_err().highest, token(big));

    // A failing command changes nothing, the fence included.
    let incr = redis::cmd("INCR").arg(&data_key).clone();
    let failed = fenced_write::<i64, _>(&mut con, &fence_key, token(u64::MAX), &incr).await;
    assert!(matches!(failed, Err(LockError::Store { .. })), "{failed:?}");
    let last: String = con.get(&fence_key).await.unwrap();
    assert_eq!(last, big.to_string());

    let empty =
        fenced_write::<(), _>(&mut con, &fence_key, token(u64::MAX), &redis::Cmd::new()).await;
    assert!(
        matches!(empty, Err(LockError::InvalidConfig { .. })),
        "{empty:?}"
    );
    let () = con.set(&fence_key, "garbage").await.unwrap();
    let garbage = fenced_write::<String, _>(&mut con, &fence_key, token(9), &set("x")).await;
    assert!(
        matches!(garbage, Err(LockError::Store { .. })),
        "{garbage:?}"
    );
    let _: () = con.del(&[&fence_key, &data_key]).await.unwrap();
}
