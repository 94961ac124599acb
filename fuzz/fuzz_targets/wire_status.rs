//! Status words and the ledgers' status answers: `BatchStatus`'s three parsers (each
//! accepts exactly its documented spellings), the submitter's `LedgerState::parse`, and
//! the JSON bodies dltsub reads from a ledger (`parse_statuses`, the wire types).
#![no_main]

use dltsub_submitter::client::{LedgerState, parse_statuses};
use dltsub_wire::BatchStatus;
use dltsub_wire::sawtooth::BatchStatuses;
use dltsub_wire::scabbard::ScabbardBatchInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(status) = BatchStatus::from_scabbard(text) {
            assert_eq!(status.scabbard_name(), text);
        }
        if let Ok(status) = BatchStatus::from_sawtooth(text) {
            assert!(
                status.sawtooth_name() == text
                    || (text == "STATUS_UNSET" && status == BatchStatus::Unknown)
            );
        }
        match BatchStatus::parse_any(text) {
            Ok(status) => assert!(
                status.scabbard_name().eq_ignore_ascii_case(text)
                    || text.eq_ignore_ascii_case("STATUS_UNSET")
            ),
            Err(error) => assert_eq!(error.0, text),
        }
        if let Some(state) = LedgerState::parse(text) {
            let _ = state.is_final();
        }
    }
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data)
        && let Ok(statuses) = parse_statuses(&json)
    {
        let entries = json
            .as_array()
            .or_else(|| json.get("data").and_then(|data| data.as_array()))
            .map_or(0, Vec::len);
        assert_eq!(statuses.len(), entries);
    }
    if let Ok(infos) = serde_json::from_slice::<Vec<ScabbardBatchInfo>>(data) {
        let again = serde_json::to_vec(&infos).expect("serialises");
        serde_json::from_slice::<Vec<ScabbardBatchInfo>>(&again).expect("reads back");
    }
    if let Ok(statuses) = serde_json::from_slice::<BatchStatuses>(data) {
        let again = serde_json::to_vec(&statuses).expect("serialises");
        serde_json::from_slice::<BatchStatuses>(&again).expect("reads back");
    }
});
