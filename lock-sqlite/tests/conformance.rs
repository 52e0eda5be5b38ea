//! The whole conformance suite against a SQLite lock file in a temp dir of
//! its own per case (the one `LOCK_TEST_SQLITE_PATH` names in the suite's
//! lock-taker processes). "Store crash" kills every client process of the
//! file and reopens it; "store pause" stops a process that holds the
//! file's write lock. The cases that need a network link to cut skip: a
//! lock file has none (see `support::SqliteFactory::no_proxy_reason`).

mod support;

lock_conformance::suite!(support::SqliteFactory::new());

/// Not a test: the helper processes of `support` (a writer to kill mid-write,
/// a process that stalls the file's write lock).
#[test]
#[ignore = "helper process for the store crash and stall cases, run by the tests themselves"]
fn sqlite_helper_process() {
    support::helper_main();
}
