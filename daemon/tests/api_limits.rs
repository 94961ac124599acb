//! The API's limits (`dltsub::api::limits`): every refusal is a 4xx (429, 503) with a JSON
//! body in the route's own shape naming the field and the problem, and writes nothing.
//! Both backends.

use std::time::{Duration, Instant};

use dltsub::api::limits::LimitSettings;
use dltsub_store::testing::TestBackend;
use dltsub_wire::{Batch, Transaction};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::{Api, MAX_BODY, QUEUE_CAP, TOKEN, api_with, batch, list};

const OCTET: &str = "application/octet-stream";

fn settings() -> LimitSettings {
    LimitSettings::default()
}

/// A batch with `transactions` transactions.
fn batch_with(n: u64, transactions: usize) -> Batch {
    let mut batch = batch(n);
    batch.transactions = (0..transactions)
        .map(|t| Transaction {
            header: vec![1],
            header_signature: format!("{:0>128}", format!("{n:x}{t:x}d")),
            payload: vec![2],
        })
        .collect();
    batch
}

/// A POST with the token (ignored by the ledger routes) and its status, `Retry-After`,
/// `Content-Type` and JSON body.
async fn post(
    api: &Api,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Option<String>, String, Value) {
    let response = api
        .http
        .post(format!("{}{path}", api.base))
        .bearer_auth(TOKEN)
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    answer(response).await
}

async fn get(api: &Api, path: &str) -> (u16, Option<String>, String, Value) {
    let response = api
        .http
        .get(format!("{}{path}", api.base))
        .send()
        .await
        .unwrap();
    answer(response).await
}

async fn answer(response: reqwest::Response) -> (u16, Option<String>, String, Value) {
    let status = response.status().as_u16();
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|value: &reqwest::header::HeaderValue| value.to_str().unwrap().to_string())
    };
    let retry_after = header("retry-after");
    let content_type = header("content-type").unwrap_or_default();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"))
    };
    (status, retry_after, content_type, body)
}

/// The message of a refusal, whichever route's shape it has.
fn message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .or(body["message"].as_str())
        .unwrap_or_else(|| panic!("no message in {body}"))
        .to_string()
}

/// The three routes that accept a BatchList.
const SUBMIT_ROUTES: [&str; 3] = [
    "/scabbard/c/s/batches",
    "/batches",
    "/api/v1/services/svc/batches",
];

/// A request with a chunked body (no Content-Length), written by hand: what a client
/// streaming a large body sends. Answers the status and the JSON body.
async fn post_chunked(api: &Api, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
    let address = api.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(8 * 1024) {
        let sent = async {
            stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            stream.write_all(chunk).await?;
            stream.write_all(b"\r\n").await
        };
        // The server may answer and close before the whole body is sent.
        if sent.await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{path}: {head}"
    );
    (
        status,
        serde_json::from_str(body.trim()).unwrap_or(Value::Null),
    )
}

/// A body over `max_body_size` gets 413 with a JSON body on every route that takes one,
/// whether its length is announced or it is streamed, and nothing is written.
async fn bodies_over_the_limit_get_413_json_on_every_route(backend: TestBackend) {
    let api = api_with(backend, settings()).await;
    let oversize = vec![7u8; MAX_BODY + 1];
    let routes = [
        ("/scabbard/c/s/batches", OCTET),
        ("/batches", OCTET),
        ("/batch_statuses", "application/json"),
        ("/api/v1/services/svc/batches", OCTET),
        ("/api/v1/services/svc/max_in_flight", "application/json"),
        ("/api/v1/services/svc/pin", "application/json"),
        ("/api/v1/services/svc/pause", "application/json"),
    ];
    for (path, content_type) in routes {
        let (status, _, json_type, body) = post(&api, path, content_type, oversize.clone()).await;
        assert_eq!(status, 413, "{path}: {body}");
        assert!(json_type.starts_with("application/json"), "{path}");
        assert!(message(&body).contains("length limit"), "{path}: {body}");
        let (status, body) = post_chunked(&api, path, content_type, &oversize).await;
        assert_eq!(status, 413, "{path} streamed: {body}");
        assert!(message(&body).contains("length limit"), "{path}: {body}");
    }
    // The native API names the field.
    let (_, _, _, body) = post(
        &api,
        "/api/v1/services/svc/pin",
        "application/json",
        oversize,
    )
    .await;
    assert_eq!(body["error"]["field"], "body", "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 0);
    assert_eq!(api.store.count_rows_for_tests("services").await, 0);
}

/// A BatchList with more batches than `max_batches_per_list`, or a batch with more
/// transactions than `max_transactions_per_batch`, gets 413 naming the field on every
/// submit route; lists at the limits are accepted.
async fn batch_lists_over_the_limits_get_413(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            max_batches_per_list: 3,
            max_transactions_per_batch: 2,
            ..settings()
        },
    )
    .await;
    for path in SUBMIT_ROUTES {
        let (status, _, _, body) =
            post(&api, path, OCTET, list((1..=4).map(batch).collect())).await;
        assert_eq!(status, 413, "{path}: {body}");
        let text = message(&body);
        assert!(
            text.contains("4 batches") && text.contains("max_batches_per_list"),
            "{path}: {text}"
        );
        let (status, _, _, body) = post(&api, path, OCTET, list(vec![batch_with(5, 3)])).await;
        assert_eq!(status, 413, "{path}: {body}");
        let text = message(&body);
        assert!(
            text.contains("3 transactions") && text.contains("max_transactions_per_batch"),
            "{path}: {text}"
        );
    }
    let (_, _, _, body) = post(
        &api,
        "/api/v1/services/svc/batches",
        OCTET,
        list((1..=4).map(batch).collect()),
    )
    .await;
    assert_eq!(body["error"]["field"], "batches", "{body}");
    let (_, _, _, body) = post(
        &api,
        "/api/v1/services/svc/batches",
        OCTET,
        list(vec![batch_with(5, 3)]),
    )
    .await;
    assert_eq!(body["error"]["field"], "transactions", "{body}");
    assert_eq!(
        api.store.count_rows_for_tests("batches").await,
        0,
        "refused lists wrote nothing"
    );

    let at_the_limits = list(vec![batch_with(1, 2), batch_with(2, 2), batch_with(3, 1)]);
    let (status, _, _, body) = post(&api, "/scabbard/c/s/batches", OCTET, at_the_limits).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 3);
}

/// More ids than `max_ids_per_query` in one status request: 400 naming the field, on the
/// scabbard and Sawtooth routes (GET and POST) and the native API.
async fn status_queries_over_the_id_limit_get_400(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            max_ids_per_query: 3,
            ..settings()
        },
    )
    .await;
    let ids = |n: u64| -> Vec<String> { (1..=n).map(|n| batch(n).header_signature).collect() };
    let four = ids(4).join(",");
    let three = ids(3).join(",");
    for (path, field) in [
        (format!("/scabbard/c/s/batch_statuses?ids={four}"), "ids"),
        (format!("/batch_statuses?id={four}"), "id"),
        (format!("/api/v1/batches?ids={four}"), "ids"),
    ] {
        let (status, _, _, body) = get(&api, &path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let text = message(&body);
        assert!(
            text.contains("at most 3 ids") && text.contains("not 4"),
            "{path}: {text}"
        );
        if path.starts_with("/api/") {
            assert_eq!(body["error"]["field"], field, "{body}");
        }
    }
    let (status, _, _, body) = post(
        &api,
        "/batch_statuses",
        "application/json",
        serde_json::to_vec(&ids(4)).unwrap(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("at most 3 ids"), "{body}");

    for path in [
        format!("/scabbard/c/s/batch_statuses?ids={three}"),
        format!("/batch_statuses?id={three}"),
        format!("/api/v1/batches?ids={three}"),
    ] {
        let (status, _, _, body) = get(&api, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, _, _, body) = post(
        &api,
        "/batch_statuses",
        "application/json",
        serde_json::to_vec(&ids(3)).unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// With `max_concurrent_waits` requests waiting, one more that asks to wait gets 429 with
/// `Retry-After` (and a submission with `wait` writes nothing); once the wait ends, waits
/// are accepted again. Requests without `wait` are never held back.
async fn waits_beyond_the_limit_get_429(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            max_concurrent_waits: 1,
            ..settings()
        },
    )
    .await;
    let (status, _, _, _) = post(&api, "/scabbard/c/s/batches", OCTET, list(vec![batch(1)])).await;
    assert_eq!(status, 202);
    let id = batch(1).header_signature;
    // A final batch: a wait on it ends at once, so probing with it holds a permit only for
    // a moment.
    post(&api, "/scabbard/p/q/batches", OCTET, list(vec![batch(9)])).await;
    api.store
        .execute_for_tests(
            "UPDATE batch_statuses SET status = 'COMMITTED' WHERE service_id = 'p::q'",
        )
        .await;
    let probe = batch(9).header_signature;
    // Holds the only permit until batch 1 is final (up to 300 s); retried while a probe
    // holds it.
    let holder = {
        let http = api.http.clone();
        let url = format!("{}/scabbard/c/s/batch_statuses?ids={id}&wait=300", api.base);
        tokio::spawn(async move {
            loop {
                let status = http.get(&url).send().await.unwrap().status().as_u16();
                if status != 429 {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // Once the holder has the permit, every other wait is refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let answer = get(&api, &format!("/batch_statuses?id={probe}&wait=1")).await;
        if answer.0 == 429 {
            break answer;
        }
        assert_eq!(answer.0, 200, "{answer:?}");
        assert!(Instant::now() < deadline, "never refused: {answer:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, retry_after, _, body) = refused;
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(message(&body).contains("max_concurrent_waits"), "{body}");
    let (status, retry_after, _, body) =
        get(&api, &format!("/api/v1/batches?ids={id}&wait=5s")).await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{body}");
    assert_eq!(body["error"]["field"], "wait", "{body}");
    let (status, _, _, body) = get(
        &api,
        &format!("/scabbard/c/s/batch_statuses?ids={id}&wait=2"),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    let (status, _, _, body) = post(
        &api,
        "/api/v1/services/svc/batches?wait=10s",
        OCTET,
        list(vec![batch(2)]),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        api.store.count_rows_for_tests("batches").await,
        2,
        "the refused submission wrote nothing"
    );
    // Without wait: answered at once.
    let (status, _, _, _) = get(&api, &format!("/scabbard/c/s/batch_statuses?ids={id}")).await;
    assert_eq!(status, 200);

    assert!(!holder.is_finished(), "the holder still waits");
    api.store
        .execute_for_tests("UPDATE batch_statuses SET status = 'COMMITTED'")
        .await;
    assert_eq!(holder.await.unwrap(), 200);
    let (status, _, _, body) = get(&api, &format!("/batch_statuses?id={id}&wait=1")).await;
    assert_eq!(status, 200, "the permit came back: {body}");
}

/// `max_wait` caps a ledger route's wait and refuses a longer native one (400).
async fn max_wait_caps_the_wait(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            max_wait: Duration::from_secs(1),
            ..settings()
        },
    )
    .await;
    post(&api, "/scabbard/c/s/batches", OCTET, list(vec![batch(1)])).await;
    let id = batch(1).header_signature;
    let started = Instant::now();
    let (status, _, _, body) = get(
        &api,
        &format!("/scabbard/c/s/batch_statuses?ids={id}&wait=60"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["status"]["statusType"], "Pending");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the 60 s wait was cut to max_wait"
    );
    let (status, _, _, body) = get(&api, &format!("/api/v1/batches?ids={id}&wait=2s")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "wait");
    assert!(message(&body).contains("max_wait"), "{body}");
    let (status, _, _, body) = get(&api, &format!("/api/v1/batches?ids={id}&wait=1s")).await;
    assert_eq!(status, 200, "{body}");
}

/// Past `max_queued_total` unfinished batches of all services, every submit route gives
/// its back-pressure answer with `Retry-After` and writes nothing.
async fn the_total_queue_cap_answers_back_pressure(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            max_queued_total: Some(3),
            ..settings()
        },
    )
    .await;
    let (status, _, _, _) = post(
        &api,
        "/scabbard/a/x/batches",
        OCTET,
        list(vec![batch(1), batch(2)]),
    )
    .await;
    assert_eq!(status, 202);

    // Scabbard: 429 with an empty body, as scabbard answers a full queue.
    let (status, retry_after, _, body) = post(
        &api,
        "/scabbard/b/y/batches",
        OCTET,
        list(vec![batch(3), batch(4)]),
    )
    .await;
    assert_eq!(
        (status, retry_after.as_deref(), body),
        (429, Some("1"), Value::Null)
    );
    // Sawtooth: code 31, "Unable to Accept Batches".
    let (status, retry_after, _, body) = post(
        &api,
        "/batches?service_id=b::y",
        OCTET,
        list(vec![batch(3), batch(4)]),
    )
    .await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")));
    assert_eq!(body["error"]["code"], json!(31), "{body}");
    assert!(message(&body).contains("max_queued_total"), "{body}");
    // Native: queue_full.
    let (status, retry_after, _, body) = post(
        &api,
        "/api/v1/services/b::y/batches",
        OCTET,
        list(vec![batch(3), batch(4)]),
    )
    .await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")));
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    assert!(message(&body).contains("max_queued_total"), "{body}");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 2);
    assert_eq!(api.store.count_rows_for_tests("services").await, 1);

    // One more fits.
    let (status, _, _, body) = post(
        &api,
        "/api/v1/services/b::y/batches",
        OCTET,
        list(vec![batch(3)]),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 3);
}

/// A service over its own cap (`max_queued_per_service`, checked in the enqueue
/// transaction) gets the same answers, now with `Retry-After` on every route.
async fn a_full_service_queue_answers_with_retry_after(backend: TestBackend) {
    let api = api_with(backend, settings()).await;
    let full: Vec<Batch> = (1..=QUEUE_CAP).map(batch).collect();
    let (status, _, _, _) = post(&api, "/api/v1/services/c::s/batches", OCTET, list(full)).await;
    assert_eq!(status, 202);
    let extra = QUEUE_CAP + 1;
    let (status, retry_after, _, body) = post(
        &api,
        "/api/v1/services/c::s/batches",
        OCTET,
        list(vec![batch(extra)]),
    )
    .await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    let (status, retry_after, _, _) = post(
        &api,
        "/scabbard/c/s/batches",
        OCTET,
        list(vec![batch(extra)]),
    )
    .await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")));
    let (status, retry_after, _, body) = post(
        &api,
        "/batches?service_id=c::s",
        OCTET,
        list(vec![batch(extra)]),
    )
    .await;
    assert_eq!((status, retry_after.as_deref()), (429, Some("1")));
    assert_eq!(body["error"]["code"], json!(31));
    assert_eq!(
        api.store.count_rows_for_tests("batches").await,
        QUEUE_CAP as i64
    );
}

/// Over `rate_limit_per_client`, a client gets 429 with `Retry-After`; another client
/// (here: named by a trusted proxy's X-Forwarded-For) has its own bucket; health checks are
/// never limited.
async fn the_rate_per_client_is_limited(backend: TestBackend) {
    let api = api_with(
        backend,
        LimitSettings {
            rate_limit_per_client: Some(1),
            rate_limit_burst: 3,
            trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
            ..settings()
        },
    )
    .await;
    let from = |client: &'static str| {
        let api = &api;
        async move {
            let response = api
                .http
                .get(format!("{}/api/v1/services", api.base))
                .header("X-Forwarded-For", format!("203.0.113.9, {client}"))
                .send()
                .await
                .unwrap();
            answer(response).await
        }
    };
    let mut statuses = Vec::new();
    let mut refused = None;
    for _ in 0..20 {
        let answer = from("10.0.0.1").await;
        statuses.push(answer.0);
        if answer.0 == 429 {
            refused = Some(answer);
        }
    }
    assert_eq!(statuses[..3], [200, 200, 200], "the burst passes");
    let (_, retry_after, _, body) =
        refused.expect("20 requests at once exceed 1/s with a burst of 3");
    assert!(
        retry_after.unwrap().parse::<u64>().unwrap() >= 1,
        "Retry-After in whole seconds"
    );
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(message(&body).contains("10.0.0.1"), "{body}");
    let (status, _, _, _) = from("10.0.0.2").await;
    assert_eq!(status, 200, "another client has its own bucket");
    for _ in 0..10 {
        let (status, _, _, _) = get(&api, "/healthz").await;
        assert_eq!(status, 200);
    }
    // The client was the forwarded one, not the proxy: the proxy itself still has its burst.
    let (status, _, _, _) = get(&api, "/api/v1/services").await;
    assert_eq!(status, 200);
}

/// While the instance drains, every submit route answers 503 in its own shape and writes
/// nothing; status reads still answer.
async fn draining_refuses_every_submit_route(backend: TestBackend) {
    let api = api_with(backend, settings()).await;
    api.draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    for path in SUBMIT_ROUTES {
        let (status, _, content_type, body) = post(&api, path, OCTET, list(vec![batch(1)])).await;
        assert_eq!(status, 503, "{path}: {body}");
        assert!(content_type.starts_with("application/json"), "{path}");
        assert!(message(&body).contains("shutting down"), "{path}: {body}");
    }
    let (_, _, _, body) = post(&api, "/scabbard/c/s/batches", OCTET, list(vec![batch(1)])).await;
    assert_eq!(body["code"], "503", "scabbard's shape: {body}");
    let (_, _, _, body) = post(&api, "/batches", OCTET, list(vec![batch(1)])).await;
    assert_eq!(
        body["error"]["code"],
        json!(503),
        "Sawtooth's shape: {body}"
    );
    let (_, _, _, body) = post(
        &api,
        "/api/v1/services/svc/batches",
        OCTET,
        list(vec![batch(1)]),
    )
    .await;
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert_eq!(api.store.count_rows_for_tests("batches").await, 0);
    assert_eq!(api.store.count_rows_for_tests("services").await, 0);
    let (status, _, _, _) = get(
        &api,
        &format!(
            "/scabbard/c/s/batch_statuses?ids={}",
            batch(1).header_signature
        ),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = api.call(Method::GET, "/api/v1/services", None, None).await;
    assert_eq!(status, 200);
}

dltsub_store::backend_tests!(
    bodies_over_the_limit_get_413_json_on_every_route,
    batch_lists_over_the_limits_get_413,
    status_queries_over_the_id_limit_get_400,
    waits_beyond_the_limit_get_429,
    max_wait_caps_the_wait,
    the_total_queue_cap_answers_back_pressure,
    a_full_service_queue_answers_with_retry_after,
    the_rate_per_client_is_limited,
    draining_refuses_every_submit_route,
);
