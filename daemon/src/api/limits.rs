//! The API's limits, enforced in one layer in front of every route ([`guard`]), so that no
//! request a client sends can grow an instance's memory or its database's backlog without
//! bound, and every refusal is a 4xx (or 429/503) in the route's own JSON shape, counted in
//! `dltsub_api_limited_total{limit}`, before anything is written:
//!
//! - the request rate per client address (token bucket, `rate_limit_per_client` and
//!   `rate_limit_burst`; off by default): 429 with `Retry-After`;
//! - submissions while the instance drains: 503;
//! - the body (`max_body_size`): 413, whether its length is announced or it is streamed;
//! - batches per BatchList and transactions per batch (`max_batches_per_list`,
//!   `max_transactions_per_batch`): 413, counted on the protobuf wire without decoding;
//! - batch ids per status request (`max_ids_per_query`): 400;
//! - `wait` longer than `max_wait` on the native API: 400 (the ledger routes cap it);
//! - requests holding a `wait` at once (`max_concurrent_waits`): 429 with `Retry-After`;
//! - unfinished batches of all services (`max_queued_total`): the route's back-pressure
//!   answer (scabbard's empty 429, Sawtooth's code 31, the native `queue_full`), with
//!   `Retry-After`. The per-service cap stays in the enqueue transaction (store).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dltsub_wire::sawtooth::{DEFAULT_WAIT_SECS, ErrorKind, to_json};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiState;

/// The limits' values, from the configuration (`Default`: the configuration's defaults).
#[derive(Debug, Clone)]
pub struct LimitSettings {
    pub max_batches_per_list: usize,
    pub max_transactions_per_batch: usize,
    pub max_ids_per_query: usize,
    pub max_concurrent_waits: usize,
    pub max_wait: Duration,
    /// `None`: no cap.
    pub max_queued_total: Option<u64>,
    /// Requests per second per client; `None`: no rate limit.
    pub rate_limit_per_client: Option<u64>,
    pub rate_limit_burst: u32,
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<IpAddr>,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            max_batches_per_list: 1_000,
            max_transactions_per_batch: 1_000,
            max_ids_per_query: 1_000,
            max_concurrent_waits: 256,
            max_wait: super::MAX_WAIT,
            max_queued_total: Some(1_000_000),
            rate_limit_per_client: None,
            rate_limit_burst: 50,
            trusted_proxies: Vec::new(),
        }
    }
}

impl LimitSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            max_batches_per_list: config.max_batches_per_list as usize,
            max_transactions_per_batch: config.max_transactions_per_batch as usize,
            max_ids_per_query: config.max_ids_per_query as usize,
            max_concurrent_waits: config.max_concurrent_waits as usize,
            max_wait: config.max_wait,
            max_queued_total: config.max_queued_total,
            rate_limit_per_client: config.rate_limit_per_client,
            rate_limit_burst: config.rate_limit_burst,
            trusted_proxies: config.trusted_proxies.clone(),
        }
    }
}

/// The limits and the state they keep: the wait permits, the clients' buckets and the
/// last count of unfinished batches.
pub struct Limits {
    pub settings: LimitSettings,
    waits: Arc<Semaphore>,
    rate: Option<RateLimiter>,
    queued_total: tokio::sync::Mutex<QueuedTotal>,
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(LimitSettings::default())
    }
}

impl Limits {
    pub fn new(settings: LimitSettings) -> Self {
        Self {
            waits: Arc::new(Semaphore::new(settings.max_concurrent_waits)),
            rate: settings.rate_limit_per_client.map(|per_second| {
                RateLimiter::new(per_second as f64, f64::from(settings.rate_limit_burst))
            }),
            queued_total: tokio::sync::Mutex::new(QueuedTotal::default()),
            settings,
        }
    }

    /// Clients whose buckets are kept now (for tests: the map stays bounded).
    pub fn rate_limited_clients(&self) -> usize {
        self.rate.as_ref().map_or(0, RateLimiter::clients)
    }
}

/// How often an instance re-counts the unfinished batches of all services: the cap on
/// the total is checked against a count at most this old, plus what this instance
/// accepted since.
const QUEUED_TOTAL_REFRESH: Duration = Duration::from_secs(1);

#[derive(Default)]
struct QueuedTotal {
    counted_at: Option<Instant>,
    total: i64,
}

/// The shape of a route's error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `{"code": "413", "message": …}`
    Scabbard,
    /// `{"error": {"code": 413, "title": …, "message": …}}`
    Sawtooth,
    /// `{"error": {"code": "payload_too_large", "field": …, "message": …}}`
    Native,
}

/// The routes the limits look into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A BatchList POST: scabbard, Sawtooth or native.
    Submit,
    /// A status request: the query parameter holding the ids (GET), or a JSON array body
    /// (Sawtooth's POST).
    Statuses {
        ids_param: &'static str,
    },
    Other,
}

fn classify(method: &Method, path: &str) -> (Shape, Route) {
    let shape = if path.starts_with("/scabbard/") {
        Shape::Scabbard
    } else if path == "/batches" || path == "/batch_statuses" {
        Shape::Sawtooth
    } else {
        Shape::Native
    };
    let route = if *method == Method::POST
        && (path == "/batches"
            || (path.starts_with("/scabbard/") && path.ends_with("/batches"))
            || (path.starts_with("/api/v1/services/") && path.ends_with("/batches")))
    {
        Route::Submit
    } else if path.starts_with("/scabbard/") && path.ends_with("/batch_statuses") {
        Route::Statuses { ids_param: "ids" }
    } else if path == "/batch_statuses" {
        Route::Statuses { ids_param: "id" }
    } else if *method == Method::GET && path == "/api/v1/batches" {
        Route::Statuses { ids_param: "ids" }
    } else {
        Route::Other
    };
    (shape, route)
}

/// A request refused by a limit.
#[derive(Debug)]
struct Refusal {
    limit: &'static str,
    status: StatusCode,
    /// The native API's error code.
    code: &'static str,
    field: Option<&'static str>,
    message: String,
    retry_after: Option<u64>,
    /// Back-pressure on a submission: answered as the route answers a full queue.
    queue_full: bool,
}

impl Refusal {
    fn new(
        limit: &'static str,
        status: StatusCode,
        code: &'static str,
        field: Option<&'static str>,
        message: String,
    ) -> Self {
        Self {
            limit,
            status,
            code,
            field,
            message,
            retry_after: None,
            queue_full: false,
        }
    }

    fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    fn body_too_large(max_body_bytes: usize) -> Self {
        Self::new(
            "body_size",
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            Some("body"),
            format!("the body is over the length limit of {max_body_bytes} bytes (max_body_size)"),
        )
    }

    fn answer(self, shape: Shape) -> Response {
        metrics::counter!(crate::metrics::API_LIMITED, "limit" => self.limit).increment(1);
        let mut response = match (shape, self.queue_full) {
            // Scabbard's own back-pressure answer: 429 with an empty body.
            (Shape::Scabbard, true) => self.status.into_response(),
            (Shape::Sawtooth, true) => json_response(
                self.status,
                to_json(&ErrorKind::BatchQueueFull.body(&format!(" {}", self.message))),
            ),
            (Shape::Scabbard, false) => (
                self.status,
                Json(json!({"code": self.status.as_u16().to_string(), "message": self.message})),
            )
                .into_response(),
            (Shape::Sawtooth, false) => json_response(
                self.status,
                to_json(&json!({"error": {
                    "code": self.status.as_u16(),
                    "title": self.status.canonical_reason().unwrap_or("Refused"),
                    "message": self.message,
                }})),
            ),
            (Shape::Native, _) => {
                let mut error = json!({"code": self.code, "message": self.message});
                if let Some(field) = self.field {
                    error["field"] = field.into();
                }
                (self.status, Json(json!({ "error": error }))).into_response()
            }
        };
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The layer: checks every limit a request can break before the route runs, and holds a
/// wait permit while it does.
pub async fn guard(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    // The load balancer's checks are never limited.
    if path == "/healthz" || path == "/readyz" {
        return next.run(request).await;
    }
    let (shape, route) = classify(request.method(), path);
    match check(&state, route, request).await {
        Ok((request, accepted_batches, permit)) => {
            let mut response = next.run(request).await;
            drop(permit);
            finish(&state, route, accepted_batches, &mut response).await;
            if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json(response.headers()) {
                // A plain-text rejection of an extractor (a streamed body over the limit).
                return Refusal::body_too_large(state.max_body_bytes).answer(shape);
            }
            response
        }
        Err(refusal) => refusal.answer(shape),
    }
}

/// Everything checked before the route runs; on success the request (its body read, if it
/// has one), the number of batches it submits, and the wait permit it holds.
async fn check(
    state: &ApiState,
    route: Route,
    request: Request,
) -> Result<(Request, usize, Option<OwnedSemaphorePermit>), Refusal> {
    let limits = &state.limits;
    let settings = &limits.settings;
    if let Some(rate) = &limits.rate
        && let Some(client) = client_address(&request, &settings.trusted_proxies)
    {
        rate.check(client, Instant::now()).map_err(|wait| {
            Refusal::new(
                "rate",
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                None,
                format!(
                    "more than {} requests per second from {client} (rate_limit_per_client); retry later",
                    rate.per_second
                ),
            )
            .retry_after(wait.as_secs_f64().ceil() as u64)
        })?;
    }
    if route == Route::Submit && state.draining.load(Ordering::SeqCst) {
        return Err(Refusal::new(
            "draining",
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            None,
            "this instance is shutting down; retry on another".into(),
        ));
    }
    let query = request.uri().query().unwrap_or("").to_string();
    if let Route::Statuses { ids_param } = route {
        let ids: usize = url::form_urlencoded::parse(query.as_bytes())
            .filter(|(name, _)| *name == *ids_param)
            .map(|(_, value)| value.split(',').filter(|id| !id.is_empty()).count())
            .sum();
        check_ids(ids, ids_param, settings.max_ids_per_query)?;
    }
    let native = request.uri().path().starts_with("/api/v1/");
    let waits = match route {
        Route::Statuses { .. } | Route::Submit => wait_asked(&query, native, settings.max_wait)?,
        Route::Other => false,
    };

    // Read up to the limit even when Content-Length announces more: a server that answers
    // without reading closes a connection the client is still writing to, and the client
    // may then see a reset instead of the 413.
    let has_body = matches!(
        *request.method(),
        Method::POST | Method::PUT | Method::PATCH
    );
    let mut accepted_batches = 0;
    let request = if has_body {
        let (parts, body) = request.into_parts();
        let bytes = read_body(body, state.max_body_bytes).await?;
        if route == Route::Submit {
            // Not a well-formed BatchList: the route says so itself.
            if let Some(counts) = count_batch_list(&bytes) {
                check_list(counts, settings)?;
                check_queued_total(state, counts.batches).await?;
                accepted_batches = counts.batches;
            }
        } else if let Route::Statuses { ids_param } = route
            && let Ok(ids) = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&bytes)
        {
            check_ids(ids.len(), ids_param, settings.max_ids_per_query)?;
        }
        Request::from_parts(parts, Body::from(bytes))
    } else {
        request
    };

    let permit = if waits {
        let permit = limits.waits.clone().try_acquire_owned().map_err(|_| {
            Refusal::new(
                "concurrent_waits",
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_waits",
                Some("wait"),
                format!(
                    "{} requests are already waiting on this instance (max_concurrent_waits); retry, or ask without wait",
                    settings.max_concurrent_waits
                ),
            )
            .retry_after(1)
        })?;
        Some(permit)
    } else {
        None
    };
    Ok((request, accepted_batches, permit))
}

/// After the route: counts a full service queue (the store's refusal) and gives it a
/// `Retry-After`; adds what was accepted to this instance's total.
async fn finish(state: &ApiState, route: Route, accepted_batches: usize, response: &mut Response) {
    if route != Route::Submit {
        return;
    }
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        metrics::counter!(crate::metrics::API_LIMITED, "limit" => "queued_per_service")
            .increment(1);
        response
            .headers_mut()
            .entry(header::RETRY_AFTER)
            .or_insert(HeaderValue::from(1u64));
    } else if response.status().is_success() && state.limits.settings.max_queued_total.is_some() {
        let mut total = state.limits.queued_total.lock().await;
        total.total += accepted_batches as i64;
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

fn check_ids(ids: usize, field: &'static str, max: usize) -> Result<(), Refusal> {
    if ids > max {
        return Err(Refusal::new(
            "ids_per_query",
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some(field),
            format!("at most {max} ids per request (max_ids_per_query), not {ids}"),
        ));
    }
    Ok(())
}

/// Whether the request asks to wait (so needs a permit); a native `wait` longer than
/// `max_wait` is refused. A `wait` the route cannot read is left to the route (400), except
/// on Sawtooth, where it means the default wait.
fn wait_asked(query: &str, native: bool, max_wait: Duration) -> Result<bool, Refusal> {
    let Some(text) = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(name, _)| *name == "wait")
        .map(|(_, value)| value.into_owned())
        .last()
    else {
        return Ok(false);
    };
    if native {
        let Ok(wait) = humantime::parse_duration(&text) else {
            return Ok(false);
        };
        if wait > max_wait {
            return Err(Refusal::new(
                "wait",
                StatusCode::BAD_REQUEST,
                "bad_request",
                Some("wait"),
                format!(
                    "wait {text:?} is longer than the longest allowed, {} (max_wait)",
                    humantime::format_duration(max_wait)
                ),
            ));
        }
        return Ok(!wait.is_zero());
    }
    Ok(match text.as_str() {
        "false" => false,
        other => other.parse::<u64>().unwrap_or(DEFAULT_WAIT_SECS) > 0,
    })
}

/// Reads the whole body, at most `max` bytes.
async fn read_body(body: Body, max: usize) -> Result<Bytes, Refusal> {
    axum::body::to_bytes(body, max).await.map_err(|error| {
        let error = error.into_inner();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
        while let Some(current) = source {
            if current.is::<http_body_util::LengthLimitError>() {
                return Refusal::body_too_large(max);
            }
            source = current.source();
        }
        Refusal::new(
            "body_size",
            StatusCode::BAD_REQUEST,
            "bad_request",
            Some("body"),
            format!("the body could not be read: {error}"),
        )
    })
}

/// A BatchList's size: its batches and the most transactions in one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ListCounts {
    batches: usize,
    most_transactions: usize,
}

fn check_list(counts: ListCounts, settings: &LimitSettings) -> Result<(), Refusal> {
    if counts.batches > settings.max_batches_per_list {
        return Err(Refusal::new(
            "batches_per_list",
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            Some("batches"),
            format!(
                "the BatchList has {} batches; at most {} are accepted in one request (max_batches_per_list): split it",
                counts.batches, settings.max_batches_per_list
            ),
        ));
    }
    if counts.most_transactions > settings.max_transactions_per_batch {
        return Err(Refusal::new(
            "transactions_per_batch",
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            Some("transactions"),
            format!(
                "a batch has {} transactions; at most {} are accepted in one batch (max_transactions_per_batch)",
                counts.most_transactions, settings.max_transactions_per_batch
            ),
        ));
    }
    Ok(())
}

/// Refuses a submission of `batches` that would take the unfinished batches of all
/// services past `max_queued_total`: one count statement per instance and second at most.
async fn check_queued_total(state: &ApiState, batches: usize) -> Result<(), Refusal> {
    let Some(limit) = state.limits.settings.max_queued_total else {
        return Ok(());
    };
    let mut total = state.limits.queued_total.lock().await;
    if total
        .counted_at
        .is_none_or(|at| at.elapsed() >= QUEUED_TOTAL_REFRESH)
    {
        match state.store.unfinished_total().await {
            Ok(count) => total.total = count,
            // The enqueue will meet the same database and answer for it.
            Err(error) => tracing::warn!(%error, "counting unfinished batches failed"),
        }
        total.counted_at = Some(Instant::now());
    }
    let after = u64::try_from(total.total.max(0)).unwrap_or(0) + batches as u64;
    if after > limit {
        let mut refusal = Refusal::new(
            "queued_total",
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            None,
            format!(
                "dltsub holds {} unfinished batches of all services; the limit is {limit} (max_queued_total): retry later",
                total.total
            ),
        )
        .retry_after(1);
        refusal.queue_full = true;
        return Err(refusal);
    }
    Ok(())
}

/// Counts the batches of a protobuf `BatchList` (field 1) and the transactions (field 3)
/// of each on the wire, without decoding or copying anything. `None` if the bytes are not
/// well-formed protobuf (the route answers that itself).
fn count_batch_list(mut bytes: &[u8]) -> Option<ListCounts> {
    let mut counts = ListCounts {
        batches: 0,
        most_transactions: 0,
    };
    while !bytes.is_empty() {
        let (field, value) = next_field(&mut bytes)?;
        if let (1, Some(mut batch)) = (field, value) {
            counts.batches += 1;
            let mut transactions = 0;
            while !batch.is_empty() {
                if let (3, Some(_)) = next_field(&mut batch)? {
                    transactions += 1;
                }
            }
            counts.most_transactions = counts.most_transactions.max(transactions);
        }
    }
    Some(counts)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..10 {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << (shift * 7);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// One field: its number and, for a length-delimited one, its bytes.
fn next_field<'a>(bytes: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    let key = varint(bytes)?;
    let skip = |bytes: &mut &'a [u8], n: usize| -> Option<()> {
        *bytes = bytes.get(n..)?;
        Some(())
    };
    let value = match key & 7 {
        0 => {
            varint(bytes)?;
            None
        }
        1 => {
            skip(bytes, 8)?;
            None
        }
        2 => {
            let length = usize::try_from(varint(bytes)?).ok()?;
            let value = bytes.get(..length)?;
            *bytes = &bytes[length..];
            Some(value)
        }
        5 => {
            skip(bytes, 4)?;
            None
        }
        _ => return None,
    };
    Some((key >> 3, value))
}

/// The client a request is counted against: the peer, or the last address of
/// `X-Forwarded-For` when the peer is a trusted proxy. `None` when the server was started
/// without connection info (in-process tests): not rate limited.
fn client_address(request: &Request, trusted_proxies: &[IpAddr]) -> Option<IpAddr> {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()?
        .0
        .ip()
        .to_canonical();
    if !trusted_proxies.contains(&peer) {
        return Some(peer);
    }
    let forwarded = request
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.rsplit(',').next())
        .and_then(|last| last.trim().parse::<IpAddr>().ok());
    Some(forwarded.map_or(peer, |address| address.to_canonical()))
}

/// Most clients whose buckets are kept. A bucket idle long enough to be full again is the
/// same as none and is dropped first; if the map is still full, new clients share one
/// bucket until entries go idle.
const MAX_CLIENTS: usize = 10_000;

struct RateLimiter {
    per_second: f64,
    burst: f64,
    clients: std::sync::Mutex<Clients>,
}

struct Clients {
    buckets: HashMap<IpAddr, Bucket>,
    overflow: Bucket,
    last_sweep: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    fn new(per_second: f64, burst: f64) -> Self {
        Self {
            per_second,
            burst,
            clients: std::sync::Mutex::new(Clients {
                buckets: HashMap::new(),
                overflow: Bucket {
                    tokens: burst,
                    at: Instant::now(),
                },
                last_sweep: None,
            }),
        }
    }

    fn clients(&self) -> usize {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .buckets
            .len()
    }

    /// Takes a token of `client`'s bucket, or says how long until one is there. IPv6
    /// clients are counted per /64, the block one host usually has.
    fn check(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let client = match client {
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
            v4 => v4,
        };
        let full_after = Duration::from_secs_f64(self.burst / self.per_second);
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let clients = &mut *clients;
        if !clients.buckets.contains_key(&client)
            && clients.buckets.len() >= MAX_CLIENTS
            && clients
                .last_sweep
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            clients.last_sweep = Some(now);
            clients
                .buckets
                .retain(|_, bucket| now.duration_since(bucket.at) < full_after);
        }
        let fresh = Bucket {
            tokens: self.burst,
            at: now,
        };
        let bucket = if clients.buckets.len() < MAX_CLIENTS || clients.buckets.contains_key(&client)
        {
            clients.buckets.entry(client).or_insert(fresh)
        } else {
            &mut clients.overflow
        };
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_second,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dltsub_wire::{Batch, BatchList, Transaction};
    use prost::Message;

    fn list(batches: usize, transactions: usize) -> Vec<u8> {
        BatchList {
            batches: (0..batches)
                .map(|n| Batch {
                    header: vec![1, 2, 3],
                    header_signature: format!("{n:0128}"),
                    transactions: (0..transactions + n)
                        .map(|_| Transaction {
                            header: vec![4; 300],
                            header_signature: "ab".repeat(64),
                            payload: vec![5; 70_000],
                        })
                        .collect(),
                    trace: true,
                })
                .collect(),
        }
        .encode_to_vec()
    }

    #[test]
    fn batch_lists_are_counted_on_the_wire() {
        assert_eq!(
            count_batch_list(&list(3, 2)),
            Some(ListCounts {
                batches: 3,
                most_transactions: 4
            })
        );
        assert_eq!(
            count_batch_list(&[]),
            Some(ListCounts {
                batches: 0,
                most_transactions: 0
            })
        );
        let bytes = list(2, 1);
        assert_eq!(count_batch_list(&bytes[..bytes.len() - 1]), None, "cut off");
        assert_eq!(count_batch_list(b"not protobuf \xff\xff"), None);
    }

    #[test]
    fn the_bucket_refills_at_the_rate() {
        let limiter = RateLimiter::new(2.0, 3.0);
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check(client, start).is_ok());
        }
        let wait = limiter.check(client, start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another client has its own bucket.
        assert!(limiter.check("10.0.0.2".parse().unwrap(), start).is_ok());
        assert!(
            limiter
                .check(client, start + Duration::from_millis(500))
                .is_ok()
        );
        assert!(
            limiter
                .check(client, start + Duration::from_millis(500))
                .is_err()
        );
        // Addresses of one IPv6 /64 share a bucket.
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        for _ in 0..3 {
            assert!(limiter.check(a, start).is_ok());
        }
        assert!(limiter.check(b, start).is_err());
    }

    /// The map of clients never grows past its bound: idle (full) buckets are dropped, and
    /// while every kept client is active, new ones share the overflow bucket.
    #[test]
    fn the_client_map_is_bounded() {
        let limiter = RateLimiter::new(1.0, 2.0);
        let start = Instant::now();
        let address = |n: usize| IpAddr::from([10, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
        for n in 0..MAX_CLIENTS + 500 {
            let _ = limiter.check(address(n), start);
        }
        assert_eq!(limiter.clients(), MAX_CLIENTS);
        // The overflow bucket is shared: two requests pass (its burst), the third waits.
        let newcomer = address(MAX_CLIENTS + 1_000);
        assert!(limiter.check(newcomer, start).is_err());
        // Once the kept buckets are full again (2 s), a new client sweeps them away.
        let later = start + Duration::from_secs(3);
        assert!(limiter.check(newcomer, later).is_ok());
        assert_eq!(limiter.clients(), 1);
    }

    #[test]
    fn waits_are_read_like_the_routes_do() {
        let max = Duration::from_secs(300);
        assert!(!wait_asked("", false, max).unwrap());
        assert!(!wait_asked("wait=false", false, max).unwrap());
        assert!(!wait_asked("wait=0", false, max).unwrap());
        assert!(wait_asked("wait=5", false, max).unwrap());
        assert!(
            wait_asked("wait", false, max).unwrap(),
            "Sawtooth's default"
        );
        assert!(wait_asked("ids=a&wait=1000", false, max).unwrap());
        assert!(wait_asked("wait=30s", true, max).unwrap());
        assert!(!wait_asked("wait=0s", true, max).unwrap());
        assert!(
            !wait_asked("wait=soon", true, max).unwrap(),
            "the route's 400"
        );
        assert!(wait_asked("wait=301s", true, max).is_err());
    }
}
