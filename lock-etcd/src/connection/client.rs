//! The client of one backend instance: its connection, sessions, watch
//! stream, queue views and fence floor, shared by every role through one
//! [`Inner`]; each role adds its operations to it in its own file.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Txn, TxnResponse};
use lockcore::backend::Clock;
use lockcore::{Capabilities, LockError};

use crate::connection::Conn;
use crate::connection::session::Sessions;
use crate::error::timed;
use crate::fence::floor::Floor;
use crate::keys::Keys;
use crate::wait::hub::Hub;
use crate::wait::line::Lines;

pub(crate) struct Inner {
    /// The connection, and the work tied to it, until closed.
    pub(crate) conn: Arc<Conn>,
    pub(crate) keys: Keys,
    pub(crate) caps: Capabilities,
    pub(crate) timeout: Duration,
    /// This instance's one watch stream.
    pub(crate) hub: Arc<Hub>,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) lines: Arc<Lines>,
    pub(crate) floor: Arc<Floor>,
    /// What leases are stamped with and judged on: the clock every
    /// session's proof of life is read on.
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    /// Set when closing begins: every operation is refused from then on.
    pub(crate) closed: std::sync::atomic::AtomicBool,
    /// Whether `close` finished (held while it runs, so calls queue up).
    pub(crate) closing: tokio::sync::Mutex<bool>,
}

impl Inner {
    pub(crate) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, LockError> {
        timed(self.timeout, what, self.conn.kv()?.txn(txn)).await
    }
}
