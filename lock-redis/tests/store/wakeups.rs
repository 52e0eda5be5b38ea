//! Wake-ups from the store: the wait line (one waiter woken per hand-off),
//! the line across restarts and dropped subscriptions, and watches.

mod handoff;
mod line;
mod recovery;
mod watch;
