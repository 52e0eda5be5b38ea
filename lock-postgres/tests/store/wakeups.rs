//! Waiters and wake-ups: LISTEN/NOTIFY and watch keys (`notify`), the
//! turnstile line and its connections (`turnstile`), the hand-off made by
//! the queued statement itself (`handoff`), and a line whose holder stalls
//! (`stalled_holder`).

mod handoff;
mod notify;
mod turnstile;
