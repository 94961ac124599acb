#![doc = include_str!("../README.md")]

mod batch;
pub mod sawtooth;
pub mod scabbard;
mod status;

pub use batch::{
    BATCH_ID_LEN, Batch, BatchIdError, BatchList, BatchListError, Transaction, decode_batch_list,
    is_lowercase_batch_id, validate_batch_id,
};
pub use status::{BatchStatus, UnknownStatus};

/// The one `Content-Type` both ledgers document for a POSTed `BatchList`.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// The links both dialects answer a 202 with: `{"link": "…"}`.
///
/// Scabbard's link is relative (`/scabbard/{circuit}/{service}/batch_statuses?ids=…`),
/// Sawtooth's is absolute (`http://host/batch_statuses?id=…`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchLink {
    pub link: String,
}
