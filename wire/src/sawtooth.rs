//! Sawtooth REST API JSON, as `sawtooth_rest_api` writes it: `json.dumps(…, indent=2,
//! separators=(',', ': '), sort_keys=True)`. [`to_json`] reproduces that layout, and the
//! structs here declare their fields in alphabetical order so the output matches byte for byte.
//!
//! - 202 `{"link": "http://host/batch_statuses?id=a,b"}` ([`crate::BatchLink`], absolute).
//! - Errors `{"error": {"code": 31, "message": "…", "title": "…"}}` ([`ErrorKind`]; the code
//!   is a number).
//! - `batch_statuses` → `{"data": [{"id", "invalid_transactions", "status"}], "link"}`; the
//!   `link` is absent when the ids came in a `POST` body.

use serde::{Deserialize, Serialize};

use crate::BatchStatus;

/// Seconds a `wait` with no usable number lasts: 95% of the REST API's default 300 s timeout.
pub const DEFAULT_WAIT_SECS: u64 = 285;

/// Writes `value` the way the Sawtooth REST API does (two-space indent, `": "`).
pub fn to_json<T: Serialize>(value: &T) -> String {
    // Serialising the plain structs of this module cannot fail.
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// The REST API errors a batch submitter can meet, from `sawtooth_rest_api/exceptions.py`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    UnknownValidatorError,
    ValidatorNotReady,
    ValidatorTimedOut,
    ValidatorDisconnected,
    SubmittedBatchesInvalid,
    BatchQueueFull,
    NoBatchesSubmitted,
    BadProtobufSubmitted,
    SubmissionWrongContentType,
    StatusWrongContentType,
    StatusBodyInvalid,
    InvalidResourceId,
    StatusIdQueryInvalid,
}

impl ErrorKind {
    /// The fixed `code` of the JSON body.
    pub fn code(self) -> u32 {
        match self {
            ErrorKind::UnknownValidatorError => 10,
            ErrorKind::ValidatorNotReady => 15,
            ErrorKind::ValidatorTimedOut => 17,
            ErrorKind::ValidatorDisconnected => 18,
            ErrorKind::SubmittedBatchesInvalid => 30,
            ErrorKind::BatchQueueFull => 31,
            ErrorKind::NoBatchesSubmitted => 34,
            ErrorKind::BadProtobufSubmitted => 35,
            ErrorKind::SubmissionWrongContentType => 42,
            ErrorKind::StatusWrongContentType => 43,
            ErrorKind::StatusBodyInvalid => 46,
            ErrorKind::InvalidResourceId => 60,
            ErrorKind::StatusIdQueryInvalid => 66,
        }
    }

    /// The HTTP status answered with it.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::UnknownValidatorError => 500,
            ErrorKind::ValidatorNotReady
            | ErrorKind::ValidatorTimedOut
            | ErrorKind::ValidatorDisconnected => 503,
            ErrorKind::BatchQueueFull => 429,
            _ => 400,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ErrorKind::UnknownValidatorError => "Unknown Validator Error",
            ErrorKind::ValidatorNotReady => "Validator Not Ready",
            ErrorKind::ValidatorTimedOut => "Validator Timed Out",
            ErrorKind::ValidatorDisconnected => "Validator Disconnected",
            ErrorKind::SubmittedBatchesInvalid => "Submitted Batches Invalid",
            ErrorKind::BatchQueueFull => "Unable to Accept Batches",
            ErrorKind::NoBatchesSubmitted => "No Batches Submitted",
            ErrorKind::BadProtobufSubmitted => "Protobuf Not Decodable",
            ErrorKind::SubmissionWrongContentType | ErrorKind::StatusWrongContentType => {
                "Wrong Content Type"
            }
            ErrorKind::StatusBodyInvalid => "Bad Status Request",
            ErrorKind::InvalidResourceId => "Invalid Resource Id",
            ErrorKind::StatusIdQueryInvalid => "Id Query Invalid or Missing",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            ErrorKind::UnknownValidatorError => {
                "An unknown error occurred with the validator while processing your request."
            }
            ErrorKind::ValidatorNotReady => {
                "The validator has no genesis block, and is not yet ready to be queried. \
                 Try your request again later."
            }
            ErrorKind::ValidatorTimedOut => {
                "The request timed out while waiting for a response from the validator. \
                 Your request may or may not have been processed."
            }
            ErrorKind::ValidatorDisconnected => {
                "The validator disconnected before sending a response. Try your request again later."
            }
            ErrorKind::SubmittedBatchesInvalid => {
                "The submitted BatchList was rejected by the validator. It was poorly formed, \
                 or has an invalid signature."
            }
            ErrorKind::BatchQueueFull => {
                "The validator cannot currently accept more batches, due to a full queue.  \
                 Please submit your request again."
            }
            ErrorKind::NoBatchesSubmitted => {
                "The protobuf BatchList you submitted was empty and contained no Batches. \
                 You must submit at least one Batch."
            }
            ErrorKind::BadProtobufSubmitted => {
                "The protobuf BatchList you submitted was malformed and could not be read."
            }
            ErrorKind::SubmissionWrongContentType => {
                "Batches must be submitted in a BatchList protobuf binary, with a \
                 'Content-Type' header of 'application/octet-stream'."
            }
            ErrorKind::StatusWrongContentType => {
                "Requests for batch statuses sent as a POST must have a 'Content-Type' header \
                 of 'application/json'."
            }
            ErrorKind::StatusBodyInvalid => {
                "Requests for batch statuses sent as a POST must have a JSON formatted body \
                 with an array of at least one id string."
            }
            ErrorKind::InvalidResourceId => {
                "Blockchain items are identified by 128 character hex-strings. A submitted \
                 block, batch, or transaction id was invalid: "
            }
            ErrorKind::StatusIdQueryInvalid => {
                "Requests for batch statuses sent as a GET request must have an 'id' query \
                 parameter with a comma-separated list of at least one batch id."
            }
        }
    }

    /// The JSON body, with `additional_info` appended to the message as the REST API does
    /// (it carries the offending id for [`ErrorKind::InvalidResourceId`]).
    pub fn body(self, additional_info: &str) -> ErrorBody {
        ErrorBody {
            error: SawtoothError {
                code: self.code(),
                message: format!("{}{additional_info}", self.message()),
                title: self.title().to_owned(),
            },
        }
    }
}

/// `{"error": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: SawtoothError,
}

/// The error object; fields in `sort_keys` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SawtoothError {
    pub code: u32,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub title: String,
}

/// A `batch_statuses` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchStatuses {
    pub data: Vec<SawtoothBatchStatus>,
    /// The queried URL, absolute; only for a GET.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// One batch of a `batch_statuses` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SawtoothBatchStatus {
    pub id: String,
    #[serde(default)]
    pub invalid_transactions: Vec<InvalidTransaction>,
    #[serde(with = "status_serde")]
    pub status: BatchStatus,
}

/// A transaction that made its batch INVALID. The REST API drops empty strings, so `message`
/// and `extended_data` (base64 of the validator's bytes, kept opaque here) may be missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidTransaction {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extended_data: String,
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Writes Sawtooth's spelling, reads any casing of either dialect's.
mod status_serde {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    use crate::BatchStatus;

    pub fn serialize<S: Serializer>(status: &BatchStatus, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(status.sawtooth_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BatchStatus, D::Error> {
        let text = String::deserialize(d)?;
        BatchStatus::parse_any(&text).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn queue_full_body_is_byte_exact() {
        assert_eq!(ErrorKind::BatchQueueFull.http_status(), 429);
        assert_eq!(
            to_json(&ErrorKind::BatchQueueFull.body("")),
            "{\n  \"error\": {\n    \"code\": 31,\n    \"message\": \"The validator cannot \
             currently accept more batches, due to a full queue.  Please submit your request \
             again.\",\n    \"title\": \"Unable to Accept Batches\"\n  }\n}"
        );
    }

    #[test]
    fn submission_errors_have_their_codes() {
        let codes: Vec<_> = [
            ErrorKind::SubmittedBatchesInvalid,
            ErrorKind::NoBatchesSubmitted,
            ErrorKind::BadProtobufSubmitted,
        ]
        .into_iter()
        .map(|kind| (kind.code(), kind.http_status()))
        .collect();
        assert_eq!(codes, vec![(30, 400), (34, 400), (35, 400)]);
        let body = ErrorKind::InvalidResourceId.body("xyz");
        assert!(body.error.message.ends_with("was invalid: xyz"));
    }

    #[test]
    fn statuses_round_trip_in_sorted_key_order() {
        let statuses = BatchStatuses {
            data: vec![
                SawtoothBatchStatus {
                    id: "a".into(),
                    invalid_transactions: vec![],
                    status: BatchStatus::Valid,
                },
                SawtoothBatchStatus {
                    id: "b".into(),
                    invalid_transactions: vec![InvalidTransaction {
                        extended_data: String::new(),
                        id: "t".into(),
                        message: "bad".into(),
                    }],
                    status: BatchStatus::Invalid,
                },
            ],
            link: Some("http://h/batch_statuses?id=a,b".into()),
        };
        let text = to_json(&statuses);
        assert!(text.starts_with("{\n  \"data\": [\n    {\n      \"id\": \"a\",\n      \"invalid_transactions\": [],\n      \"status\": \"PENDING\"\n    },"));
        assert!(!text.contains("extended_data"));
        let back: BatchStatuses = serde_json::from_str(&text).unwrap();
        assert_eq!(back.data[0].status, BatchStatus::Pending);
        assert_eq!(back.data[1], statuses.data[1]);
        let post_answer = serde_json::to_value(BatchStatuses {
            data: vec![],
            link: None,
        })
        .unwrap();
        assert_eq!(post_answer, json!({"data": []}));
        let liberal: SawtoothBatchStatus =
            serde_json::from_value(json!({"id": "x", "status": "Committed"})).unwrap();
        assert_eq!(liberal.status, BatchStatus::Committed);
    }
}
