//! Splinter scabbard's JSON, as `libscabbard`'s REST API writes it (actix `.json`, compact).
//!
//! - 202 `{"link":"/scabbard/{circuit}/{service}/batch_statuses?ids=a,b"}` ([`crate::BatchLink`]).
//! - 400 / 500 `{"code":"400","message":"…"}` ([`ScabbardError`]; the code is a *string*).
//! - 429 with an **empty body** (back-pressure; nothing to model here).
//! - `batch_statuses`: a JSON array of [`ScabbardBatchInfo`].
//!
//! Statuses are serde-tagged `{"statusType": …, "message": […]}`: `Pending` and `Unknown` carry
//! an empty array, `Valid`/`Committed` `[{"transaction_id"}]`, `Invalid`
//! `[{"transaction_id","error_message","error_data"}]` where `error_data` is a byte array.
//! Hyperledger Transact's own client deserialises an Invalid status strictly in that shape,
//! so it is what we emit. What we accept is looser: any casing of `statusType`, a missing or
//! `null` `message`, missing fields inside it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::BatchStatus;

/// Messages scabbard answers with, verbatim.
pub const MSG_NOT_A_BATCH_LIST: &str = "Invalid body: not a valid list of batches";
pub const MSG_NO_VALID_BATCHES: &str = "No valid batches provided";
pub const MSG_NO_IDS: &str = "No batch IDs specified";
pub const MSG_INVALID_QUERY: &str = "Invalid query";
pub const MSG_INTERNAL: &str = "The server encountered an error";

/// Seconds a `wait` with no usable number lasts on a scabbard node.
pub const DEFAULT_WAIT_SECS: u64 = 300;

/// Splinter's error body: `{"code":"400","message":"…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScabbardError {
    pub code: String,
    pub message: String,
}

impl ScabbardError {
    pub fn bad_request(message: &str) -> Self {
        Self {
            code: "400".into(),
            message: message.into(),
        }
    }

    pub fn internal_error() -> Self {
        Self {
            code: "500".into(),
            message: MSG_INTERNAL.into(),
        }
    }
}

/// The link of a 202: relative, ids comma-separated in list order.
pub fn batch_statuses_link<'a>(
    circuit: &str,
    service: &str,
    ids: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut link = format!("/scabbard/{circuit}/{service}/batch_statuses?ids=");
    for (i, id) in ids.into_iter().enumerate() {
        if i > 0 {
            link.push(',');
        }
        link.push_str(id);
    }
    link
}

/// One element of a `batch_statuses` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScabbardBatchInfo {
    pub id: String,
    pub status: ScabbardStatus,
    /// When the node first saw the batch (for an Unknown id: when it answered).
    #[serde(default)]
    pub timestamp: ScabbardTimestamp,
}

/// A serialised `std::time::SystemTime`, as serde writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScabbardTimestamp {
    pub secs_since_epoch: u64,
    pub nanos_since_epoch: u32,
}

impl From<SystemTime> for ScabbardTimestamp {
    fn from(time: SystemTime) -> Self {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        Self {
            secs_since_epoch: since.as_secs(),
            nanos_since_epoch: since.subsec_nanos(),
        }
    }
}

impl From<ScabbardTimestamp> for SystemTime {
    fn from(stamp: ScabbardTimestamp) -> Self {
        UNIX_EPOCH + Duration::new(stamp.secs_since_epoch, stamp.nanos_since_epoch)
    }
}

/// A transaction of a Valid or Committed batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScabbardValidTransaction {
    #[serde(default)]
    pub transaction_id: String,
}

/// A transaction that made its batch Invalid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScabbardInvalidTransaction {
    #[serde(default)]
    pub transaction_id: String,
    #[serde(default)]
    pub error_message: String,
    #[serde(default)]
    pub error_data: Vec<u8>,
}

/// A scabbard batch status with its message list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawStatus", into = "RawStatus")]
pub enum ScabbardStatus {
    Unknown,
    Pending,
    Invalid(Vec<ScabbardInvalidTransaction>),
    Valid(Vec<ScabbardValidTransaction>),
    Committed(Vec<ScabbardValidTransaction>),
}

impl ScabbardStatus {
    /// The normalised status.
    pub fn kind(&self) -> BatchStatus {
        match self {
            ScabbardStatus::Unknown => BatchStatus::Unknown,
            ScabbardStatus::Pending => BatchStatus::Pending,
            ScabbardStatus::Invalid(_) => BatchStatus::Invalid,
            ScabbardStatus::Valid(_) => BatchStatus::Valid,
            ScabbardStatus::Committed(_) => BatchStatus::Committed,
        }
    }
}

/// The wire shape; the enum above is built from it so that reading can be liberal.
#[derive(Serialize, Deserialize)]
struct RawStatus {
    #[serde(rename = "statusType")]
    status_type: String,
    #[serde(default)]
    message: Value,
}

impl From<ScabbardStatus> for RawStatus {
    fn from(status: ScabbardStatus) -> Self {
        let status_type = status.kind().scabbard_name().to_owned();
        // Serialising these plain structs into a Value cannot fail.
        let message = match status {
            ScabbardStatus::Unknown | ScabbardStatus::Pending => Value::Array(Vec::new()),
            ScabbardStatus::Invalid(txns) => serde_json::to_value(txns).unwrap_or_default(),
            ScabbardStatus::Valid(txns) | ScabbardStatus::Committed(txns) => {
                serde_json::to_value(txns).unwrap_or_default()
            }
        };
        RawStatus {
            status_type,
            message,
        }
    }
}

impl TryFrom<RawStatus> for ScabbardStatus {
    type Error = String;

    fn try_from(raw: RawStatus) -> Result<Self, Self::Error> {
        let kind = BatchStatus::parse_any(&raw.status_type).map_err(|e| e.to_string())?;
        let message = if raw.message.is_null() {
            Value::Array(Vec::new())
        } else {
            raw.message
        };
        Ok(match kind {
            BatchStatus::Unknown => ScabbardStatus::Unknown,
            BatchStatus::Pending => ScabbardStatus::Pending,
            BatchStatus::Invalid => {
                ScabbardStatus::Invalid(serde_json::from_value(message).map_err(|e| e.to_string())?)
            }
            BatchStatus::Valid => {
                ScabbardStatus::Valid(serde_json::from_value(message).map_err(|e| e.to_string())?)
            }
            BatchStatus::Committed => ScabbardStatus::Committed(
                serde_json::from_value(message).map_err(|e| e.to_string())?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn statuses_serialise_exactly_like_libscabbard() {
        let cases = [
            (
                ScabbardStatus::Unknown,
                json!({"statusType": "Unknown", "message": []}),
            ),
            (
                ScabbardStatus::Pending,
                json!({"statusType": "Pending", "message": []}),
            ),
            (
                ScabbardStatus::Invalid(vec![ScabbardInvalidTransaction {
                    transaction_id: "txid".into(),
                    error_message: "message".into(),
                    error_data: vec![0, 1, 2],
                }]),
                json!({"statusType": "Invalid", "message": [
                    {"transaction_id": "txid", "error_message": "message", "error_data": [0, 1, 2]}
                ]}),
            ),
            (
                ScabbardStatus::Valid(vec![ScabbardValidTransaction {
                    transaction_id: "txid".into(),
                }]),
                json!({"statusType": "Valid", "message": [{"transaction_id": "txid"}]}),
            ),
            (
                ScabbardStatus::Committed(vec![ScabbardValidTransaction {
                    transaction_id: "txid".into(),
                }]),
                json!({"statusType": "Committed", "message": [{"transaction_id": "txid"}]}),
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(serde_json::to_value(&status).unwrap(), expected);
            assert_eq!(
                serde_json::from_value::<ScabbardStatus>(expected).unwrap(),
                status
            );
        }
    }

    #[test]
    fn batch_info_has_the_systemtime_timestamp_shape() {
        let info = ScabbardBatchInfo {
            id: "a".into(),
            status: ScabbardStatus::Pending,
            timestamp: SystemTime::from(ScabbardTimestamp {
                secs_since_epoch: 1_700_000_000,
                nanos_since_epoch: 5,
            })
            .into(),
        };
        let text = serde_json::to_string(&info).unwrap();
        assert_eq!(
            text,
            r#"{"id":"a","status":{"statusType":"Pending","message":[]},"timestamp":{"secs_since_epoch":1700000000,"nanos_since_epoch":5}}"#
        );
        assert_eq!(
            serde_json::from_str::<ScabbardBatchInfo>(&text).unwrap(),
            info
        );
    }

    #[test]
    fn reading_is_liberal() {
        let status: ScabbardStatus =
            serde_json::from_value(json!({"statusType": "COMMITTED"})).unwrap();
        assert_eq!(status, ScabbardStatus::Committed(vec![]));
        let status: ScabbardStatus =
            serde_json::from_value(json!({"statusType": "Invalid", "message": [{}]})).unwrap();
        assert_eq!(status.kind(), BatchStatus::Invalid);
        assert!(serde_json::from_value::<ScabbardStatus>(json!({"statusType": "Done"})).is_err());
        let info: ScabbardBatchInfo =
            serde_json::from_value(json!({"id": "x", "status": {"statusType": "Unknown"}}))
                .unwrap();
        assert_eq!(info.timestamp, ScabbardTimestamp::default());
    }

    #[test]
    fn errors_and_links_have_the_real_shapes() {
        assert_eq!(
            serde_json::to_string(&ScabbardError::bad_request(MSG_NO_VALID_BATCHES)).unwrap(),
            r#"{"code":"400","message":"No valid batches provided"}"#
        );
        assert_eq!(
            batch_statuses_link("c1", "s1", ["aa", "bb"]),
            "/scabbard/c1/s1/batch_statuses?ids=aa,bb"
        );
    }
}
