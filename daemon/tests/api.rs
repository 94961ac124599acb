//! The ledger-compatible API, spoken to exactly as a scabbard client would: protobuf
//! BatchList in, scabbard's JSON out, no dltsub-specific headers. Both backends.

use std::time::{Duration, Instant};

use dltsub_store::testing::TestBackend;
use serde_json::json;

mod support;

use support::{api, batch, list};

/// A BatchList is accepted durably with scabbard's 202 and relative link; following the
/// link gives scabbard's status JSON; the same POST again is idempotent.
async fn submit_then_follow_the_link(backend: TestBackend) {
    let api = api(backend).await;
    let body = list(vec![batch(1), batch(2)]);
    let (status, answer) = api.post("/scabbard/circ/svc/batches", body.clone()).await;
    assert_eq!(status, 202, "{answer}");
    let link = answer["link"].as_str().unwrap().to_string();
    let ids = format!(
        "{},{}",
        batch(1).header_signature,
        batch(2).header_signature
    );
    assert_eq!(link, format!("/scabbard/circ/svc/batch_statuses?ids={ids}"));
    assert_eq!(api.store.count_rows_for_tests("batches").await, 2);

    let (status, statuses) = api.get(&link).await;
    assert_eq!(status, 200);
    let entries = statuses.as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["id"], json!(batch(1).header_signature));
    assert_eq!(
        entries[0]["status"],
        json!({"statusType": "Pending", "message": []})
    );
    assert!(
        entries[0]["timestamp"]["secs_since_epoch"]
            .as_u64()
            .unwrap()
            > 1_700_000_000
    );

    let (status, _) = api.post("/scabbard/circ/svc/batches", body).await;
    assert_eq!(status, 202, "resubmitting the same batches is idempotent");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 2);
}

/// Bad bodies get scabbard's 400 JSON and write nothing; a known id with other bytes is a
/// 409 conflict that writes nothing either.
async fn bad_input_is_refused_and_nothing_written(backend: TestBackend) {
    let api = api(backend).await;
    let (status, answer) = api
        .post("/scabbard/c/s/batches", b"not protobuf \xff\xff".to_vec())
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        answer,
        json!({"code": "400", "message": "Invalid body: not a valid list of batches"})
    );
    let (status, answer) = api.post("/scabbard/c/s/batches", list(vec![])).await;
    assert_eq!(
        (status, answer["message"].clone()),
        (400, json!("No valid batches provided"))
    );
    let mut short_id = batch(3);
    short_id.header_signature = "abc".into();
    let (status, _) = api
        .post("/scabbard/c/s/batches", list(vec![short_id]))
        .await;
    assert_eq!(status, 400);
    assert_eq!(api.store.count_rows_for_tests("batches").await, 0);

    api.post("/scabbard/c/s/batches", list(vec![batch(4)]))
        .await;
    let mut tampered = batch(4);
    tampered.header = b"other".to_vec();
    let (status, answer) = api
        .post("/scabbard/c/s/batches", list(vec![batch(5), tampered]))
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["code"], json!("409"));
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains(&batch(4).header_signature)
    );
    assert_eq!(
        api.store.count_rows_for_tests("batches").await,
        1,
        "batch 5 was not written"
    );

    let (status, answer) = api.get("/scabbard/c/s/batch_statuses").await;
    assert_eq!(
        (status, answer["message"].clone()),
        (400, json!("No batch IDs specified"))
    );
    let (status, _) = api
        .get(&format!(
            "/scabbard/c/s/batch_statuses?ids={}&wait=soon",
            batch(4).header_signature
        ))
        .await;
    assert_eq!(status, 400);
}

/// Unknown ids read Unknown; `wait` returns as soon as every id is final, with the
/// ledger's transaction list, and otherwise at the timeout with what is known.
async fn statuses_and_wait(backend: TestBackend) {
    let api = api(backend).await;
    api.post("/scabbard/c/s/batches", list(vec![batch(6)]))
        .await;
    let id = batch(6).header_signature;
    let unknown = format!("{:0>128}", "f00d");
    let (_, answer) = api
        .get(&format!("/scabbard/c/s/batch_statuses?ids={unknown}"))
        .await;
    assert_eq!(answer[0]["status"]["statusType"], json!("Unknown"));

    let started = Instant::now();
    let (_, answer) = api
        .get(&format!("/scabbard/c/s/batch_statuses?ids={id}&wait=1"))
        .await;
    assert_eq!(answer[0]["status"]["statusType"], json!("Pending"));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for the timeout"
    );

    let store = api.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        store
            .execute_for_tests(
                "UPDATE batch_statuses SET status = 'COMMITTED', \
                 dlt_message = '[{\"transaction_id\":\"t1\"}]'",
            )
            .await;
    });
    let started = Instant::now();
    let (_, answer) = api
        .get(&format!("/scabbard/c/s/batch_statuses?ids={id}&wait=30"))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "returned once final"
    );
    assert_eq!(
        answer[0]["status"],
        json!({"statusType": "Committed", "message": [{"transaction_id": "t1"}]})
    );
}

/// /healthz answers while the process lives; /readyz is 503 while draining.
async fn health_and_readiness(backend: TestBackend) {
    let api = api(backend).await;
    assert_eq!(api.get("/healthz").await.0, 200);
    assert_eq!(api.get("/readyz").await, (200, json!({"status": "ready"})));
    api.draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        api.get("/readyz").await,
        (503, json!({"status": "draining"}))
    );
}

/// The Sawtooth routes as a Sawtooth client uses them: exact content type, absolute link,
/// `{"data": [...]}` statuses by GET and by POST, and Sawtooth's error codes.
async fn sawtooth_routes(backend: TestBackend) {
    let api = api(backend).await;
    let (status, answer) = api
        .post_as("/batches", "application/octet-stream", list(vec![batch(7)]))
        .await;
    assert_eq!(status, 202, "{answer}");
    let id = batch(7).header_signature;
    let host = api.base.trim_start_matches("http://");
    assert_eq!(
        answer["link"],
        json!(format!("http://{host}/batch_statuses?id={id}"))
    );
    let in_default = api
        .store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batches WHERE service_id = 'default-svc')")
        .await;
    assert_eq!(in_default, 1, "no ?service_id: the configured service");
    api.post_as(
        "/batches?service_id=chosen",
        "application/octet-stream",
        list(vec![batch(8)]),
    )
    .await;
    let in_chosen = api
        .store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batches WHERE service_id = 'chosen')")
        .await;
    assert_eq!(in_chosen, 1);

    let (status, answer) = api.get(&format!("/batch_statuses?id={id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer["data"],
        json!([{"id": id, "invalid_transactions": [], "status": "PENDING"}])
    );
    assert_eq!(
        answer["link"],
        json!(format!("http://{host}/batch_statuses?id={id}"))
    );

    // More than 15 ids go in a POST; unknown ones read UNKNOWN.
    let mut ids: Vec<String> = (100..119).map(|n| format!("{n:0128x}")).collect();
    ids.push(id.clone());
    let (status, answer) = api
        .post_as(
            "/batch_statuses",
            "application/json",
            serde_json::to_vec(&ids).unwrap(),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let data = answer["data"].as_array().unwrap();
    assert_eq!(data.len(), 20);
    assert_eq!(data[0]["status"], json!("UNKNOWN"));
    assert_eq!(data[19]["status"], json!("PENDING"));
    assert!(answer.get("link").is_none());

    for (path, content_type, body, code) in [
        ("/batches", "application/json", list(vec![batch(9)]), 42),
        (
            "/batches",
            "application/octet-stream",
            b"\xff\xff garbage".to_vec(),
            35,
        ),
        ("/batches", "application/octet-stream", list(vec![]), 34),
        ("/batch_statuses", "text/plain", b"[]".to_vec(), 43),
        ("/batch_statuses", "application/json", b"[]".to_vec(), 46),
    ] {
        let (status, answer) = api.post_as(path, content_type, body).await;
        assert_eq!(status, 400, "{path} {content_type}: {answer}");
        assert_eq!(
            answer["error"]["code"],
            json!(code),
            "{path} {content_type}: {answer}"
        );
    }
    let (status, answer) = api.get("/batch_statuses").await;
    assert_eq!((status, answer["error"]["code"].clone()), (400, json!(66)));
    let (status, answer) = api
        .get(&format!("/batch_statuses?id={}", id.to_uppercase()))
        .await;
    assert_eq!((status, answer["error"]["code"].clone()), (400, json!(60)));
    assert_eq!(
        api.store.count_rows_for_tests("batches").await,
        2,
        "refused bodies wrote nothing"
    );
}

/// A body over `max_body_size` is refused with 413 in each dialect's own JSON envelope and
/// writes nothing.
async fn oversize_bodies_get_413_in_the_dialects_envelope(backend: TestBackend) {
    let api = api(backend).await;
    let oversize = vec![0u8; support::MAX_BODY + 1];
    let (status, answer) = api.post("/scabbard/c/s/batches", oversize.clone()).await;
    assert_eq!(status, 413);
    assert_eq!(answer["code"], "413", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("length limit"));
    let (status, answer) = api
        .post_as("/batches", "application/octet-stream", oversize.clone())
        .await;
    assert_eq!((status, answer["error"]["code"].clone()), (413, json!(413)));
    let (status, answer) = api
        .post_as("/batch_statuses", "application/json", oversize)
        .await;
    assert_eq!((status, answer["error"]["code"].clone()), (413, json!(413)));
    assert_eq!(api.store.count_rows_for_tests("batches").await, 0);
}

dltsub_store::backend_tests!(
    oversize_bodies_get_413_in_the_dialects_envelope,
    sawtooth_routes,
    submit_then_follow_the_link,
    bad_input_is_refused_and_nothing_written,
    statuses_and_wait,
    health_and_readiness,
);
