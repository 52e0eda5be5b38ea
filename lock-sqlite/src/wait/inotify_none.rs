//! Off Linux there is no inotify: no wake-ups, no eviction notices (the
//! backend refuses to connect there anyway, see `clock.rs`).

use std::io;
use std::path::Path;

use lockcore::backend::wait::Wakeup;
use tokio::sync::mpsc;

#[derive(Debug)]
pub(crate) struct Doorbells;

impl Doorbells {
    pub(crate) fn new() -> io::Result<(Doorbells, mpsc::UnboundedReceiver<u64>)> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "inotify is Linux only",
        ))
    }
    pub(crate) fn ring(&self, _path: &Path) -> io::Result<Option<Wakeup>> {
        Ok(None)
    }
    pub(crate) fn hold(&self, _path: &Path, _fence: u64) -> Option<i32> {
        None
    }
    pub(crate) fn unhold(&self, _wd: i32, _fence: u64) {}
    pub(crate) async fn close(&self) {}
}

pub(crate) fn first_of(wakeups: Vec<Wakeup>) -> Wakeup {
    Box::pin(async move {
        for wakeup in wakeups {
            wakeup.await;
        }
    })
}
