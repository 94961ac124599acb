//! The native JSON API `/api/v1` (docs/api-v1.md): every route, every refusal with its
//! JSON error and nothing written, the execution-report conflict rules, and the bearer
//! token. Both backends.

mod support;

use std::time::{Duration, Instant};

use dltsub_store::{ClaimTiming, InstanceInfo, InstanceState, Store, TickPlan};
use reqwest::Method;
use serde_json::{Value, json};
use support::{Api, MAX_BODY, QUEUE_CAP, TOKEN, api, batch, list};

const OCTET: &str = "application/octet-stream";

/// A request: method, path and optional (content type, body).
type Call = (Method, String, Option<(&'static str, Vec<u8>)>);

fn id(n: u64) -> String {
    batch(n).header_signature
}

impl Api {
    async fn submit(&self, service: &str, query: &str, body: Vec<u8>) -> (u16, Value) {
        self.call(
            Method::POST,
            &format!("/api/v1/services/{service}/batches{query}"),
            Some(TOKEN),
            Some((OCTET, body)),
        )
        .await
    }

    async fn op(&self, path: &str) -> (u16, Value) {
        self.call(Method::POST, path, Some(TOKEN), None).await
    }

    async fn read(&self, path: &str) -> (u16, Value) {
        self.call(Method::GET, path, Some(TOKEN), None).await
    }

    async fn rows(&self) -> [i64; 3] {
        [
            self.store.count_rows_for_tests("batches").await,
            self.store.count_rows_for_tests("batch_events").await,
            self.store.count_rows_for_tests("services").await,
        ]
    }
}

/// Takes every claim for an instance named `name` (so batches can be marked SUBMITTING).
async fn take_all(store: &Store, name: &str) -> Vec<dltsub_store::HeldClaim> {
    let me = InstanceInfo {
        instance_id: name.to_string(),
        hostname: "host".into(),
        pid: 7,
        version: "test".into(),
        capacity: 1,
        session_tag: None,
        labels: Vec::new(),
    };
    let timing = ClaimTiming {
        fast_expiry: Duration::from_secs(30),
        slow_expiry: Duration::from_secs(90),
        instance_stale_after: Duration::from_secs(30),
    };
    store
        .claim_tick(&me, InstanceState::Running, timing, |_| {
            TickPlan::unpinned(1_000)
        })
        .await
        .unwrap()
        .held
}

/// Submit stores the batches and reports `postponed` (202) with each batch; the same
/// list again is idempotent (`newly_accepted: false`); other bytes under a known id are
/// `denied` (409) and write nothing.
async fn submit_reports_and_is_idempotent(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    let body = list(vec![batch(1), batch(2)]);
    let (status, report) = api.submit("circ::svc", "", body.clone()).await;
    assert_eq!(status, 202, "{report}");
    assert_eq!(report["operation"], "submit");
    assert_eq!(report["state"], "postponed");
    assert_eq!(report["service_id"], "circ::svc");
    assert_eq!(report["batch_ids"], json!([id(1), id(2)]));
    let batches = report["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0]["status"], "QUEUED");
    assert_eq!(batches[0]["newly_accepted"], true);
    assert!(batches[0]["seq"].as_i64().unwrap() < batches[1]["seq"].as_i64().unwrap());
    assert!(batches[0]["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("2 of 2 batches unfinished (2 QUEUED)"),
        "{report}"
    );

    let (status, again) = api.submit("circ::svc", "", body).await;
    assert_eq!(status, 202);
    assert_eq!(again["batches"][0]["newly_accepted"], false);
    let rows = api.rows().await;
    assert_eq!(rows[0], 2);

    let mut other_bytes = batch(2);
    other_bytes.header = vec![99];
    let (status, denied) = api
        .submit("circ::svc", "", list(vec![batch(3), other_bytes]))
        .await;
    assert_eq!(status, 409, "{denied}");
    assert_eq!(denied["state"], "denied");
    assert!(
        denied["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("batch {} was already accepted", id(2))),
        "{denied}"
    );
    assert_eq!(api.rows().await, rows, "a denied submit wrote nothing");
}

/// `?wait=` holds the answer until every batch is final (here: cancelled by an operator
/// while the submit waits) and then reports `executed` (200); if the wait runs out the
/// report is `postponed` and says so.
async fn submit_with_wait(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    let started = Instant::now();
    let (status, report) = api
        .submit("svc", "?wait=300ms", list(vec![batch(10)]))
        .await;
    assert_eq!(status, 202, "{report}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .starts_with("not final after 300ms"),
        "{report}"
    );

    let canceller = {
        let http = api.http.clone();
        let url = format!("{}/api/v1/batches/{}/cancel", api.base, id(11));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            http.post(url).bearer_auth(TOKEN).send().await.unwrap()
        })
    };
    let started = Instant::now();
    let (status, report) = api.submit("svc", "?wait=20s", list(vec![batch(11)])).await;
    let waited = started.elapsed();
    assert_eq!(canceller.await.unwrap().status().as_u16(), 200);
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["state"], "executed");
    assert_eq!(report["reason"], Value::Null);
    assert_eq!(report["batches"][0]["status"], "CANCELLED");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(10),
        "the wait ended when the batch became final: {waited:?}"
    );
}

/// Every kind of bad input answers its 4xx with a JSON error naming the problem (and the
/// field), and writes nothing.
async fn bad_input_is_refused_with_json_and_writes_nothing(
    backend: dltsub_store::testing::TestBackend,
) {
    let api = api(backend).await;
    api.submit("svc", "", list(vec![batch(1)])).await;
    let rows = api.rows().await;
    let error = |answer: &Value| {
        (
            answer["error"]["code"].as_str().unwrap_or("?").to_string(),
            answer["error"]["field"].as_str().unwrap_or("").to_string(),
        )
    };

    let (status, answer) = api
        .submit("svc", "", b"not protobuf \xff\xff".to_vec())
        .await;
    assert_eq!(
        (status, error(&answer)),
        (400, ("bad_request".into(), "body".into()))
    );
    assert_eq!(
        answer["error"]["message"],
        "the body is not a protobuf BatchList"
    );
    let (status, answer) = api.submit("svc", "", list(vec![])).await;
    assert_eq!(
        (status, error(&answer)),
        (400, ("bad_request".into(), "body".into()))
    );
    let mut short_id = batch(2);
    short_id.header_signature = "abc".into();
    let (status, answer) = api.submit("svc", "", list(vec![short_id])).await;
    assert_eq!(status, 400, "{answer}");
    let oversize = vec![0u8; MAX_BODY + 1];
    let (status, answer) = api.submit("svc", "", oversize).await;
    assert_eq!(
        (status, error(&answer).0),
        (413, "payload_too_large".into())
    );
    let (status, answer) = api
        .call(
            Method::POST,
            "/api/v1/services/svc/batches",
            Some(TOKEN),
            Some(("application/json", list(vec![batch(3)]))),
        )
        .await;
    assert_eq!(
        (status, error(&answer).0),
        (415, "unsupported_media_type".into())
    );
    for wait in ["soon", "-1s", "10m"] {
        let (status, answer) = api
            .submit("svc", &format!("?wait={wait}"), list(vec![batch(4)]))
            .await;
        assert_eq!(
            (status, error(&answer)),
            (400, ("bad_request".into(), "wait".into())),
            "wait={wait}: {answer}"
        );
    }
    let (status, answer) = api.read("/api/v1/batches?wait=soon&ids=x").await;
    assert_eq!((status, error(&answer).1), (400, "wait".into()));
    let (status, answer) = api.read("/api/v1/batches").await;
    assert_eq!((status, error(&answer).1), (400, "ids".into()));
    let (status, answer) = api.read("/api/v1/batches?ids=abc").await;
    assert_eq!((status, error(&answer).1), (400, "ids".into()));
    let (status, answer) = api.read("/api/v1/batches/abc").await;
    assert_eq!((status, error(&answer).1), (400, "batch_id".into()));
    let (status, answer) = api.read(&format!("/api/v1/batches/{}", id(77))).await;
    assert_eq!((status, error(&answer).0), (404, "unknown_batch".into()));
    let (status, answer) = api.op(&format!("/api/v1/batches/{}/cancel", id(77))).await;
    assert_eq!((status, error(&answer).0), (404, "unknown_batch".into()));
    let (status, answer) = api.read("/api/v1/services/nope").await;
    assert_eq!((status, error(&answer).0), (404, "unknown_service".into()));
    for op in ["pause", "resume"] {
        let (status, answer) = api.op(&format!("/api/v1/services/nope/{op}")).await;
        assert_eq!((status, error(&answer).0), (404, "unknown_service".into()));
    }
    let max_in_flight = |body: &'static str| {
        api.call(
            Method::POST,
            "/api/v1/services/svc/max_in_flight",
            Some(TOKEN),
            Some(("application/json", body.as_bytes().to_vec())),
        )
    };
    let (status, answer) = max_in_flight("{not json").await;
    assert_eq!(
        (status, error(&answer)),
        (400, ("bad_request".into(), "body".into()))
    );
    let (status, answer) = max_in_flight(r#"{"max_in_flight": "four"}"#).await;
    assert_eq!((status, error(&answer).1), (400, "body".into()));
    for bad in [
        r#"{"max_in_flight": 0}"#,
        r#"{"max_in_flight": 5000000000}"#,
    ] {
        let (status, answer) = max_in_flight(bad).await;
        assert_eq!(
            (status, error(&answer).1),
            (400, "max_in_flight".into()),
            "{bad}"
        );
    }
    let (status, answer) = api
        .call(
            Method::POST,
            "/api/v1/services/nope/max_in_flight",
            Some(TOKEN),
            Some(("application/json", br#"{"max_in_flight": 2}"#.to_vec())),
        )
        .await;
    assert_eq!((status, error(&answer).0), (404, "unknown_service".into()));
    let (status, answer) = api.read("/api/v1/no-such-thing").await;
    assert_eq!((status, error(&answer).0), (404, "not_found".into()));

    assert_eq!(api.rows().await, rows, "refused requests wrote nothing");
    let (_, service) = api.read("/api/v1/services/svc").await;
    assert_eq!(service["max_in_flight"], 1);
}

/// Past the per-service cap of unfinished batches a submit answers 429 like the ledgers
/// (native JSON, scabbard's empty body, Sawtooth's code 31) and writes nothing; other
/// services are not affected.
async fn queue_cap_answers_429_on_every_route(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    let full: Vec<_> = (0..QUEUE_CAP).map(|n| batch(100 + n)).collect();
    let (status, _) = api.submit("c::s", "", list(full)).await;
    assert_eq!(status, 202);
    let rows = api.rows().await;

    let (status, answer) = api.submit("c::s", "", list(vec![batch(1)])).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "queue_full");
    let response = api
        .http
        .post(format!("{}/scabbard/c/s/batches", api.base))
        .header("Content-Type", "octet-stream")
        .body(list(vec![batch(1)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert!(
        response.bytes().await.unwrap().is_empty(),
        "scabbard's 429 has no body"
    );
    let (status, answer) = api
        .post_as("/batches?service_id=c::s", OCTET, list(vec![batch(1)]))
        .await;
    assert_eq!((status, answer["error"]["code"].clone()), (429, json!(31)));
    assert_eq!(api.rows().await, rows, "refused submissions wrote nothing");

    let (status, _) = api.submit("other", "", list(vec![batch(1)])).await;
    assert_eq!(status, 202, "another service has its own cap");
}

/// Services list and show with counts, holder and settings; pause, resume and
/// max_in_flight report `executed` and show up; batches by ids (with unknown ones) and
/// one batch with its history; an id in two services needs `service_id`.
async fn services_and_batches(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    api.submit("b::svc", "", list(vec![batch(1), batch(2)]))
        .await;
    api.submit("a::svc", "", list(vec![batch(2)])).await;
    take_all(&api.store, "holder-1").await;

    let (status, answer) = api.read("/api/v1/services").await;
    assert_eq!(status, 200);
    let services = answer["services"].as_array().unwrap();
    assert_eq!(services.len(), 2);
    assert_eq!(services[0]["service_id"], "a::svc");
    assert_eq!(services[1]["counts"]["QUEUED"], 2);
    assert_eq!(services[1]["counts"]["COMMITTED"], 0);
    assert_eq!(services[1]["claimant"], "holder-1");
    assert_eq!(services[1]["epoch"], 1);

    let (status, report) = api.op("/api/v1/services/b::svc/pause").await;
    assert_eq!(status, 200);
    assert_eq!(
        (report["operation"].clone(), report["state"].clone()),
        (json!("pause"), json!("executed"))
    );
    // Percent-encoded ids name the same service.
    let (_, service) = api.read("/api/v1/services/b%3A%3Asvc").await;
    assert_eq!(service["paused"], true);
    assert!(
        api.store
            .select_submittable("holder-1", 10)
            .await
            .unwrap()
            .len()
            == 1
    );
    let (status, _) = api.op("/api/v1/services/b::svc/resume").await;
    assert_eq!(status, 200);
    let (status, report) = api
        .call(
            Method::POST,
            "/api/v1/services/b::svc/max_in_flight",
            Some(TOKEN),
            Some(("application/json", br#"{"max_in_flight": 4}"#.to_vec())),
        )
        .await;
    assert_eq!((status, report["state"].clone()), (200, json!("executed")));
    let (_, service) = api.read("/api/v1/services/b::svc").await;
    assert_eq!(
        (service["paused"].clone(), service["max_in_flight"].clone()),
        (json!(false), json!(4))
    );
    assert_eq!(
        api.store
            .select_submittable("holder-1", 10)
            .await
            .unwrap()
            .len(),
        3
    );

    let (status, answer) = api
        .read(&format!(
            "/api/v1/batches?ids={},{}&service_id=b::svc",
            id(1),
            id(9)
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["batches"].as_array().unwrap().len(), 1);
    assert_eq!(answer["batches"][0]["batch_id"], json!(id(1)));
    assert_eq!(answer["unknown_ids"], json!([id(9)]));

    let (status, answer) = api.read(&format!("/api/v1/batches/{}", id(2))).await;
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (409, json!("ambiguous_batch"))
    );
    let (status, one) = api
        .read(&format!("/api/v1/batches/{}?service_id=a::svc", id(2)))
        .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["service_id"], "a::svc");
    assert_eq!(one["history"][0]["new_status"], "QUEUED");
    assert_eq!(one["history"][0]["detail"], "accepted");
}

/// The conflict rules: cancel of a QUEUED batch executes (and again: idempotent), of a
/// batch mid-submission is denied; requeue of a terminal batch is denied; denied moves
/// change nothing.
async fn cancel_and_requeue_reports(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    api.submit("svc", "", list(vec![batch(1), batch(2), batch(3)]))
        .await;
    let claim = take_all(&api.store, "holder-1").await.remove(0);
    let first = api
        .store
        .find_batches(Some("svc"), &[&id(1)])
        .await
        .unwrap();
    api.store
        .mark_submitting("holder-1", &[(claim, vec![first[0].seq])])
        .await
        .unwrap();

    let (status, report) = api.op(&format!("/api/v1/batches/{}/cancel", id(1))).await;
    assert_eq!(status, 409, "{report}");
    assert_eq!(report["state"], "denied");
    assert_eq!(
        report["reason"],
        json!(format!("batch {} is SUBMITTING: mid-submission", id(1)))
    );
    assert_eq!(report["batches"][0]["status"], "SUBMITTING");
    let (status, _) = api.op(&format!("/api/v1/batches/{}/requeue", id(1))).await;
    assert_eq!(status, 409);

    let (status, report) = api.op(&format!("/api/v1/batches/{}/cancel", id(2))).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["state"], "executed");
    assert_eq!(report["batches"][0]["status"], "CANCELLED");
    let (status, report) = api.op(&format!("/api/v1/batches/{}/cancel", id(2))).await;
    assert_eq!((status, report["state"].clone()), (200, json!("executed")));
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("already CANCELLED")
    );
    let (status, report) = api.op(&format!("/api/v1/batches/{}/requeue", id(2))).await;
    assert_eq!((status, report["state"].clone()), (409, json!("denied")));
    assert!(report["reason"].as_str().unwrap().contains("final"));

    let (status, report) = api
        .op(&format!("/api/v1/batches/{}/requeue?service_id=svc", id(3)))
        .await;
    assert_eq!((status, report["state"].clone()), (200, json!("executed")));

    let (_, one) = api.read(&format!("/api/v1/batches/{}", id(2))).await;
    let last = one["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (
            last["old_status"].clone(),
            last["new_status"].clone(),
            last["detail"].clone()
        ),
        (
            json!("QUEUED"),
            json!("CANCELLED"),
            json!("cancelled by an operator")
        )
    );
    let (_, one) = api.read(&format!("/api/v1/batches/{}", id(1))).await;
    assert_eq!(one["status"], "SUBMITTING", "denied moves changed nothing");
}

/// Claims show holder, epoch, phase and time left; instances show heartbeat age and
/// claims held.
async fn claims_and_instances(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    api.submit("held", "", list(vec![batch(1)])).await;
    take_all(&api.store, "holder-1").await;
    api.submit("free", "", list(vec![batch(2)])).await;

    let (status, answer) = api.read("/api/v1/claims").await;
    assert_eq!(status, 200, "{answer}");
    let claims = answer["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 2);
    let free = &claims[0];
    assert_eq!(
        (
            free["service_id"].clone(),
            free["phase"].clone(),
            free["claimant"].clone()
        ),
        (json!("free"), json!("unclaimed"), Value::Null)
    );
    let held = &claims[1];
    assert_eq!(held["phase"], "held");
    assert_eq!(held["claimant"], "holder-1");
    assert_eq!(held["epoch"], 1);
    let fast_left = held["fast_left_ms"].as_i64().unwrap();
    let slow_left = held["slow_left_ms"].as_i64().unwrap();
    assert!(0 < fast_left && fast_left <= 30_000, "{held}");
    assert!(fast_left < slow_left && slow_left <= 90_000, "{held}");

    let (status, answer) = api.read("/api/v1/instances").await;
    assert_eq!(status, 200);
    let instances = answer["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0]["instance_id"], "holder-1");
    assert_eq!(instances[0]["claims"], 1);
    assert_eq!(instances[0]["state"], "running");
    assert!(instances[0]["heartbeat_age_ms"].as_i64().unwrap() >= 0);
}

/// With a token configured, operations and admin reads need it (401 JSON otherwise, and
/// nothing changes); service and batch reads and the ledger routes stay open.
async fn bearer_token_guards_operations(backend: dltsub_store::testing::TestBackend) {
    let api = api(backend).await;
    api.submit("svc", "", list(vec![batch(1)])).await;
    let rows = api.rows().await;
    let guarded: [Call; 8] = [
        (
            Method::POST,
            "/api/v1/services/svc/batches".into(),
            Some((OCTET, list(vec![batch(2)]))),
        ),
        (Method::POST, "/api/v1/services/svc/pause".into(), None),
        (Method::POST, "/api/v1/services/svc/resume".into(), None),
        (
            Method::POST,
            "/api/v1/services/svc/max_in_flight".into(),
            Some(("application/json", br#"{"max_in_flight": 2}"#.to_vec())),
        ),
        (
            Method::POST,
            format!("/api/v1/batches/{}/cancel", id(1)),
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/batches/{}/requeue", id(1)),
            None,
        ),
        (Method::GET, "/api/v1/claims".into(), None),
        (Method::GET, "/api/v1/instances".into(), None),
    ];
    for (method, path, body) in guarded {
        for token in [None, Some("wrong-token-0123456789"), Some("")] {
            let (status, answer) = api.call(method.clone(), &path, token, body.clone()).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {answer}");
            assert_eq!(answer["error"]["code"], "unauthorized");
        }
    }
    assert_eq!(
        api.rows().await,
        rows,
        "unauthorised requests wrote nothing"
    );
    let (_, service) = api
        .call(Method::GET, "/api/v1/services/svc", None, None)
        .await;
    assert_eq!(service["paused"], false);
    for path in [
        "/api/v1/services".to_string(),
        format!("/api/v1/batches/{}", id(1)),
        format!("/api/v1/batches?ids={}", id(1)),
    ] {
        let (status, _) = api.call(Method::GET, &path, None, None).await;
        assert_eq!(status, 200, "{path} is open");
    }
    let (status, _) = api
        .post("/scabbard/c/s/batches", list(vec![batch(3)]))
        .await;
    assert_eq!(status, 202, "ledger clients need no token");
}

dltsub_store::backend_tests!(
    submit_reports_and_is_idempotent,
    submit_with_wait,
    bad_input_is_refused_with_json_and_writes_nothing,
    queue_cap_answers_429_on_every_route,
    services_and_batches,
    cancel_and_requeue_reports,
    claims_and_instances,
    bearer_token_guards_operations,
);
