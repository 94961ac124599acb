//! What a ledger answer means for a batch: pure functions from an answer to a
//! [`Transition`], kept apart from the loops so every rule is unit-tested.

use std::time::Duration;

use dltsub_store::{BatchStatus, PollableBatch, Transition, UnknownSince};
use dltsub_submitter::{LedgerState, LedgerStatus, PostOutcome};
use rand::Rng;

/// Capped exponential backoff with jitter for batches sent back to QUEUED.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before attempt `attempts + 1`: `base × 2^(attempts − 1)`, capped at `max`,
    /// then scaled by a random factor in [0.5, 1] so retries of many batches spread out.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = attempts.clamp(1, 30) as u32 - 1;
        let raw = self
            .base
            .saturating_mul(1 << exponent.min(20))
            .min(self.max);
        raw.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}

/// The transition after a POST of a batch. `retry_after` is the backoff should the batch
/// go back to QUEUED: one delay for all batches of a POST, so they are retried together
/// and in order. `batches_in_post` > 1 means the batch went in a BatchList with others.
pub fn after_post(
    seq: i64,
    outcome: &PostOutcome,
    retry_after: Duration,
    batches_in_post: usize,
) -> Transition {
    let from = BatchStatus::Submitting;
    match outcome {
        // A 400 on a list of several batches does not say which one is bad: retry each
        // alone (the submitter sends retried batches one per POST) and let the ledger
        // judge it.
        PostOutcome::Rejected { message } if batches_in_post > 1 => {
            let mut transition = Transition::new(seq, from, BatchStatus::Queued);
            transition.retry_after = Some(Duration::ZERO);
            transition.last_error = Some(format!("BatchList rejected; retrying alone: {message}"));
            transition
        }
        PostOutcome::Accepted => {
            let mut transition = Transition::new(seq, from, BatchStatus::Pending);
            transition.unknown_since = UnknownSince::Clear;
            transition
        }
        PostOutcome::Rejected { message } => {
            let mut transition = Transition::new(seq, from, BatchStatus::Invalid);
            transition.dlt_message = Some(message.clone());
            transition.detail = Some("rejected by the ledger (400)".into());
            transition
        }
        PostOutcome::BackPressure { status } => {
            let mut transition = Transition::new(seq, from, BatchStatus::Queued);
            transition.retry_after = Some(retry_after);
            transition.last_error = Some(format!("ledger back-pressure ({status})"));
            transition
        }
        PostOutcome::NotSent { error } => {
            let mut transition = Transition::new(seq, from, BatchStatus::Queued);
            transition.retry_after = Some(retry_after);
            transition.last_error = Some(error.clone());
            transition
        }
        // The deliberately broken variant of chaos builds: retry without asking the ledger,
        // which re-executes the batch on scabbard. Never compiled into a production build.
        PostOutcome::InDoubt { error } if dltsub_chaos_points::broken("resubmit-in-doubt") => {
            let mut transition = Transition::new(seq, from, BatchStatus::Queued);
            transition.retry_after = Some(Duration::ZERO);
            transition.last_error = Some(format!("BROKEN VARIANT: resubmitting blindly: {error}"));
            transition
        }
        PostOutcome::InDoubt { error } => {
            let mut transition = Transition::new(seq, from, BatchStatus::InDoubt);
            transition.last_error = Some(error.clone());
            transition.detail = Some("the ledger may or may not have it".into());
            transition
        }
    }
}

/// The transition after the ledger reported `status` for a batch waiting for its verdict,
/// or `None` when nothing changes. Unknown sends a batch back to QUEUED (resubmission)
/// only after it has read Unknown for `unknown_grace` without interruption: Unknown also
/// means "evicted from a bounded history" or "node restarted", not only "never received".
pub fn after_status(
    batch: &PollableBatch,
    status: &LedgerStatus,
    unknown_grace: Duration,
) -> Option<Transition> {
    let from: BatchStatus = batch.status.parse().ok()?;
    let message = status.message.as_ref().map(ToString::to_string);
    let to = match status.state {
        LedgerState::Committed => BatchStatus::Committed,
        LedgerState::Invalid => BatchStatus::Invalid,
        LedgerState::Valid => BatchStatus::Valid,
        LedgerState::Pending => BatchStatus::Pending,
        LedgerState::Unknown => {
            let grace_us = i64::try_from(unknown_grace.as_micros()).unwrap_or(i64::MAX);
            let mut transition = match batch.unknown_since_us {
                Some(since) if batch.read_at_us - since >= grace_us => {
                    let mut transition = Transition::new(batch.seq, from, BatchStatus::Queued);
                    transition.retry_after = Some(Duration::ZERO);
                    transition.unknown_since = UnknownSince::Clear;
                    transition.detail = Some(
                        "unknown to the ledger for the whole grace period; resubmitting".into(),
                    );
                    transition
                }
                Some(_) => return None,
                None => {
                    let mut transition = Transition::new(batch.seq, from, from);
                    transition.unknown_since = UnknownSince::Mark;
                    transition
                }
            };
            transition.last_error = Some("ledger reports the batch Unknown".into());
            return Some(transition);
        }
    };
    if to == from && batch.unknown_since_us.is_none() {
        return None;
    }
    let mut transition = Transition::new(batch.seq, from, to);
    transition.unknown_since = UnknownSince::Clear;
    transition.dlt_message = message;
    Some(transition)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pollable(status: &str, unknown_since_us: Option<i64>, read_at_us: i64) -> PollableBatch {
        PollableBatch {
            seq: 7,
            service_id: "c::s".into(),
            batch_id: "b".into(),
            status: status.into(),
            unknown_since_us,
            submit_epoch: Some(1),
            read_at_us,
        }
    }

    fn ledger(state: LedgerState) -> LedgerStatus {
        LedgerStatus {
            batch_id: "b".into(),
            state,
            message: None,
        }
    }

    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn post_outcomes_map_to_the_lifecycle() {
        let backoff = Duration::from_millis(300);
        assert_eq!(
            after_post(1, &PostOutcome::Accepted, backoff, 1).to,
            BatchStatus::Pending
        );
        let rejected = PostOutcome::Rejected {
            message: "{\"code\":\"400\"}".into(),
        };
        let invalid = after_post(1, &rejected, backoff, 1);
        assert_eq!(
            after_post(1, &rejected, backoff, 3).to,
            BatchStatus::Queued,
            "in a list: retried alone"
        );
        assert_eq!(invalid.to, BatchStatus::Invalid);
        assert_eq!(invalid.dlt_message.as_deref(), Some("{\"code\":\"400\"}"));
        let retry = after_post(1, &PostOutcome::BackPressure { status: 429 }, backoff, 1);
        assert_eq!(retry.to, BatchStatus::Queued);
        assert_eq!(retry.retry_after, Some(backoff));
        let refused = PostOutcome::NotSent {
            error: "refused".into(),
        };
        assert_eq!(after_post(1, &refused, backoff, 1).to, BatchStatus::Queued);
        let timeout = PostOutcome::InDoubt {
            error: "timeout".into(),
        };
        assert_eq!(after_post(1, &timeout, backoff, 1).to, BatchStatus::InDoubt);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(5),
        };
        let third = backoff.delay(3);
        assert!(
            third >= Duration::from_millis(200) && third <= Duration::from_millis(400),
            "{third:?}"
        );
        for attempts in [10, 30, i32::MAX] {
            assert!(backoff.delay(attempts) <= Duration::from_secs(5));
        }
    }

    #[test]
    fn final_statuses_are_recorded_with_the_message() {
        let mut invalid = ledger(LedgerState::Invalid);
        invalid.message = Some(serde_json::json!([{"error_message": "bad"}]));
        let transition = after_status(&pollable("PENDING", None, 0), &invalid, GRACE).unwrap();
        assert_eq!(transition.to, BatchStatus::Invalid);
        assert!(transition.dlt_message.unwrap().contains("bad"));
        let committed = after_status(
            &pollable("IN_DOUBT", None, 0),
            &ledger(LedgerState::Committed),
            GRACE,
        )
        .unwrap();
        assert_eq!(
            (committed.from, committed.to),
            (BatchStatus::InDoubt, BatchStatus::Committed)
        );
    }

    #[test]
    fn in_doubt_known_to_the_ledger_becomes_pending() {
        let t = after_status(
            &pollable("IN_DOUBT", None, 0),
            &ledger(LedgerState::Pending),
            GRACE,
        )
        .unwrap();
        assert_eq!(t.to, BatchStatus::Pending);
        assert!(
            after_status(
                &pollable("PENDING", None, 0),
                &ledger(LedgerState::Pending),
                GRACE
            )
            .is_none()
        );
    }

    #[test]
    fn unknown_is_resubmitted_only_after_the_grace_period() {
        let first = after_status(
            &pollable("PENDING", None, 1_000),
            &ledger(LedgerState::Unknown),
            GRACE,
        )
        .unwrap();
        assert_eq!(
            (first.to, first.unknown_since),
            (BatchStatus::Pending, UnknownSince::Mark)
        );
        assert!(
            after_status(
                &pollable("PENDING", Some(0), 9_999_999),
                &ledger(LedgerState::Unknown),
                GRACE
            )
            .is_none()
        );
        let resubmit = after_status(
            &pollable("IN_DOUBT", Some(0), 10_000_000),
            &ledger(LedgerState::Unknown),
            GRACE,
        )
        .unwrap();
        assert_eq!(resubmit.to, BatchStatus::Queued);
        assert_eq!(resubmit.unknown_since, UnknownSince::Clear);
        // Known again before the grace ran out: the run of Unknown ends.
        let known = after_status(
            &pollable("PENDING", Some(0), 5),
            &ledger(LedgerState::Pending),
            GRACE,
        )
        .unwrap();
        assert_eq!(known.unknown_since, UnknownSince::Clear);
    }
}
