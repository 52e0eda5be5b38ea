//! The keeper: one task per client that refreshes sessions with waiting
//! entries, deletes keys whose time ran out, moves waiting entries off
//! retired sessions, drops sessions nobody uses, and retires what a raise of
//! the fence floor (a restore) leaves behind.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use etcd_client::{Txn, TxnOp};
use lockcore::LockError;
use lockcore::backend::Moment;

use super::{Attached, Book, IDLE, Kind, Paid, Session, Sessions, Status, TICK, free_number};
use crate::error::{BACKEND, timed};
use crate::keys::unchanged;

/// What the keeper does in one tick, decided under the book's lock.
#[derive(Default)]
struct Chores {
    refresh: Vec<Arc<Session>>,
    /// Retired sessions' waiting entries to move: (from, keys).
    moves: Vec<(i64, Vec<Attached>)>,
    /// Keys whose time ran out.
    overdue: Vec<(Attached, i64)>,
    revoke: Vec<i64>,
}

/// The keeper: refreshes sessions with waiting entries, deletes keys whose
/// time ran out, moves waiting entries off retired sessions, and drops
/// sessions nobody uses. Exits when the client is dropped.
pub(super) async fn keep(sessions: Weak<Sessions>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        {
            // Nothing to keep: stop (the next session starts a keeper again;
            // checked under the flag `start_keeper` takes after inserting).
            let mut running = sessions.keeper.lock().unwrap_or_else(|p| p.into_inner());
            if sessions.book().sessions.is_empty() {
                *running = false;
                return;
            }
        }
        let chores = sessions.plan(sessions.clock.now());
        for session in chores.refresh {
            let refreshing = sessions.clone();
            let started = sessions.conn.spawn_task(async move {
                if let Err(e) = refreshing.refresh(&session).await {
                    tracing::debug!(error = %e, "refreshing an etcd session failed; retrying");
                }
                refreshing.done_with(session.id);
            });
            if !started {
                return;
            }
        }
        for (from, keys) in chores.moves {
            sessions
                .conn
                .spawn_task(sessions.clone().move_waiting(from, keys));
        }
        for (key, session) in chores.overdue {
            sessions
                .conn
                .cleanup(sessions.clone().delete_overdue(key, session));
        }
        for id in chores.revoke {
            sessions.spawn_revoke(id);
        }
    }
}

impl Sessions {
    fn plan(&self, now: Moment) -> Chores {
        let mut chores = Chores::default();
        let floor = self.floor.offset();
        let mut book = self.book();
        // Per session: how many entries, and whether some wait.
        let mut used: HashMap<i64, (usize, bool)> = HashMap::new();
        let mut overdue = Vec::new();
        for (key, entry) in &book.entries {
            let counts = used.entry(entry.session).or_default();
            counts.0 += 1;
            match entry.kind {
                Kind::Waiting => counts.1 = true,
                Kind::Held { paid } | Kind::Doomed { paid } if paid.over(now) => {
                    overdue.push(key.clone());
                }
                _ => {}
            }
        }
        for key in overdue {
            // Its holder's deadline has passed: it is lost, and deleted now
            // (retried a second later if etcd does not confirm).
            if let Some(entry) = book.entries.get_mut(&key) {
                entry.lost.cancel();
                entry.kind = Kind::Doomed {
                    paid: Paid {
                        from: now,
                        ttl: TICK * 10,
                    },
                };
                let session = entry.session;
                chores.overdue.push((
                    Attached {
                        key,
                        revision: entry.revision,
                        value: entry.value.clone(),
                    },
                    session,
                ));
            }
        }
        let Book {
            current,
            sessions,
            entries,
        } = &mut *book;
        sessions.retain(|id, state| {
            // Granted before the fence floor was raised: maybe restored from a
            // backup with keys only the backup remembers (see the module doc).
            if state.status == Status::Live && state.epoch < floor {
                tracing::debug!(
                    session = id,
                    "etcd session granted before the fence floor was raised: retired"
                );
                state.status = Status::Retired;
            }
            let (count, waiting) = used.get(id).copied().unwrap_or_default();
            let count = count + state.users;
            state.empty_since = match (count, state.empty_since) {
                (0, None) => Some(now.mono()),
                (0, since) => since,
                _ => None,
            };
            // An unused session is kept a while for the next lock, as long
            // as its lease may still be alive.
            let idle = state
                .empty_since
                .is_some_and(|since| now.mono().saturating_duration_since(since) >= IDLE)
                || now.since(state.refreshed) > state.handle.ttl;
            let is_current = current.get(&state.handle.ttl) == Some(id);
            let keep = count > 0 || (state.status == Status::Live && is_current && !idle);
            if !keep {
                state.handle.ended.cancel();
                if state.status != Status::Dead {
                    chores.revoke.push(*id);
                }
                return false;
            }
            match state.status {
                Status::Live
                    if waiting
                        && !state.busy
                        && now.since(state.refreshed) >= state.handle.ttl / 3 =>
                {
                    state.busy = true;
                    chores.refresh.push(state.handle.clone());
                }
                Status::Retired if waiting && !state.busy => {
                    state.busy = true;
                    let keys = entries
                        .iter()
                        .filter(|(_, e)| e.session == *id && matches!(e.kind, Kind::Waiting))
                        .map(|(k, e)| Attached {
                            key: k.clone(),
                            revision: e.revision,
                            value: e.value.clone(),
                        })
                        .collect();
                    chores.moves.push((*id, keys));
                }
                _ => {}
            }
            true
        });
        current.retain(|_, id| sessions.contains_key(id));
        chores
    }

    /// Moves a retired session's waiting entries to the current session of
    /// its TTL.
    async fn move_waiting(self: Arc<Self>, from: i64, keys: Vec<Attached>) {
        let outcome = async {
            let ttl = self
                .status(from)
                .map(|(_, ttl)| ttl)
                .ok_or_else(|| LockError::unavailable(BACKEND, "session gone"))?;
            let target = self.for_entry(ttl).await?;
            let moved = self.move_to(from, target.session.id, &keys).await?;
            let mut book = self.book();
            for key in &moved {
                if let Some(entry) = book.entries.get_mut(key) {
                    entry.session = target.session.id;
                    if let Some((queue, n)) = entry.number.take() {
                        free_number(&mut book, from, &queue, n);
                        // Named after the old session: the number stays out
                        // of use there, and nothing on the new one uses it.
                    }
                }
            }
            Ok::<_, LockError>(())
        }
        .await;
        if let Err(e) = outcome {
            tracing::debug!(error = %e, "moving waiting entries off a retired etcd session failed; retrying");
        }
        self.done_with(from);
    }

    fn done_with(&self, session: i64) {
        if let Some(state) = self.book().sessions.get_mut(&session) {
            state.busy = false;
        }
    }

    /// Deletes a key whose time ran out (if it is still that grant: same
    /// create revision and value); if etcd cannot be told, its session is
    /// retired so no refresh extends it.
    async fn delete_overdue(self: Arc<Self>, entry: Attached, session: i64) {
        let Attached {
            key,
            revision,
            value,
        } = entry;
        let txn = Txn::new()
            .when(unchanged(&key, revision, &value))
            .and_then([TxnOp::delete(key.clone(), None)]);
        let deleted = match self.conn.kv() {
            Ok(mut kv) => timed(self.timeout, "delete an expired entry", kv.txn(txn)).await,
            Err(e) => Err(e),
        };
        match deleted {
            Ok(_) => {
                self.forget(&key, revision);
            }
            Err(e) => {
                tracing::debug!(error = %e, "deleting an expired entry failed; its session is retired");
                self.retire(session);
            }
        }
    }
}
