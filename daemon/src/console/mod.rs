//! The operator console: a page served by every instance under `/console/` on the API
//! port, and the JSON it polls under `/console/api/`.
//!
//! The page is plain HTML, CSS and JavaScript embedded in the binary (`include_str!`), so
//! a `cargo build` is all it takes and nothing is fetched from elsewhere. It polls the JSON
//! endpoints every second (views stay live without reloading) and performs operator moves
//! through the native API (`/api/v1/…`), whose execution reports it shows as they come.
//!
//! The console's JSON shows the cluster's inner workings (instances, claim windows), so
//! it sits behind the bearer token like `/api/v1/claims` when one is configured; the page
//! asks for the token and keeps it in the tab's `sessionStorage`. The static assets are
//! open: they hold no data.
//!
//! Scale: every list is a page (`offset`, `limit` ≤ [`dltsub_store::MAX_PAGE`]) filtered in
//! the database, so 10,000 services cost a page of rows per poll, not 10,000; the commit
//! chart keeps its finished intervals ([`CommitCache`]) and reads only the last two.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use dltsub_store::{
    BatchRecord, BatchStatus, CommitBucket, Pin, ServiceFilter, ServiceRow, ServiceSubset,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::api::ApiState;
use crate::api::v1::{ApiError, BatchSummary, timestamp};

/// What the console needs to know of this instance's configuration, and its cache.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// The claim windows, to draw where a claim stands in them.
    pub fast_expiry: Duration,
    pub slow_expiry: Duration,
    /// An instance silent this long is not live (for "unserved").
    pub instance_stale_after: Duration,
    /// The commit intervals read so far (see [`commit_series`]).
    pub commits: Arc<Mutex<CommitCache>>,
}

impl ConsoleSettings {
    pub fn new(
        fast_expiry: Duration,
        slow_expiry: Duration,
        instance_stale_after: Duration,
    ) -> Self {
        Self {
            fast_expiry,
            slow_expiry,
            instance_stale_after,
            commits: Arc::default(),
        }
    }
}

impl Default for ConsoleSettings {
    /// The configuration's defaults.
    fn default() -> Self {
        Self::new(
            Duration::from_secs(10),
            Duration::from_secs(60),
            Duration::from_secs(6),
        )
    }
}

/// Finished commit intervals, kept so that a poll reads only the last two intervals
/// instead of five minutes of commits (at 2,000 commits/s that is 600,000 rows, 0.2–0.9 s
/// of PostgreSQL time per poll; two intervals are 1/15 of it).
#[derive(Debug, Default)]
pub struct CommitCache {
    buckets: BTreeMap<i64, CommitBucket>,
    /// Intervals starting before this were read after they ended.
    read_until_us: Option<i64>,
}

/// The commits of the last minutes, per interval. Polls of every open console share one
/// cache, so they read at most the last two intervals each (the previous one again,
/// for commits whose transaction began before its end).
async fn commit_series(state: &ApiState) -> Result<(i64, Vec<CommitBucket>), ApiError> {
    let mut cache = state.console.commits.lock().await;
    let since = cache
        .read_until_us
        .map(|until| until - i64::try_from(COMMIT_BUCKET.as_micros()).unwrap_or(0));
    let (now_us, fresh) = state
        .store
        .recent_commits(COMMIT_BUCKET, COMMIT_BUCKETS, since)
        .await
        .map_err(ApiError::unavailable)?;
    let bucket_us = i64::try_from(COMMIT_BUCKET.as_micros()).unwrap_or(1);
    let window = (now_us / bucket_us - (COMMIT_BUCKETS - 1)) * bucket_us;
    let read_from = since.map_or(window, |since| window.max(since / bucket_us * bucket_us));
    cache
        .buckets
        .retain(|start, _| *start >= window && *start < read_from);
    cache
        .buckets
        .extend(fresh.into_iter().map(|b| (b.start_us, b)));
    cache.read_until_us = Some(now_us / bucket_us * bucket_us);
    Ok((now_us, cache.buckets.values().copied().collect()))
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// Services per page unless the page asks otherwise.
const DEFAULT_PAGE: i64 = 50;
/// Throughput: this many intervals of this length.
const COMMIT_BUCKET: Duration = Duration::from_secs(10);
const COMMIT_BUCKETS: i64 = 30;

pub fn routes(state: ApiState) -> Router<ApiState> {
    let data = Router::new()
        .route("/console/api/overview", get(overview))
        .route("/console/api/services", get(services))
        .route("/console/api/services/{service_id}", get(service))
        .route("/console/api/batches/{seq}", get(batch))
        .route_layer(middleware::from_fn_with_state(
            state,
            crate::api::v1::require_token,
        ));
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|| asset("text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            "/console/console.js",
            get(|| asset("text/javascript; charset=utf-8", CONSOLE_JS)),
        )
        .route(
            "/console/console.css",
            get(|| asset("text/css; charset=utf-8", CONSOLE_CSS)),
        )
        .merge(data)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            // Nothing on the page comes from elsewhere, and nothing may.
            (
                header::CONTENT_SECURITY_POLICY,
                // Inline style attributes position the claim bars; every value the page
                // writes into markup is escaped.
                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Serialize)]
struct InstanceView {
    instance_id: String,
    hostname: String,
    pid: i64,
    version: String,
    capacity: i32,
    state: String,
    labels: Vec<String>,
    live: bool,
    heartbeat_age_ms: i64,
    claims: i64,
}

#[derive(Serialize)]
struct CommitView {
    start: String,
    start_ms: i64,
    committed: i64,
    per_second: f64,
    latency_mean_ms: f64,
    latency_max_ms: f64,
}

/// Instances, totals and the commits of the last minutes.
async fn overview(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let settings = state.console.clone();
    let store = &state.store;
    let instances = store.instances().await.map_err(ApiError::unavailable)?;
    let held = store
        .claims_per_holder()
        .await
        .map_err(ApiError::unavailable)?;
    let (services, paused, pinned) = store
        .service_totals()
        .await
        .map_err(ApiError::unavailable)?;
    let unserved = store
        .unserved_services(settings.instance_stale_after)
        .await
        .map_err(ApiError::unavailable)?;
    let backlog = store
        .backlog_gauges()
        .await
        .map_err(ApiError::unavailable)?;
    let (now_us, commits) = commit_series(&state).await?;
    let stale_us = i64::try_from(settings.instance_stale_after.as_micros()).unwrap_or(i64::MAX);
    let instances: Vec<InstanceView> = instances
        .into_iter()
        .map(|instance| {
            let age_us = instance.read_at_us - instance.heartbeat_at_us;
            InstanceView {
                live: instance.state == "running" && age_us < stale_us,
                claims: held.get(&instance.instance_id).copied().unwrap_or(0),
                labels: instance
                    .labels
                    .split(',')
                    .filter(|label| !label.is_empty())
                    .map(ToString::to_string)
                    .collect(),
                heartbeat_age_ms: age_us / 1_000,
                instance_id: instance.instance_id,
                hostname: instance.hostname,
                pid: instance.pid,
                version: instance.version,
                capacity: instance.capacity,
                state: instance.state,
            }
        })
        .collect();
    let seconds = COMMIT_BUCKET.as_secs_f64();
    let commits: Vec<CommitView> = commits
        .into_iter()
        .map(|bucket| CommitView {
            start: timestamp(bucket.start_us),
            start_ms: bucket.start_us / 1_000,
            committed: bucket.committed,
            per_second: bucket.committed as f64 / seconds,
            latency_mean_ms: bucket.latency_mean_us / 1_000.0,
            latency_max_ms: bucket.latency_max_us as f64 / 1_000.0,
        })
        .collect();
    let unfinished: BTreeMap<&str, i64> = BatchStatus::ALL
        .into_iter()
        .filter(|status| !status.is_terminal())
        .map(|status| {
            let count = backlog.by_status.get(&status).map_or(0, |g| g.count);
            (status.as_str(), count)
        })
        .collect();
    Ok(Json(serde_json::json!({
        "read_at": timestamp(now_us),
        "read_at_ms": now_us / 1_000,
        "fast_expiry_ms": millis(settings.fast_expiry),
        "slow_expiry_ms": millis(settings.slow_expiry),
        "instances": instances,
        "totals": {
            "services": services,
            "paused": paused,
            "pinned": pinned,
            "unserved": unserved,
            "unclaimed_with_backlog": backlog.unclaimed_services,
            "unfinished": unfinished,
        },
        "commits": {
            "bucket_ms": millis(COMMIT_BUCKET),
            "buckets": COMMIT_BUCKETS,
            "series": commits,
        },
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct ServicesQuery {
    q: Option<String>,
    holder: Option<String>,
    only: Option<String>,
    offset: Option<i64>,
    limit: Option<i64>,
}

/// Where a claim stands at `now` (the same names as `/api/v1/claims`).
fn phase(claimant: Option<&str>, fast_us: i64, slow_us: i64, now_us: i64) -> &'static str {
    if claimant.is_none() {
        "unclaimed"
    } else if now_us < fast_us {
        "held"
    } else if now_us < slow_us {
        "fast_expired"
    } else {
        "expired"
    }
}

#[derive(Serialize)]
struct ServiceView {
    service_id: String,
    paused: bool,
    max_in_flight: i32,
    pin_label: Option<String>,
    exclude_label: Option<String>,
    created_at: String,
    claimant: Option<String>,
    epoch: i64,
    phase: &'static str,
    fast_left_ms: Option<i64>,
    slow_left_ms: Option<i64>,
    counts: BTreeMap<&'static str, i64>,
}

impl ServiceView {
    fn new(row: ServiceRow, now_us: i64) -> Self {
        let held = row.claimant.is_some();
        Self {
            phase: phase(
                row.claimant.as_deref(),
                row.fast_expiry_us,
                row.slow_expiry_us,
                now_us,
            ),
            fast_left_ms: held.then(|| (row.fast_expiry_us - now_us) / 1_000),
            slow_left_ms: held.then(|| (row.slow_expiry_us - now_us) / 1_000),
            counts: row
                .counts
                .iter()
                .map(|(status, count)| (status.as_str(), *count))
                .collect(),
            created_at: timestamp(row.created_at_us),
            service_id: row.service_id,
            paused: row.paused,
            max_in_flight: row.max_in_flight,
            pin_label: row.pin.pin_label,
            exclude_label: row.pin.exclude_label,
            claimant: row.claimant,
            epoch: row.epoch,
        }
    }
}

fn page_bounds(offset: Option<i64>, limit: Option<i64>) -> Result<(i64, i64), ApiError> {
    let offset = offset.unwrap_or(0);
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if offset < 0 {
        return Err(ApiError::bad_request("offset", "must not be negative"));
    }
    if !(1..=dltsub_store::MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(
            "limit",
            format!("must be 1 to {}", dltsub_store::MAX_PAGE),
        ));
    }
    Ok((offset, limit))
}

/// A page of services, filtered and ordered by the database.
async fn services(
    State(state): State<ApiState>,
    Query(query): Query<ServicesQuery>,
) -> Result<Response, ApiError> {
    let (offset, limit) = page_bounds(query.offset, query.limit)?;
    let only = match query.only.as_deref().filter(|text| !text.is_empty()) {
        None | Some("all") => None,
        Some(text) => Some(
            text.parse::<ServiceSubset>()
                .map_err(|problem| ApiError::bad_request("only", problem))?,
        ),
    };
    let nonempty = |text: Option<String>| text.filter(|text| !text.is_empty());
    let filter = ServiceFilter {
        id_contains: nonempty(query.q),
        holder: nonempty(query.holder),
        only,
        id: None,
    };
    let page = state
        .store
        .services_page(&filter, offset, limit, state.console.instance_stale_after)
        .await
        .map_err(ApiError::unavailable)?;
    let now_us = page.read_at_us;
    let services: Vec<ServiceView> = page
        .services
        .into_iter()
        .map(|row| ServiceView::new(row, now_us))
        .collect();
    Ok(Json(serde_json::json!({
        "read_at": timestamp(now_us),
        "total": page.total,
        "offset": offset,
        "limit": limit,
        "services": services,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    offset: Option<i64>,
    limit: Option<i64>,
}

/// One service and a page of its batches in order.
async fn service(
    State(state): State<ApiState>,
    Path(service_id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let (offset, limit) = page_bounds(query.offset, query.limit)?;
    let filter = ServiceFilter {
        id: Some(service_id.clone()),
        ..ServiceFilter::default()
    };
    let page = state
        .store
        .services_page(&filter, 0, 1, state.console.instance_stale_after)
        .await
        .map_err(ApiError::unavailable)?;
    let now_us = page.read_at_us;
    let row = page
        .services
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::unknown_service(&service_id))?;
    let pin = row.pin.clone();
    let batches = state
        .store
        .service_batches(&service_id, offset, limit)
        .await
        .map_err(ApiError::unavailable)?;
    let summaries: Vec<BatchSummary> = batches
        .batches
        .into_iter()
        .map(BatchSummary::from)
        .collect();
    Ok(Json(serde_json::json!({
        "read_at": timestamp(now_us),
        "fast_expiry_ms": millis(state.console.fast_expiry),
        "slow_expiry_ms": millis(state.console.slow_expiry),
        "service": ServiceView::new(row, now_us),
        "pin_restricted": Pin::is_restricted(&pin),
        "batches": {
            "total": batches.total,
            "offset": offset,
            "limit": limit,
            "items": summaries,
        },
    }))
    .into_response())
}

/// One batch and its full history.
async fn batch(State(state): State<ApiState>, Path(seq): Path<i64>) -> Result<Response, ApiError> {
    let record: BatchRecord = state
        .store
        .batch_by_seq(seq)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_batch",
                format!("no batch with seq {seq}"),
            )
        })?;
    let history = state
        .store
        .batch_history(seq)
        .await
        .map_err(ApiError::unavailable)?;
    let history: Vec<serde_json::Value> = history
        .into_iter()
        .map(|event| {
            serde_json::json!({
                "at": timestamp(event.at_us),
                "old_status": event.old_status,
                "new_status": event.new_status,
                "epoch": event.epoch,
                "instance_id": event.instance_id,
                "detail": event.detail,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({
        "batch": BatchSummary::from(record),
        "history": history,
    }))
    .into_response())
}
