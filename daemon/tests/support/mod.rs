//! What the API test files share: a database of the test's own and the API router
//! serving it on a free port, with a queue cap, a bearer token and a body limit small
//! enough to reach in a test.
#![allow(dead_code)] // each test file uses part of it

pub mod process;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use dltsub::api::{ApiState, router};
use dltsub_store::Store;
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_submitter::Wakeup;
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use serde_json::Value;

/// Unfinished batches a service may have in these tests.
pub const QUEUE_CAP: u64 = 20;
/// The bearer token the native API's guarded routes need.
pub const TOKEN: &str = "test-token-0123456789";
/// Largest body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;

pub struct Api {
    pub _database: TestDatabase,
    pub store: Store,
    pub base: String,
    pub draining: Arc<AtomicBool>,
    pub http: reqwest::Client,
}

pub async fn api(backend: TestBackend) -> Api {
    api_with(backend, dltsub::api::limits::LimitSettings::default()).await
}

/// [`api`] with other limits (`dltsub::api::limits`).
pub async fn api_with(backend: TestBackend, limits: dltsub::api::limits::LimitSettings) -> Api {
    api_serving(backend, limits, |router| router).await
}

/// [`api`] with other limits, serving `extend(router)` instead of the router itself, with
/// the peers' addresses as `dltsub run` serves it (so the rate limit per client applies).
pub async fn api_serving(
    backend: TestBackend,
    limits: dltsub::api::limits::LimitSettings,
    extend: impl FnOnce(axum::Router) -> axum::Router,
) -> Api {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let draining = Arc::new(AtomicBool::new(false));
    let state = ApiState {
        store: store.clone(),
        wakeup: Wakeup::default(),
        draining: draining.clone(),
        sawtooth_service_id: "default-svc".into(),
        max_queued_per_service: Some(QUEUE_CAP),
        api_token: Some(TOKEN.into()),
        max_body_bytes: MAX_BODY,
        console: Default::default(),
        limits: Arc::new(dltsub::api::limits::Limits::new(limits)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = extend(router(state)).into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Api {
        _database: database,
        store,
        base,
        draining,
        http: reqwest::Client::new(),
    }
}

pub fn batch(n: u64) -> Batch {
    Batch {
        header: vec![n as u8],
        header_signature: format!("{:0>128}", format!("{n:x}e")),
        transactions: vec![Transaction {
            header: vec![1],
            header_signature: format!("{:0>128}", format!("{n:x}d")),
            payload: vec![2],
        }],
        trace: false,
    }
}

pub fn list(batches: Vec<Batch>) -> Vec<u8> {
    BatchList { batches }.encode_to_vec()
}

impl Api {
    /// POSTs as Hyperledger Transact's scabbard client does (`Content-Type: octet-stream`).
    pub async fn post(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        self.post_as(path, "octet-stream", body).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl Api {
    pub async fn post_as(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl Api {
    /// Any request, with or without the bearer token; the answer's status and JSON body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("Content-Type", content_type).body(bytes);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}
