//! The scabbard dialect.

use std::time::{Duration, Instant};

use dltsub_devnet::{Dialect, Latency};
use dltsub_wire::BatchStatus;
use dltsub_wire::scabbard::{ScabbardInvalidTransaction, ScabbardStatus, ScabbardValidTransaction};
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn accepts_a_batch_list_with_a_relative_link_whatever_the_content_type() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let two = ids(1, 3);
    let answer = net.post_ids(&two).await;
    assert_eq!(answer.status, 202);
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        answer.text,
        format!(
            r#"{{"link":"/scabbard/{CIRCUIT}/{SERVICE}/batch_statuses?ids={},{}"}}"#,
            two[0], two[1]
        )
    );
    // Transact's workload runner sends `octet-stream`; scabbard never looks at the header.
    for content_type in [Some("octet-stream"), None, Some("text/plain")] {
        let answer = net.post_with(body(&ids(10, 11)), content_type).await;
        assert_eq!(answer.status, 202, "{content_type:?}");
    }
}

#[tokio::test]
async fn refuses_bodies_that_are_not_batch_lists_with_splinter_error_bodies() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let garbage = net.post(b"\xff\xff\xff\xff".to_vec()).await;
    assert_eq!(garbage.status, 400);
    assert_eq!(
        garbage.json(),
        json!({"code": "400", "message": "Invalid body: not a valid list of batches"})
    );
    let empty = net.post(Vec::new()).await;
    assert_eq!(empty.status, 400);
    assert_eq!(
        empty.text,
        r#"{"code":"400","message":"No valid batches provided"}"#
    );
    let bad_id = net.post(body(&["abc".to_owned()])).await;
    assert_eq!(bad_id.status, 400);
    assert_eq!(bad_id.json()["message"], "No valid batches provided");
    assert_eq!(net.stats().await.ledgers[LEDGER].accepted, 0);
}

#[tokio::test]
async fn batches_go_pending_valid_committed_in_order() {
    let net = start(Dialect::Scabbard, |c| {
        c.faults.commit_latency = Latency::fixed(Duration::from_millis(1000));
    })
    .await;
    let started = Instant::now();
    let first = ids(1, 3);
    let second = ids(3, 4);
    assert_eq!(net.post_ids(&first).await.status, 202);
    assert_eq!(net.post_ids(&second).await.status, 202);
    let all = ids(1, 4);

    let infos = net.scabbard_statuses(&all, None).await;
    assert!(
        started.elapsed() < Duration::from_millis(450),
        "too slow to see Pending"
    );
    assert_eq!(
        serde_json::to_value(&infos[0].status).unwrap(),
        json!({"statusType": "Pending", "message": []})
    );
    assert!(infos.iter().all(|i| i.status == ScabbardStatus::Pending));
    assert!(infos[0].timestamp.secs_since_epoch > 1_600_000_000);

    // Executed halfway through the commit latency: Valid, with its transactions.
    tokio::time::sleep(Duration::from_millis(750).saturating_sub(started.elapsed())).await;
    let infos = net.scabbard_statuses(&all, None).await;
    assert!(
        started.elapsed() < Duration::from_millis(950),
        "too slow to see Valid"
    );
    assert_eq!(
        infos[0].status,
        ScabbardStatus::Valid(vec![ScabbardValidTransaction {
            transaction_id: txn_id(&all[0])
        }])
    );

    let infos = net.scabbard_statuses(&all, Some("5")).await;
    assert!(
        infos
            .iter()
            .all(|i| i.status.kind() == BatchStatus::Committed)
    );
    assert_eq!(
        serde_json::to_value(&infos[2].status).unwrap(),
        json!({"statusType": "Committed", "message": [{"transaction_id": txn_id(&all[2])}]})
    );
    assert_eq!(net.committed(LEDGER).await, all);
}

#[tokio::test]
async fn a_payload_starting_with_invalid_makes_the_batch_invalid() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let bad = id(7);
    assert_eq!(net.post(invalid_body(&bad)).await.status, 202);
    let infos = net
        .scabbard_statuses(std::slice::from_ref(&bad), Some("5"))
        .await;
    assert_eq!(
        infos[0].status,
        ScabbardStatus::Invalid(vec![ScabbardInvalidTransaction {
            transaction_id: txn_id(&bad),
            error_message: dltsub_devnet::INVALID_PAYLOAD_MESSAGE.to_owned(),
            error_data: vec![],
        }])
    );
    // The exact shape Transact's client deserialises strictly.
    let raw = net
        .get(&format!(
            "/scabbard/{CIRCUIT}/{SERVICE}/batch_statuses?ids={bad}"
        ))
        .await
        .json();
    assert_eq!(
        raw[0]["status"],
        json!({"statusType": "Invalid", "message": [{
            "transaction_id": txn_id(&bad),
            "error_message": dltsub_devnet::INVALID_PAYLOAD_MESSAGE,
            "error_data": []
        }]})
    );
    assert!(net.committed(LEDGER).await.is_empty());
    assert_eq!(net.stats().await.ledgers[LEDGER].invalid, 1);
}

#[tokio::test]
async fn back_pressure_is_an_empty_429_at_30_in_flight_lifted_only_below_15() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let set_latency = |latency: &str| net.put_faults(json!({ "commit_latency": latency }));
    // 10 batches commit soon, 6 a little later, 14 not during this test.
    assert_eq!(set_latency("200ms").await.status, 200);
    let soon = ids(0, 10);
    assert_eq!(net.post_ids(&soon).await.status, 202);
    assert_eq!(set_latency("1200ms").await.status, 200);
    let later = ids(10, 16);
    assert_eq!(net.post_ids(&later).await.status, 202);
    assert_eq!(set_latency("60s").await.status, 200);
    assert_eq!(net.post_ids(&ids(16, 30)).await.status, 202);

    let refused = net.post_ids(&ids(100, 101)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.text, "", "scabbard's 429 has an empty body");
    assert!(!net.stats().await.ledgers[LEDGER].accepting);

    // 20 in flight: below 30 but not below 15, so still refused (hysteresis).
    net.settle(&soon).await;
    assert_eq!(net.stats().await.ledgers[LEDGER].in_flight, 20);
    assert_eq!(net.post_ids(&ids(101, 102)).await.status, 429);

    // 14 in flight: accepting again.
    net.settle(&later).await;
    let stats = net.stats().await.ledgers[LEDGER].clone();
    assert_eq!(stats.in_flight, 14);
    assert!(stats.accepting);
    assert_eq!(stats.rejected_backpressure, 2);
    assert_eq!(net.post_ids(&ids(102, 103)).await.status, 202);
}

#[tokio::test]
async fn only_the_last_100_batches_are_remembered() {
    let net = start(Dialect::Scabbard, |c| c.backpressure_high = 1_000).await;
    let all = ids(0, 110);
    for chunk in all.chunks(10) {
        assert_eq!(net.post_ids(chunk).await.status, 202);
    }
    net.settle(&all[10..]).await;
    let infos = net.scabbard_statuses(&all, None).await;
    let unknown: Vec<_> = infos
        .iter()
        .filter(|i| i.status == ScabbardStatus::Unknown)
        .map(|i| i.id.clone())
        .collect();
    assert_eq!(unknown, all[..10].to_vec(), "the 10 oldest are forgotten");
    assert!(
        infos[10..]
            .iter()
            .all(|i| i.status.kind() == BatchStatus::Committed)
    );
    // Forgotten by the node, still in the ledger.
    assert_eq!(net.committed(LEDGER).await, all);
}

#[tokio::test]
async fn a_restart_forgets_batches_in_flight_and_the_history() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let committed = ids(0, 1);
    assert_eq!(net.post_ids(&committed).await.status, 202);
    net.settle(&committed).await;
    assert_eq!(
        net.put_faults(json!({"commit_latency": "60s"}))
            .await
            .status,
        200
    );
    let in_flight = ids(1, 3);
    assert_eq!(net.post_ids(&in_flight).await.status, 202);

    assert_eq!(net.restart().await, json!({"forgotten": 2}));
    let infos = net.scabbard_statuses(&ids(0, 3), None).await;
    assert!(
        infos.iter().all(|i| i.status == ScabbardStatus::Unknown),
        "scabbard's history is in memory: {infos:?}"
    );
    assert_eq!(net.committed(LEDGER).await, committed);
    let stats = net.stats().await;
    assert_eq!(stats.restarts, 1);
    assert_eq!(stats.ledgers[LEDGER].in_flight, 0);
    assert_eq!(stats.ledgers[LEDGER].forgotten, 2);
}

#[tokio::test]
async fn a_duplicate_is_executed_again_and_counted() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let once = ids(5, 6);
    assert_eq!(net.post_ids(&once).await.status, 202);
    net.settle(&once).await;
    assert_eq!(net.post_ids(&once).await.status, 202);
    net.settle(&once).await;
    assert_eq!(
        net.committed(LEDGER).await,
        vec![once[0].clone(), once[0].clone()]
    );
    assert_eq!(net.stats().await.ledgers[LEDGER].duplicates, 1);
    let posts = net.posts().await;
    assert_eq!(posts.entries.len(), 2);
    assert!(posts.entries[0].duplicates.is_empty());
    assert_eq!(posts.entries[1].duplicates, once);
}

#[tokio::test]
async fn wait_returns_when_all_are_final_or_at_the_timeout() {
    let net = start(Dialect::Scabbard, |c| {
        c.faults.commit_latency = Latency::fixed(Duration::from_millis(300));
    })
    .await;
    let fast = ids(0, 2);
    assert_eq!(net.post_ids(&fast).await.status, 202);
    let started = Instant::now();
    let infos = net.scabbard_statuses(&fast, Some("30")).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "wait did not end on commit"
    );
    assert!(
        infos
            .iter()
            .all(|i| i.status.kind() == BatchStatus::Committed)
    );

    // An Unknown id never becomes final: the wait runs to its timeout, then answers with
    // what is known.
    let started = Instant::now();
    let infos = net
        .scabbard_statuses(&[fast[0].clone(), id(999)], Some("1"))
        .await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(950), "{waited:?}");
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert_eq!(infos[0].status.kind(), BatchStatus::Committed);
    assert_eq!(infos[1].status, ScabbardStatus::Unknown);

    // wait=false does not wait.
    net.put_faults(json!({"commit_latency": "60s"})).await;
    let slow = ids(10, 11);
    assert_eq!(net.post_ids(&slow).await.status, 202);
    let started = Instant::now();
    let infos = net.scabbard_statuses(&slow, Some("false")).await;
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(infos[0].status, ScabbardStatus::Pending);
}

#[tokio::test]
async fn status_queries_need_ids_and_answer_each_id_once() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let missing = net
        .get(&format!("/scabbard/{CIRCUIT}/{SERVICE}/batch_statuses"))
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.json(),
        json!({"code": "400", "message": "No batch IDs specified"})
    );
    let twice = net.scabbard_statuses(&[id(1), id(1), id(2)], None).await;
    assert_eq!(twice.len(), 2);
    assert_eq!(twice[0].id, id(1));
    assert_eq!(twice[1].status, ScabbardStatus::Unknown);
}

#[tokio::test]
async fn services_are_separate_ledgers() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let url = format!("{}/batches", net.devnet.scabbard_url("other", "svc9"));
    let response = net
        .http
        .post(url)
        .body(body(&ids(0, 1)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(net.post_ids(&ids(1, 2)).await.status, 202);
    net.settle(&ids(1, 2)).await;
    // The other service's batch is unknown here.
    let infos = net.scabbard_statuses(&ids(0, 1), None).await;
    assert_eq!(infos[0].status, ScabbardStatus::Unknown);
    let other = net.get("/_devnet/ledger?ledger=other::svc9").await.json();
    assert_eq!(other["ledgers"].as_object().unwrap().len(), 1);
    assert!(other["ledgers"]["other::svc9"].is_object());
}
