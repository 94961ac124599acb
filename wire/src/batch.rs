//! The protobuf messages of DESIGN.md §5, written by hand with `prost` so the build needs no
//! `protoc` and no build script, and the validation every receiver of a `BatchList` applies.

use std::collections::HashMap;

use prost::Message;
use thiserror::Error;

/// A list of batches, the body of every POST to a ledger.
#[derive(Clone, PartialEq, Message)]
pub struct BatchList {
    #[prost(message, repeated, tag = "1")]
    pub batches: Vec<Batch>,
}

/// One signed batch. Its id is `header_signature`.
#[derive(Clone, PartialEq, Message)]
pub struct Batch {
    #[prost(bytes = "vec", tag = "1")]
    pub header: Vec<u8>,
    #[prost(string, tag = "2")]
    pub header_signature: String,
    #[prost(message, repeated, tag = "3")]
    pub transactions: Vec<Transaction>,
    #[prost(bool, tag = "4")]
    pub trace: bool,
}

/// One signed transaction inside a batch.
#[derive(Clone, PartialEq, Message)]
pub struct Transaction {
    #[prost(bytes = "vec", tag = "1")]
    pub header: Vec<u8>,
    #[prost(string, tag = "2")]
    pub header_signature: String,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
}

impl BatchList {
    /// The batch ids in list order.
    pub fn batch_ids(&self) -> impl Iterator<Item = &str> {
        self.batches
            .iter()
            .map(|batch| batch.header_signature.as_str())
    }
}

/// Length of a batch id: a 64-byte signature in hex.
pub const BATCH_ID_LEN: usize = 128;

/// Why a string is not a batch id.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchIdError {
    #[error("a batch id is {BATCH_ID_LEN} hex characters, this one has {0}")]
    Length(usize),
    #[error("a batch id is hex, this one has {found:?} at position {position}")]
    NotHex { position: usize, found: char },
}

/// Checks that `id` is a batch id: exactly 128 hex characters, upper or lower case.
///
/// Both cases are accepted because the ledgers verify a signature by decoding its hex, which
/// accepts either. Nothing is normalised: an id is kept and compared exactly as sent, so
/// `ab…` and `AB…` are two different ids, as they are on the real nodes. Sawtooth's REST API
/// is stricter on its *query* routes (lowercase only); see [`is_lowercase_batch_id`].
pub fn validate_batch_id(id: &str) -> Result<(), BatchIdError> {
    if let Some((position, found)) = id.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(BatchIdError::NotHex { position, found });
    }
    // Every character is ASCII here, so the byte length is the character count.
    if id.len() != BATCH_ID_LEN {
        return Err(BatchIdError::Length(id.len()));
    }
    Ok(())
}

/// True when `id` matches Sawtooth REST's `[0-9a-f]{128}`, the rule its `batch_statuses`
/// routes apply to the ids they are asked about.
pub fn is_lowercase_batch_id(id: &str) -> bool {
    id.len() == BATCH_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a POSTed body was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchListError {
    #[error("the body is not a protobuf BatchList: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("the BatchList contains no batches")]
    Empty,
    #[error("batch {index} of the BatchList has an invalid id: {source}")]
    InvalidId {
        index: usize,
        #[source]
        source: BatchIdError,
    },
    #[error("batch id {id} appears twice in the BatchList (batches {first} and {second})")]
    DuplicateId {
        id: String,
        first: usize,
        second: usize,
    },
}

/// Decodes a POSTed body and validates it: at least one batch, every batch id valid
/// ([`validate_batch_id`]), no id twice in the same list.
///
/// Signatures are not verified: dltsub holds no keys and the ledger verifies them anyway.
pub fn decode_batch_list(body: &[u8]) -> Result<BatchList, BatchListError> {
    let list = BatchList::decode(body)?;
    if list.batches.is_empty() {
        return Err(BatchListError::Empty);
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(list.batches.len());
    for (index, id) in list.batch_ids().enumerate() {
        validate_batch_id(id).map_err(|source| BatchListError::InvalidId { index, source })?;
        if let Some(first) = seen.insert(id, index) {
            return Err(BatchListError::DuplicateId {
                id: id.to_owned(),
                first,
                second: index,
            });
        }
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: char) -> String {
        std::iter::repeat_n(c, BATCH_ID_LEN).collect()
    }

    fn batch(id: &str, payload: &[u8]) -> Batch {
        Batch {
            header: vec![1, 2, 3],
            header_signature: id.to_owned(),
            transactions: vec![Transaction {
                header: vec![4],
                header_signature: "t".repeat(BATCH_ID_LEN),
                payload: payload.to_vec(),
            }],
            trace: true,
        }
    }

    #[test]
    fn batch_list_round_trips() {
        let list = BatchList {
            batches: vec![batch(&id('a'), b"hello"), batch(&id('B'), b"")],
        };
        let bytes = list.encode_to_vec();
        assert_eq!(BatchList::decode(bytes.as_slice()).unwrap(), list);
        assert_eq!(decode_batch_list(&bytes).unwrap(), list);
    }

    #[test]
    fn field_numbers_match_the_proto() {
        // Batch.header_signature is field 2 of type string: tag byte (2 << 3) | 2 = 0x12.
        let list = BatchList {
            batches: vec![Batch {
                header_signature: "x".into(),
                ..Default::default()
            }],
        };
        assert_eq!(list.encode_to_vec(), vec![0x0a, 0x03, 0x12, 0x01, b'x']);
    }

    #[test]
    fn batch_ids_accept_both_cases_and_nothing_else() {
        assert_eq!(validate_batch_id(&id('a')), Ok(()));
        assert_eq!(validate_batch_id(&id('F')), Ok(()));
        assert_eq!(
            validate_batch_id(&id('a')[1..]),
            Err(BatchIdError::Length(127))
        );
        assert_eq!(validate_batch_id(""), Err(BatchIdError::Length(0)));
        let mut bad = id('0');
        bad.replace_range(5..6, "g");
        assert_eq!(
            validate_batch_id(&bad),
            Err(BatchIdError::NotHex {
                position: 5,
                found: 'g'
            })
        );
        assert!(is_lowercase_batch_id(&id('c')));
        assert!(!is_lowercase_batch_id(&id('C')));
    }

    #[test]
    fn decode_rejects_garbage_empty_bad_ids_and_duplicates() {
        assert!(matches!(
            decode_batch_list(b"\xff\xff\xff"),
            Err(BatchListError::Decode(_))
        ));
        assert_eq!(decode_batch_list(b""), Err(BatchListError::Empty));
        let short = BatchList {
            batches: vec![batch(&id('a'), b""), batch("abc", b"")],
        };
        assert_eq!(
            decode_batch_list(&short.encode_to_vec()),
            Err(BatchListError::InvalidId {
                index: 1,
                source: BatchIdError::Length(3)
            })
        );
        let twice = BatchList {
            batches: vec![
                batch(&id('a'), b""),
                batch(&id('b'), b""),
                batch(&id('a'), b""),
            ],
        };
        assert_eq!(
            decode_batch_list(&twice.encode_to_vec()),
            Err(BatchListError::DuplicateId {
                id: id('a'),
                first: 0,
                second: 2
            })
        );
    }
}
