//! One status vocabulary for both ledgers. Scabbard spells statuses `Committed`, Sawtooth
//! `COMMITTED`, and Sawtooth has no `Valid` (a valid batch not yet in a block reads `PENDING`).

use std::fmt;

use thiserror::Error;

/// A batch's status on a ledger, normalised across dialects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchStatus {
    /// Received, not yet executed.
    Pending,
    /// Executed and rejected; final.
    Invalid,
    /// Executed and accepted, not yet committed (scabbard only).
    Valid,
    /// In the ledger; final.
    Committed,
    /// The node does not know the id: never received, forgotten by a restart, or evicted from
    /// its bounded in-memory history.
    Unknown,
}

/// A status word neither dialect uses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown batch status {0:?}")]
pub struct UnknownStatus(pub String);

impl BatchStatus {
    pub const ALL: [BatchStatus; 5] = [
        BatchStatus::Pending,
        BatchStatus::Invalid,
        BatchStatus::Valid,
        BatchStatus::Committed,
        BatchStatus::Unknown,
    ];

    /// Committed and Invalid never change again; a `wait` ends when every id is final.
    pub fn is_final(self) -> bool {
        matches!(self, BatchStatus::Committed | BatchStatus::Invalid)
    }

    /// Scabbard's `statusType`: `Pending`, `Invalid`, `Valid`, `Committed`, `Unknown`.
    pub fn scabbard_name(self) -> &'static str {
        match self {
            BatchStatus::Pending => "Pending",
            BatchStatus::Invalid => "Invalid",
            BatchStatus::Valid => "Valid",
            BatchStatus::Committed => "Committed",
            BatchStatus::Unknown => "Unknown",
        }
    }

    /// Sawtooth's `status`: `PENDING`, `INVALID`, `COMMITTED`, `UNKNOWN`. `Valid` has no
    /// Sawtooth spelling and reads `PENDING`, as a valid batch outside a block does there.
    pub fn sawtooth_name(self) -> &'static str {
        match self {
            BatchStatus::Pending | BatchStatus::Valid => "PENDING",
            BatchStatus::Invalid => "INVALID",
            BatchStatus::Committed => "COMMITTED",
            BatchStatus::Unknown => "UNKNOWN",
        }
    }

    /// Parses scabbard's exact spelling.
    pub fn from_scabbard(text: &str) -> Result<Self, UnknownStatus> {
        Self::ALL
            .into_iter()
            .find(|status| status.scabbard_name() == text)
            .ok_or_else(|| UnknownStatus(text.to_owned()))
    }

    /// Parses Sawtooth's exact spelling. `STATUS_UNSET`, the protobuf default a validator
    /// could leak, reads `Unknown`.
    pub fn from_sawtooth(text: &str) -> Result<Self, UnknownStatus> {
        match text {
            "PENDING" => Ok(BatchStatus::Pending),
            "INVALID" => Ok(BatchStatus::Invalid),
            "COMMITTED" => Ok(BatchStatus::Committed),
            "UNKNOWN" | "STATUS_UNSET" => Ok(BatchStatus::Unknown),
            _ => Err(UnknownStatus(text.to_owned())),
        }
    }

    /// Parses either dialect's spelling, ignoring case: what a liberal reader uses.
    pub fn parse_any(text: &str) -> Result<Self, UnknownStatus> {
        if text.eq_ignore_ascii_case("STATUS_UNSET") {
            return Ok(BatchStatus::Unknown);
        }
        Self::ALL
            .into_iter()
            .find(|status| status.scabbard_name().eq_ignore_ascii_case(text))
            .ok_or_else(|| UnknownStatus(text.to_owned()))
    }
}

/// Displays the scabbard spelling.
impl fmt::Display for BatchStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scabbard_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_round_trips_its_own_spelling() {
        for status in BatchStatus::ALL {
            assert_eq!(
                BatchStatus::from_scabbard(status.scabbard_name()),
                Ok(status)
            );
            let back = BatchStatus::from_sawtooth(status.sawtooth_name()).unwrap();
            let expected = if status == BatchStatus::Valid {
                BatchStatus::Pending
            } else {
                status
            };
            assert_eq!(back, expected);
        }
    }

    #[test]
    fn exact_parsers_refuse_the_other_casing_and_parse_any_does_not() {
        assert!(BatchStatus::from_scabbard("COMMITTED").is_err());
        assert!(BatchStatus::from_sawtooth("Committed").is_err());
        assert!(BatchStatus::from_sawtooth("VALID").is_err());
        assert_eq!(
            BatchStatus::parse_any("cOmMiTtEd"),
            Ok(BatchStatus::Committed)
        );
        assert_eq!(BatchStatus::parse_any("VALID"), Ok(BatchStatus::Valid));
        assert_eq!(
            BatchStatus::from_sawtooth("STATUS_UNSET"),
            Ok(BatchStatus::Unknown)
        );
        assert_eq!(
            BatchStatus::parse_any("done"),
            Err(UnknownStatus("done".into()))
        );
    }

    #[test]
    fn only_committed_and_invalid_are_final() {
        let finals: Vec<_> = BatchStatus::ALL
            .into_iter()
            .filter(|s| s.is_final())
            .collect();
        assert_eq!(finals, vec![BatchStatus::Invalid, BatchStatus::Committed]);
    }
}
