//! Waiting in line: the adapter's [`Waiter`] for lockcore's one wait loop.
//! The wake-ups it waits for live beside it: the turnstiles
//! (`wait/turnstile.rs`), LISTEN/NOTIFY (`wait/notify.rs`, driven by the
//! listener task of `wait/listener.rs` over the registry of
//! `wait/registry.rs`).
//!
//! A waiting `acquire` stands in line twice, and only the head of the line
//! asks for the lease:
//!
//! 1. in this backend instance, behind earlier waiters of the same name
//!    (lockcore's `LocalLine`, no I/O), so an instance sends one waiter per
//!    name to the server at a time; the first local waiter first tries to
//!    take a free lock nobody waits for, without queueing at all;
//! 2. at the server, in the name's turnstile queue (`wait/turnstile.rs`).
//!
//! The queued statement asks for the lease itself, the moment the turn
//! comes (`wait/turnstile.rs`): the waiter's attempt, sent when it queued,
//! so its lease counts from then, never from when the answer came. A long
//! wait leaves less of it: a lease with less than half its TTL left is
//! renewed before it is handed out. If the lease was still held (or the
//! session could not ask), the turnstile holder waits for it as any waiter
//! does (LISTEN/NOTIFY, the holder's expiry, re-checks); the lease it gets
//! keeps the turnstile until it is released. While queued, it looks at
//! the lease soon after queueing, then at the holder's expiry (and at least
//! every re-check interval): if the lease has been free or expired for
//! [`TAKE_PAST_AFTER`], whoever holds the turnstile is not taking it (a
//! holder that stopped renewing, a hung waiter, a name whose key collides
//! with ours), and the waiter takes it past them. Without a turnstile
//! (turned off, none to spare, connection lost) the head of the local line
//! waits without one.
//!
//! Every step is one [`Waiter::attempt`]; [`Waiter::arm`] registers the
//! wake-up of the coming step: the waiter's own signal (its turnstile turn)
//! while queued, the store's notification once it asks for the lease.

pub(crate) mod listener;
pub(crate) mod notify;
mod registry;
pub(crate) mod turnstile;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use lockcore::backend::wait::{LocalLine, WaitPolicy, Waiter, Wakeup};
use lockcore::backend::{LockRequest, Moment, async_trait};
use lockcore::{Attempt, Lease, LockError, OwnerToken};
use tokio::sync::Notify;
use tokio::time::Instant;

use self::notify::Pending;
use self::turnstile::{Ask, Ticket, Turn, Turnstiles};
use crate::connection::{Client, ttl_micros};
use crate::keys;
use crate::locks::{GrantRow, Held, Take, answered};

/// How long a lease must have been free (or expired) before a waiter
/// queued at its turnstile takes it past whoever holds the turnstile: a
/// holder that stopped renewing (paused, hung) keeps its turnstile until
/// the server notices, and a turnstile holder that waits for the lease
/// itself retries right at its expiry, well within this. Long enough that
/// a head of the line slowed by a loaded machine (50 ms was seen passed)
/// keeps its turn.
pub(crate) const TAKE_PAST_AFTER: Duration = Duration::from_millis(150);

/// How long after a lease's expiry a waiter queued behind a stalled
/// turnstile holder may still be waiting (beyond round trips): the wait
/// above, and one retry when its timer fired a little early.
pub(crate) const EXPIRY_SLACK: Duration = Duration::from_millis(200);

/// A waiting `acquire` of a lock, in the local line (`line`: the
/// instance's line and its count of waiting `acquire` calls), then the
/// server's.
pub(crate) async fn in_line(
    client: &Arc<Client>,
    turnstiles: &Turnstiles,
    (line, waiting): (&LocalLine, &AtomicUsize),
    request: &LockRequest,
    wait: &WaitPolicy,
) -> Result<Option<Lease>, LockError> {
    let _waiting = Counted::new(waiting);
    // The local line: first at once (nobody of this instance waits for
    // the name), or behind earlier waiters until the deadline.
    let mut turn = std::pin::pin!(line.turn(request.name()));
    let now = std::future::poll_fn(|cx| Poll::Ready(turn.as_mut().poll(cx))).await;
    let (_turn, first) = match now {
        Poll::Ready(turn) => (turn, true),
        Poll::Pending => match tokio::time::timeout_at(wait.deadline, turn).await {
            Ok(turn) => (turn, false),
            Err(_) => return Ok(None),
        },
    };
    let mut waiter = LineWaiter::new(client, turnstiles, request, wait.recheck, first);
    lockcore::backend::wait::wait(wait, &mut waiter).await
}

/// Counts one waiting `acquire` for as long as it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One waiting `acquire`, step by step, once it is first in the local line
/// (its `LocalTurn` is held by the caller for the whole wait).
pub(crate) struct LineWaiter<'a> {
    client: &'a Arc<Client>,
    turnstiles: &'a Turnstiles,
    request: &'a LockRequest,
    recheck: Duration,
    /// Notified when this waiter's turnstile turn comes.
    signal: Arc<Notify>,
    stage: Stage,
    /// Whether the last `arm` registered a store wake-up (not only the
    /// waiter's own signal).
    armed_store: bool,
    /// The holder's remaining time when this waiter last looked, before
    /// queueing: the first look at the lease while queued is due then.
    first_look: Option<Duration>,
}

enum Stage {
    /// First in the local line, nobody was ahead: try a free lock at once.
    Start,
    /// First in the local line: queue at the turnstile.
    Enter,
    /// In the server's queue, asking for the lease when the turn comes
    /// (`asked`); look at the lease at `look_at`.
    Queued {
        ticket: Ticket,
        asked: Option<Asked>,
        look_at: Instant,
    },
    /// Holding the turnstile: the only waiter asking for the lease.
    Turn(Ticket),
    /// No turnstile: waiting like any client, unordered.
    Plain,
}

/// The attempt a queued statement makes when its turn comes: its owner
/// token, when it was sent (its lease counts from then), and its eviction
/// registration.
struct Asked {
    owner: OwnerToken,
    sent_at: Moment,
    pending: Pending,
}

impl<'a> LineWaiter<'a> {
    /// `first`: nobody of this instance was waiting for the name when this
    /// wait began (then a free lock is tried before queueing).
    pub(crate) fn new(
        client: &'a Arc<Client>,
        turnstiles: &'a Turnstiles,
        request: &'a LockRequest,
        recheck: Duration,
        first: bool,
    ) -> Self {
        LineWaiter {
            client,
            turnstiles,
            request,
            recheck,
            signal: Arc::new(Notify::new()),
            stage: if first { Stage::Start } else { Stage::Enter },
            armed_store: false,
            first_look: None,
        }
    }

    /// The head of the local line enters the server's queue, or waits
    /// without a turnstile when there is none to spare or turnstiles are off.
    async fn enter(&mut self) -> Stage {
        let name = self.request.name();
        let key = keys::turnstile_key(&self.client.sql.table, name.as_str());
        if !self.turnstiles.enabled() {
            return Stage::Plain;
        }
        let (ask, asked) = self.ask().unzip();
        match self.turnstiles.enter(key, ask, self.signal.clone()).await {
            Some(ticket) => Stage::Queued {
                ticket,
                asked,
                look_at: Instant::now() + self.first_look_in(),
            },
            None => {
                tracing::debug!(lock = %name, "no turnstile to spare; waiting without one");
                Stage::Plain
            }
        }
    }

    /// The attempt the queued statement makes when the turn comes, with
    /// what the turnstile sends (`None` while a failover's lock delay holds
    /// grants back, or the TTL does not fit).
    fn ask(&self) -> Option<(Ask, Asked)> {
        if self.client.era.grants_wait().is_some() {
            return None;
        }
        let name = self.request.name().as_str();
        let owner = OwnerToken::new();
        let ask = Ask {
            name: name.to_owned(),
            owner: owner.as_uuid(),
            ttl_us: ttl_micros(self.request.ttl()).ok()?,
            label: self.request.label().as_str().to_owned(),
            watch: keys::watch_key(&self.client.sql.table, &keys::lock_topic(name)),
        };
        // Read before the statement goes out: the lease may only end early.
        let sent_at = self.request.now();
        // Registered before it is sent: an eviction right after the grant
        // must find it.
        let pending = self.client.wakeups.expect(name, ask.owner);
        Some((
            ask,
            Asked {
                owner,
                sent_at,
                pending,
            },
        ))
    }

    /// Queued at the turnstile: its turn, or a look at the lease when one
    /// is due (taking it if it has been left free for `TAKE_PAST_AFTER`).
    async fn queued(
        &mut self,
        mut ticket: Ticket,
        asked: Option<Asked>,
        look_at: Instant,
    ) -> Result<Attempt, LockError> {
        match ticket.turn() {
            Turn::Mine => {
                let answer = ticket.answer();
                self.stage = Stage::Turn(ticket);
                return match answer.zip(asked) {
                    Some((rows, asked)) => self.take_answer(&rows, asked).await,
                    // Most often the lease was just released by the
                    // previous turnstile holder: try at once.
                    None => self.try_lease().await,
                };
            }
            Turn::Lost(error) => {
                tracing::debug!(lock = %self.request.name(), %error, "turnstile connection lost; waiting without one");
                self.stage = Stage::Plain;
                return self.client.acquire(self.request, Take::Any).await;
            }
            Turn::Waiting => {}
        }
        let now = Instant::now();
        if now < look_at {
            self.stage = Stage::Queued {
                ticket,
                asked,
                look_at,
            };
            return Ok(Attempt::Held {
                expires_in: Some(look_at - now),
            });
        }
        let next = match self
            .client
            .acquire(self.request, Take::FreeFor(TAKE_PAST_AFTER))
            .await
        {
            Ok(Attempt::Acquired(lease)) => {
                tracing::debug!(lock = %self.request.name(), "the turnstile's holder left the lease free; took it past them");
                // Dropping the ticket leaves the queue.
                return Ok(Attempt::Acquired(lease));
            }
            // Just past the holder's expiry (by the server's count).
            Ok(Attempt::Held {
                expires_in: Some(left),
            }) => left + TAKE_PAST_AFTER + Duration::from_millis(1),
            // Free or expired, but not for long enough yet (or being taken
            // right now): look again shortly.
            Ok(Attempt::Held { expires_in: None }) => TAKE_PAST_AFTER / 2,
            Err(e) if e.is_retryable() => self.recheck,
            Err(e) => return Err(e),
        };
        let next = next.min(self.recheck);
        self.stage = Stage::Queued {
            ticket,
            asked,
            look_at: Instant::now() + next,
        };
        Ok(Attempt::Held {
            expires_in: Some(next),
        })
    }

    /// Holding the turnstile: asks for the lease; a lease it gets keeps the
    /// turnstile until it is released (or renewing finds it gone, or the
    /// lease is dropped), so the next waiter's turn begins exactly when
    /// this lease ends, and it finds it free.
    async fn try_lease(&mut self) -> Result<Attempt, LockError> {
        let attempt = self.client.acquire(self.request, Take::Any).await?;
        if let Attempt::Acquired(lease) = &attempt
            && let Some(held) = lease.extension::<Held>()
            && let Stage::Turn(ticket) = std::mem::replace(&mut self.stage, Stage::Plain)
        {
            held.turnstile.keep(ticket);
        }
        Ok(attempt)
    }

    /// The lease the queued statement's acquire got (`rows`), if any,
    /// kept as `try_lease` keeps one: renewed first when the wait in line
    /// left it less than half its TTL (counted from the send), and given
    /// back if a failover's lock delay began meanwhile.
    async fn take_answer(&mut self, rows: &[GrantRow], asked: Asked) -> Result<Attempt, LockError> {
        let Asked {
            owner,
            sent_at,
            pending,
        } = asked;
        let attempt = answered(self.request, owner, sent_at, pending, rows)?;
        let Attempt::Acquired(mut lease) = attempt else {
            return Ok(attempt);
        };
        let until = sent_at.mono() + self.request.ttl().get();
        if let Some(wait) = self.client.era.grants_wait() {
            self.client.forget_later(self.request.name(), owner, until);
            return Ok(Attempt::Held {
                expires_in: Some(wait),
            });
        }
        if lease.remaining() < self.request.ttl().get() / 2 {
            let renewed = self.client.renew_many(std::slice::from_ref(&lease)).await;
            match renewed.into_iter().next() {
                Some(Ok(renewed)) => lease = renewed,
                // Not kept: freed, and the lease asked for again.
                _ => {
                    self.client.forget_later(self.request.name(), owner, until);
                    return self.try_lease().await;
                }
            }
        }
        if let Some(held) = lease.extension::<Held>()
            && let Stage::Turn(ticket) = std::mem::replace(&mut self.stage, Stage::Plain)
        {
            held.turnstile.keep(ticket);
        }
        Ok(Attempt::Acquired(lease))
    }

    /// When to look at the lease first once queued: just past the holder's
    /// expiry if this waiter saw the holder before queueing (a turnstile
    /// holder that does not take the lease then is not taking it), else
    /// shortly (to learn when it expires); at least every re-check.
    fn first_look_in(&mut self) -> Duration {
        let look = match self.first_look.take() {
            Some(left) => left + TAKE_PAST_AFTER + Duration::from_millis(1),
            None => TAKE_PAST_AFTER,
        };
        look.min(self.recheck)
    }

    fn signalled(&self) -> Wakeup {
        Box::pin(self.signal.clone().notified_owned())
    }
}

#[async_trait]
impl Waiter for LineWaiter<'_> {
    async fn arm(&mut self) -> Result<Option<Wakeup>, LockError> {
        self.armed_store = matches!(self.stage, Stage::Turn(_) | Stage::Plain);
        if self.armed_store {
            let topic = keys::lock_topic(self.request.name().as_str());
            Ok(self.client.wakeups.watch(topic).await)
        } else {
            Ok(Some(self.signalled()))
        }
    }

    async fn attempt(&mut self, _attempt: u32) -> Result<Attempt, LockError> {
        let attempt = self.step().await?;
        // Asking for the lease now, but only the waiter's own signal was
        // armed: come straight back to arm the store's wake-up.
        if let Attempt::Held { .. } = attempt
            && !self.armed_store
            && matches!(self.stage, Stage::Turn(_) | Stage::Plain)
        {
            return Ok(Attempt::Held {
                expires_in: Some(Duration::ZERO),
            });
        }
        Ok(attempt)
    }
}

impl LineWaiter<'_> {
    /// One step: through the line, up to the next thing to wait for.
    async fn step(&mut self) -> Result<Attempt, LockError> {
        loop {
            match std::mem::replace(&mut self.stage, Stage::Plain) {
                Stage::Start => {
                    // Nobody waiting (here or at the server): take a free
                    // lock at once, no line, one statement.
                    let take = if self.turnstiles.enabled() {
                        Take::IfNoLine
                    } else {
                        Take::Any
                    };
                    match self.client.acquire(self.request, take).await? {
                        attempt @ Attempt::Acquired(_) => return Ok(attempt),
                        Attempt::Held { expires_in } => self.first_look = expires_in,
                    }
                    self.stage = Stage::Enter;
                }
                Stage::Enter => {
                    self.stage = self.enter().await;
                    if let Stage::Queued { look_at, .. } = &self.stage {
                        // The queueing is under way: look again at the
                        // turnstile's signal, or when a look is due.
                        return Ok(Attempt::Held {
                            expires_in: Some(look_at.saturating_duration_since(Instant::now())),
                        });
                    }
                }
                Stage::Queued {
                    ticket,
                    asked,
                    look_at,
                } => return self.queued(ticket, asked, look_at).await,
                Stage::Turn(ticket) => {
                    self.stage = Stage::Turn(ticket);
                    return self.try_lease().await;
                }
                Stage::Plain => {
                    self.stage = Stage::Plain;
                    return self.client.acquire(self.request, Take::Any).await;
                }
            }
        }
    }
}
