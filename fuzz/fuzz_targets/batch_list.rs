//! A POSTed body as the submit routes read it: `decode_batch_list` (protobuf, at least one
//! batch, valid and distinct batch ids), then what the API stores (one BatchList per
//! batch, `one_list_per_batch`) and what the submitter POSTs (those lists concatenated).
#![no_main]

use std::collections::HashSet;

use dltsub::api::one_list_per_batch;
use dltsub_wire::{BatchList, BatchListError, decode_batch_list, validate_batch_id};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let list = match decode_batch_list(data) {
        Ok(list) => list,
        Err(error) => {
            // Every refusal has a message, and a decode error is the only kind that
            // re-decoding as a plain BatchList also gives.
            let _ = error.to_string();
            if !matches!(error, BatchListError::Decode(_)) {
                assert!(BatchList::decode(data).is_ok());
            }
            return;
        }
    };
    assert!(!list.batches.is_empty());
    let mut seen = HashSet::new();
    for id in list.batch_ids() {
        assert_eq!(validate_batch_id(id), Ok(()), "{id:?}");
        // The store's check (and the schema's CHECK) agree with the wire's.
        assert!(dltsub_store::is_batch_id(id), "{id:?}");
        assert!(seen.insert(id), "duplicate {id:?} accepted");
    }
    // Re-encoding gives a body that decodes to the same list.
    assert_eq!(decode_batch_list(&list.encode_to_vec()).as_ref(), Ok(&list));
    // Stored one per batch, each a valid BatchList of exactly that batch ...
    let stored = one_list_per_batch(list.clone());
    assert_eq!(stored.len(), list.batches.len());
    let mut concatenated = Vec::new();
    for (new, batch) in stored.iter().zip(&list.batches) {
        assert_eq!(new.batch_id, batch.header_signature);
        let one = decode_batch_list(&new.serialized_batch).expect("a stored batch decodes");
        assert_eq!(one.batches.as_slice(), std::slice::from_ref(batch));
        concatenated.extend_from_slice(&new.serialized_batch);
    }
    // ... and the submitter's concatenation of them is the list again, in order.
    assert_eq!(decode_batch_list(&concatenated).as_ref(), Ok(&list));
});
