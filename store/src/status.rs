//! The lifecycle of a batch inside dltsub (DESIGN.md §4).

use std::fmt;
use std::str::FromStr;

/// Where a batch stands. Stored as the upper-case name in `batch_statuses.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchStatus {
    /// Accepted and waiting for its turn (order, `max_in_flight`, backoff).
    Queued,
    /// Handed to the submitter; a POST may or may not have reached the ledger.
    Submitting,
    /// The ledger answered 202 and has not decided yet.
    Pending,
    /// The ledger validated it; not yet committed.
    Valid,
    /// We don't know whether the ledger received it (timeout, reset after sending, 5xx,
    /// or an older epoch's submission found after a takeover). Resolved by asking the ledger.
    InDoubt,
    /// On the ledger. Terminal.
    Committed,
    /// Rejected by the ledger. Terminal.
    Invalid,
    /// Withdrawn by an operator before submission. Terminal.
    Cancelled,
}

impl BatchStatus {
    pub const ALL: [BatchStatus; 8] = [
        BatchStatus::Queued,
        BatchStatus::Submitting,
        BatchStatus::Pending,
        BatchStatus::Valid,
        BatchStatus::InDoubt,
        BatchStatus::Committed,
        BatchStatus::Invalid,
        BatchStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Queued => "QUEUED",
            BatchStatus::Submitting => "SUBMITTING",
            BatchStatus::Pending => "PENDING",
            BatchStatus::Valid => "VALID",
            BatchStatus::InDoubt => "IN_DOUBT",
            BatchStatus::Committed => "COMMITTED",
            BatchStatus::Invalid => "INVALID",
            BatchStatus::Cancelled => "CANCELLED",
        }
    }

    /// A terminal batch never changes again and no longer blocks its service's queue.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            BatchStatus::Committed | BatchStatus::Invalid | BatchStatus::Cancelled
        )
    }
}

impl fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BatchStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        BatchStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == text)
            .ok_or_else(|| format!("unknown batch status {text:?}"))
    }
}
