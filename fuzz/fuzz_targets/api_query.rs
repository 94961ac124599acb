//! The status routes' query strings: the id lists (`?ids=` of scabbard and
//! `/api/v1/batches`, `?id=` of Sawtooth) and the three `wait` dialects, both on the raw
//! text and on each route's query type as axum's `Query` extractor reads it from a URI.
#![no_main]

use axum::extract::Query;
use axum::http::Uri;
use dltsub::api::v1::{MAX_IDS, StatusesQuery, parse_ids, parse_wait};
use dltsub::api::{MAX_WAIT, sawtooth, scabbard, split_ids};
use libfuzzer_sys::fuzz_target;

/// The id list and every `wait` parser on one pair of values.
fn check(ids: Option<&str>, wait: Option<&str>) {
    let split = split_ids(ids);
    assert!(split.iter().all(|id| !id.is_empty() && !id.contains(',')));
    assert_eq!(
        split.join(","),
        ids.unwrap_or("")
            .split(',')
            .filter(|id| !id.is_empty())
            .collect::<Vec<_>>()
            .join(",")
    );
    if let Ok(parsed) = parse_ids(ids) {
        assert!(!parsed.is_empty() && parsed.len() <= MAX_IDS);
        assert!(parsed.iter().all(|id| dltsub_store::is_batch_id(id)));
        assert_eq!(parsed, split);
    }
    if let Ok(wait) = parse_wait(wait) {
        assert!(wait <= MAX_WAIT);
    }
    let _ = sawtooth::wait_of(wait);
    let _ = scabbard::wait_of(wait);
}

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    check(Some(query), Some(query));
    let Ok(uri) = format!("/batch_statuses?{query}").parse::<Uri>() else {
        return;
    };
    if let Ok(Query(q)) = Query::<sawtooth::StatusQuery>::try_from_uri(&uri) {
        check(q.id.as_deref(), q.wait.as_deref());
    }
    if let Ok(Query(q)) = Query::<scabbard::StatusQuery>::try_from_uri(&uri) {
        check(q.ids.as_deref(), q.wait.as_deref());
    }
    if let Ok(Query(q)) = Query::<StatusesQuery>::try_from_uri(&uri) {
        check(q.ids.as_deref(), q.wait.as_deref());
        let _ = q.service_id;
    }
});
