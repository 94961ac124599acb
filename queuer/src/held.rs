//! What this instance may act on: the claims the database said it holds at the last
//! successful renewal, and until when it may trust them.
//!
//! **Self-fencing.** The term is measured from the moment the renewal was *sent* (before
//! the tick's transaction began), on the monotonic clock: the database extended the
//! expiries at some instant after that, so `sent_at + fast_expiry` is never later than the
//! real fast expiry. A safety margin covers clock-rate differences and the time between
//! the check and the socket write. No POST starts for a service past the deadline; a
//! process stalled between the check and the write is the one residual window for a
//! duplicate POST, which the chaos suite measures.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// The claims held and the self-fencing deadline, as of the last successful tick.
#[derive(Debug, Clone)]
pub struct HeldClaims {
    /// service_id → epoch.
    pub epochs: BTreeMap<String, i64>,
    /// No submission may start after this instant (monotonic clock).
    pub valid_until: Instant,
}

impl HeldClaims {
    /// Nothing held, already expired: the state before the first tick.
    pub fn none() -> Self {
        Self {
            epochs: BTreeMap::new(),
            valid_until: Instant::now(),
        }
    }

    /// The deadline for claims renewed by a request sent at `sent_at`.
    pub fn deadline(sent_at: Instant, fast_expiry: Duration, margin: Duration) -> Instant {
        sent_at + fast_expiry.saturating_sub(margin)
    }

    /// May a submission for `service_id` under `epoch` start at `now`?
    pub fn may_submit(&self, service_id: &str, epoch: i64, now: Instant) -> bool {
        now < self.valid_until && self.epochs.get(service_id) == Some(&epoch)
    }

    pub fn len(&self) -> usize {
        self.epochs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.epochs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn submissions_stop_at_the_deadline_and_on_epoch_change() {
        let sent_at = Instant::now();
        let held = HeldClaims {
            epochs: BTreeMap::from([("svc".to_string(), 3)]),
            valid_until: HeldClaims::deadline(
                sent_at,
                Duration::from_secs(10),
                Duration::from_secs(1),
            ),
        };
        assert!(held.may_submit("svc", 3, Instant::now()));
        assert!(!held.may_submit("svc", 2, Instant::now()), "stale epoch");
        assert!(!held.may_submit("other", 3, Instant::now()), "not held");
        tokio::time::advance(Duration::from_millis(8_999)).await;
        assert!(held.may_submit("svc", 3, Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !held.may_submit("svc", 3, Instant::now()),
            "past sent_at + fast - margin"
        );
    }
}
