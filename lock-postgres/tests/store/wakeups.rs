//! Waiters and wake-ups: LISTEN/NOTIFY and watch keys (`notify`), the
//! turnstile line and its connections (`turnstile`), and a line whose
//! holder stalls (`stalled_holder`).

mod notify;
mod turnstile;
