//! The Sawtooth REST dialect.

use std::time::{Duration, Instant};

use dltsub_devnet::{Dialect, SAWTOOTH_LEDGER};
use dltsub_wire::BatchStatus;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn accepts_only_exactly_application_octet_stream_and_links_absolutely() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let two = ids(1, 3);
    let answer = net.post_ids(&two).await;
    assert_eq!(answer.status, 202);
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        answer.text,
        format!(
            "{{\n  \"link\": \"http://{}/batch_statuses?id={},{}\"\n}}",
            net.devnet.addr(),
            two[0],
            two[1]
        )
    );

    for content_type in ["octet-stream", "application/octet-stream; charset=binary"] {
        let answer = net.post_with(body(&ids(5, 6)), Some(content_type)).await;
        assert_eq!(answer.status, 400, "{content_type}");
        assert_eq!(answer.json()["error"]["code"], 42);
        assert_eq!(answer.json()["error"]["title"], "Wrong Content Type");
    }
    // No Content-Type at all is an exception in the REST API's handler.
    let answer = net.post_with(body(&ids(5, 6)), None).await;
    assert_eq!(answer.status, 500);
    assert!(answer.text.starts_with("500 Internal Server Error"));
    assert_eq!(net.stats().await.ledgers[SAWTOOTH_LEDGER].accepted, 2);
}

#[tokio::test]
async fn refused_bodies_answer_codes_30_34_35() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let empty = net.post(Vec::new()).await;
    assert_eq!(empty.status, 400);
    assert_eq!(
        empty.json(),
        json!({"error": {
            "code": 34,
            "message": "The protobuf BatchList you submitted was empty and contained no Batches. You must submit at least one Batch.",
            "title": "No Batches Submitted"
        }})
    );
    let garbage = net.post(b"\xff\xff\xff\xff".to_vec()).await;
    assert_eq!(garbage.status, 400);
    assert_eq!(garbage.json()["error"]["code"], 35);
    let bad_id = net.post(body(&["xyz".to_owned()])).await;
    assert_eq!(bad_id.status, 400);
    assert_eq!(bad_id.json()["error"]["code"], 30);
    assert_eq!(bad_id.json()["error"]["title"], "Submitted Batches Invalid");
}

#[tokio::test]
async fn statuses_by_get_have_the_rest_api_shape_and_link() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let good = id(1);
    let bad = id(2);
    assert_eq!(net.post_ids(std::slice::from_ref(&good)).await.status, 202);
    assert_eq!(net.post(invalid_body(&bad)).await.status, 202);
    let path = format!("/batch_statuses?wait=5&id={good},{bad},{}", id(3));
    let answer = net.get(&path).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.json(),
        json!({
            "data": [
                {"id": good, "invalid_transactions": [], "status": "COMMITTED"},
                {"id": bad, "invalid_transactions": [
                    {"id": txn_id(&bad), "message": dltsub_devnet::INVALID_PAYLOAD_MESSAGE}
                ], "status": "INVALID"},
                {"id": id(3), "invalid_transactions": [], "status": "UNKNOWN"}
            ],
            "link": format!("http://{}/batch_statuses?id={good},{bad},{}&wait=5", net.devnet.addr(), id(3))
        })
    );
    assert!(
        answer
            .text
            .starts_with("{\n  \"data\": [\n    {\n      \"id\"")
    );
}

#[tokio::test]
async fn status_queries_are_validated_like_the_rest_api() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let missing = net.get("/batch_statuses").await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.json()["error"]["code"], 66);
    // Ids are matched against [0-9a-f]{128}: uppercase is refused here.
    let upper = id(10).replace('a', "A");
    let upper = format!("{}A", &upper[..127]);
    let answer = net.get(&format!("/batch_statuses?id={upper}")).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json()["error"]["code"], 60);
    assert!(
        answer.json()["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with(&upper)
    );
}

#[tokio::test]
async fn statuses_by_post_take_a_json_array_and_have_no_link() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let many = ids(0, 20);
    for chunk in many.chunks(10) {
        assert_eq!(net.post_ids(chunk).await.status, 202);
    }
    let response = net
        .http
        .post(net.url("/batch_statuses?wait=5"))
        .json(&many)
        .send()
        .await
        .unwrap();
    let statuses = answer(response).await;
    assert_eq!(statuses.status, 200);
    let value = statuses.json();
    assert!(value.get("link").is_none());
    let data = value["data"].as_array().unwrap();
    assert_eq!(data.len(), 20);
    assert!(
        data.iter()
            .zip(&many)
            .all(|(d, id)| d["id"] == *id && d["status"] == "COMMITTED")
    );

    let wrong_type = net
        .http
        .post(net.url("/batch_statuses"))
        .header("content-type", "text/plain")
        .body(serde_json::to_vec(&many).unwrap())
        .send()
        .await
        .unwrap();
    let wrong_type = answer(wrong_type).await;
    assert_eq!(wrong_type.status, 400);
    assert_eq!(wrong_type.json()["error"]["code"], 43);
    let empty = answer(
        net.http
            .post(net.url("/batch_statuses"))
            .json(&json!([]))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(empty.status, 400);
    assert_eq!(empty.json()["error"]["code"], 46);
}

#[tokio::test]
async fn back_pressure_is_a_429_with_code_31_and_no_hysteresis() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    assert_eq!(
        net.put_faults(json!({"commit_latency": "200ms"}))
            .await
            .status,
        200
    );
    let soon = ids(0, 1);
    assert_eq!(net.post_ids(&soon).await.status, 202);
    assert_eq!(
        net.put_faults(json!({"commit_latency": "60s"}))
            .await
            .status,
        200
    );
    for chunk in ids(1, 30).chunks(10) {
        assert_eq!(net.post_ids(chunk).await.status, 202);
    }
    let refused = net.post_ids(&ids(100, 101)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.text,
        "{\n  \"error\": {\n    \"code\": 31,\n    \"message\": \"The validator cannot currently accept more batches, due to a full queue.  Please submit your request again.\",\n    \"title\": \"Unable to Accept Batches\"\n  }\n}"
    );
    net.settle(&soon).await;
    // 29 in flight: Sawtooth accepts again at once.
    assert_eq!(net.post_ids(&ids(101, 102)).await.status, 202);
}

#[tokio::test]
async fn a_duplicate_of_a_pending_or_committed_batch_is_dropped() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let once = ids(3, 4);
    assert_eq!(net.post_ids(&once).await.status, 202);
    // Again while pending, and again once committed: both 202, neither executed.
    assert_eq!(net.post_ids(&once).await.status, 202);
    net.settle(&once).await;
    assert_eq!(net.post_ids(&once).await.status, 202);
    net.settle(&once).await;
    assert_eq!(net.committed(SAWTOOTH_LEDGER).await, once);
    let stats = &net.stats().await.ledgers[SAWTOOTH_LEDGER];
    assert_eq!(stats.duplicates, 2);
    assert_eq!(stats.accepted, 1);
    // An invalid batch is not kept: resubmitted, it executes again.
    let bad = id(9);
    assert_eq!(net.post(invalid_body(&bad)).await.status, 202);
    net.settle(std::slice::from_ref(&bad)).await;
    assert_eq!(net.post(invalid_body(&bad)).await.status, 202);
    net.settle(std::slice::from_ref(&bad)).await;
    assert_eq!(net.stats().await.ledgers[SAWTOOTH_LEDGER].invalid, 2);
}

#[tokio::test]
async fn old_invalid_batches_read_unknown_but_committed_ones_stay_committed() {
    let net = start(Dialect::Sawtooth, |c| c.backpressure_high = 1_000).await;
    let bad = id(1_000);
    assert_eq!(net.post(invalid_body(&bad)).await.status, 202);
    let valid = ids(0, 100);
    for chunk in valid.chunks(10) {
        assert_eq!(net.post_ids(chunk).await.status, 202);
    }
    net.settle(&valid).await;
    let statuses = net
        .sawtooth_statuses(&[bad.clone(), valid[0].clone()], None)
        .await;
    // 101 batches: the invalid one fell out of the 100-entry history, the committed one is
    // answered from the chain.
    assert_eq!(statuses.data[0].status, BatchStatus::Unknown);
    assert_eq!(statuses.data[1].status, BatchStatus::Committed);
}

#[tokio::test]
async fn a_restart_forgets_pending_batches_but_not_the_chain() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    let committed = ids(0, 2);
    assert_eq!(net.post_ids(&committed).await.status, 202);
    net.settle(&committed).await;
    net.put_faults(json!({"commit_latency": "60s"})).await;
    let pending = ids(2, 5);
    assert_eq!(net.post_ids(&pending).await.status, 202);
    assert_eq!(net.restart().await, json!({"forgotten": 3}));
    let statuses = net.sawtooth_statuses(&ids(0, 5), None).await;
    let got: Vec<_> = statuses.data.iter().map(|s| s.status).collect();
    use BatchStatus::*;
    assert_eq!(got, vec![Committed, Committed, Unknown, Unknown, Unknown]);
    // A forgotten batch can be submitted again and is not a duplicate.
    net.put_faults(json!({"commit_latency": "10ms"})).await;
    assert_eq!(net.post_ids(&pending).await.status, 202);
    net.settle(&pending).await;
    assert_eq!(net.stats().await.ledgers[SAWTOOTH_LEDGER].duplicates, 0);
    assert_eq!(net.committed(SAWTOOTH_LEDGER).await, ids(0, 5));
}

#[tokio::test]
async fn wait_ends_on_finality_or_timeout() {
    let net = start(Dialect::Sawtooth, |_| {}).await;
    net.put_faults(json!({"commit_latency": "60s"})).await;
    let slow = ids(0, 1);
    assert_eq!(net.post_ids(&slow).await.status, 202);
    let started = Instant::now();
    let statuses = net.sawtooth_statuses(&slow, Some("1")).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert_eq!(statuses.data[0].status, BatchStatus::Pending);

    net.put_faults(json!({"commit_latency": "300ms"})).await;
    net.restart().await;
    let fast = ids(1, 2);
    assert_eq!(net.post_ids(&fast).await.status, 202);
    let started = Instant::now();
    let statuses = net.sawtooth_statuses(&fast, Some("20")).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(statuses.data[0].status, BatchStatus::Committed);
}
