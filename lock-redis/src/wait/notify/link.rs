//! The subscription connection: one task per backend instance that
//! subscribes, dispatches what it hears, `PING`s while anything listens,
//! reconnects with backoff, and unsubscribes before it ends at shutdown.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use lockcore::Backoff;

use super::{Link, Notifier, reconnect_backoff};

impl Notifier {
    async fn connect(&self, wake: bool) -> redis::RedisResult<redis::aio::PubSub> {
        let mut pubsub = self.target.client().get_async_pubsub().await?;
        let mut channels = vec![self.evictions.as_str()];
        if wake {
            channels.push(&self.channel);
        }
        pubsub.subscribe(channels).await?;
        Ok(pubsub)
    }

    /// Keeps the subscription connection up until shutdown.
    pub(super) async fn run(self: Arc<Self>) {
        let mut subscriptions: u64 = 0;
        let mut failures: u32 = 0;
        let backoff = reconnect_backoff();
        loop {
            let mut wake = self.wants_wake.load(Ordering::SeqCst);
            // Reconnecting: the primary may have moved (Sentinel).
            if subscriptions + u64::from(failures) > 0 {
                tokio::select! {
                    _ = self.shutdown.cancelled() => return,
                    _ = tokio::time::timeout(self.timeout, self.target.refresh()) => {}
                }
            }
            let connected = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                s = tokio::time::timeout(self.timeout, self.connect(wake)) => s,
            };
            let pubsub = match connected {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "redis pub/sub subscribe failed");
                    self.link_down(&backoff, &mut failures).await;
                    continue;
                }
                Err(_) => {
                    tracing::debug!("redis pub/sub subscribe timed out");
                    self.link_down(&backoff, &mut failures).await;
                    continue;
                }
            };
            subscriptions += 1;
            failures = 0;
            self.subscribed(subscriptions, wake);
            if subscriptions > 1 {
                self.wake_all();
            }
            let (mut sink, mut messages) = pubsub.split();
            let mut ping = tokio::time::interval(self.ping_every);
            ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = self.shutdown.cancelled() => {
                        // The server lets go of the subscription before the
                        // connection is dropped.
                        let mut channels = vec![self.evictions.as_str()];
                        if wake {
                            channels.push(&self.channel);
                        }
                        let _ = tokio::time::timeout(self.timeout, sink.unsubscribe(channels)).await;
                        return;
                    }
                    msg = messages.next() => match msg {
                        Some(msg) => {
                            let payload = String::from_utf8_lossy(msg.get_payload_bytes());
                            if msg.get_channel_name() == self.evictions {
                                self.evicted(&payload);
                            } else {
                                self.dispatch(&payload);
                            }
                        }
                        None => break,
                    },
                    _ = self.wake_wanted.notified(), if !wake => {
                        match tokio::time::timeout(self.timeout, sink.subscribe(&self.channel)).await {
                            Ok(Ok(())) => {
                                wake = true;
                                self.link.send_replace(Link::Up { wake });
                            }
                            _ => break,
                        }
                    }
                    _ = ping.tick() => {
                        if !self.in_use() {
                            continue;
                        }
                        let pong = tokio::time::timeout(self.ping_every, sink.ping::<redis::Value>()).await;
                        if !matches!(pong, Ok(Ok(_))) {
                            tracing::debug!("redis pub/sub connection does not answer PING");
                            break;
                        }
                    }
                }
            }
            tracing::debug!("redis pub/sub connection lost; reconnecting");
            self.link_down(&backoff, &mut failures).await;
        }
    }

    /// Marks the link down and pauses before the next attempt. Registered
    /// waits keep sleeping (bounded by their re-check) and are all woken
    /// once the link is back; new ones poll until then. Leases are checked
    /// once the link is back.
    async fn link_down(&self, backoff: &Backoff, failures: &mut u32) {
        self.holds().subscription = None;
        self.link.send_replace(Link::Down);
        let delay = backoff.delay(*failures);
        *failures = failures.saturating_add(1);
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }
}
