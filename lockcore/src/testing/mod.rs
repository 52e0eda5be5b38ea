//! Testing the code that uses locks (feature `testing`): what does your
//! worker do when its lease is lost, a renewal is slow, a waiter times out
//! or an operator force-releases?
//!
//! - [`TestStore`]: an in-memory store with controls a real store does not
//!   give: [`expire`](TestStore::expire) or [`evict`](TestStore::evict) a
//!   name now, [`hold_as`](TestStore::hold_as) another client, and the
//!   [`history`](TestStore::history) of every grant ([`Event`]).
//! - [`TestBackend`]: one client of that store, the backend you give a
//!   [`Locker`](crate::Locker); one per process or node you model.
//! - [`Faults`]: between a client and the store, for one client
//!   ([`TestBackend::faults`]) or all ([`TestStore::faults`]): renewals that
//!   fail or hang, a partition, slow replies, until [`heal`](Faults::heal).
//! - [`RecordingResource`]: a fenced resource that records every attempted
//!   write and [fails the test](RecordingResource::assert_no_write_after_loss)
//!   if one came after its guard's `lost()` fired.
//!
//! Everything runs on tokio's clock: under `#[tokio::test(start_paused =
//! true)]` a test of minutes of leases runs in milliseconds, the same way
//! every time. The guide, with three complete examples, is
//! `docs/testing-your-code.md`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), lockcore::LockError> {
//! use std::time::Duration;
//! use lockcore::testing::{RecordingResource, TestStore};
//! use lockcore::{Locker, LossReason};
//!
//! let store = TestStore::new();
//! let client = store.client();
//! let faults = client.faults();
//! let locker = Locker::new(client).ttl(Duration::from_secs(30));
//! let ledger = RecordingResource::new(0_u32);
//!
//! let guard = locker.acquire("ledger").await?;
//! ledger.watch(&guard);
//! ledger.write(guard.fencing_token(), |n| *n += 1).unwrap();
//!
//! faults.hang_renewals(); // the store stops answering
//! let reason = guard.lost().await; // at the lease's deadline, on the paused clock
//! assert_eq!(reason, LossReason::RenewalUnanswered);
//!
//! // An application that stops here passes:
//! ledger.assert_no_write_after_loss();
//! // One that writes on is caught, even though the store has not yet
//! // given the name to anyone and the fence check lets the write through:
//! let _ = ledger.write(guard.fencing_token(), |n| *n += 1);
//! assert_eq!(ledger.check_no_write_after_loss().unwrap_err().writes.len(), 1);
//! # Ok(()) }
//! ```

mod client;
mod faults;
mod history;
mod recording;
mod store;

pub use client::TestBackend;
pub use faults::Faults;
pub use history::{Change, Event};
pub use recording::{RecordingResource, WriteAttempt, WritesAfterLoss};
pub use store::TestStore;
