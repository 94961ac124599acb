//! `/api/v1/services…`: the service list, one service, submit, pause, resume and
//! max_in_flight.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dltsub_store::{BatchStatus, ServiceRecord, StoreError};
use dltsub_wire::{BatchListError, decode_batch_list};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    ApiError, ApiPath, ApiQuery, BatchSummary, ErrorBody, Report, ReportState, parse_wait,
    timestamp,
};
use crate::api::openapi::{BatchListBody, TAG_V1};
use crate::api::{ApiState, one_list_per_batch, states_after_wait};

pub fn open_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show))
}

pub fn guarded_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(submit))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(max_in_flight))
}

/// A service with its holder and batch counts.
#[derive(Debug, Serialize, ToSchema)]
struct ServiceView {
    service_id: String,
    paused: bool,
    max_in_flight: i32,
    created_at: String,
    claimant: Option<String>,
    epoch: i64,
    /// Batches by status (`QUEUED`, `SUBMITTING`, `PENDING`, `VALID`, `IN_DOUBT`,
    /// `COMMITTED`, `INVALID`, `CANCELLED`).
    #[schema(value_type = BTreeMap<String, i64>)]
    counts: BTreeMap<&'static str, i64>,
}

/// `{"services": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
struct ServiceList {
    services: Vec<ServiceView>,
}

const SERVICE_ID: &str = "The service (`circuit::service` for scabbard batches).";

impl From<ServiceRecord> for ServiceView {
    fn from(service: ServiceRecord) -> Self {
        Self {
            counts: service
                .counts
                .iter()
                .map(|(status, count)| (status.as_str(), *count))
                .collect(),
            service_id: service.service_id,
            paused: service.paused,
            max_in_flight: service.max_in_flight,
            created_at: timestamp(service.created_at_us),
            claimant: service.claimant,
            epoch: service.epoch,
        }
    }
}

/// Every service with its holder, epoch, pause, `max_in_flight` and batch counts.
#[utoipa::path(
    get,
    path = "/api/v1/services",
    operation_id = "list_services",
    tag = TAG_V1,
    responses(
        (status = 200, description = "The services.", body = ServiceList),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn list(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let services = state
        .store
        .services(None)
        .await
        .map_err(ApiError::unavailable)?;
    let services: Vec<ServiceView> = services.into_iter().map(ServiceView::from).collect();
    Ok(Json(ServiceList { services }).into_response())
}

/// One service.
#[utoipa::path(
    get,
    path = "/api/v1/services/{service_id}",
    operation_id = "get_service",
    tag = TAG_V1,
    params(("service_id" = String, Path, description = SERVICE_ID, example = "schemathesis::svc")),
    responses(
        (status = 200, description = "The service.", body = ServiceView),
        (status = 400, description = "A service id that is not UTF-8.", body = ErrorBody),
        (status = 404, description = "No such service.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn show(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let service = state
        .store
        .services(Some(&service_id))
        .await
        .map_err(ApiError::unavailable)?
        .pop()
        .ok_or_else(|| ApiError::unknown_service(&service_id))?;
    Ok(Json(ServiceView::from(service)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Wait up to this long for the outcomes (`30s`, `500ms`; at most 5m).
    wait: Option<String>,
}

/// Accepts a BatchList for the service (creating the service if it is new), then, with
/// `wait`, waits for the outcomes.
#[utoipa::path(
    post,
    path = "/api/v1/services/{service_id}/batches",
    operation_id = "submit_batches",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(("service_id" = String, Path, description = SERVICE_ID, example = "schemathesis::svc"), WaitQuery),
    request_body(content = BatchListBody, content_type = "application/octet-stream",
                 description = "A protobuf BatchList of at least one batch."),
    responses(
        (status = 200, description = "Executed: every batch is final.", body = Report),
        (status = 202, description = "Postponed: accepted, not every batch is final yet.", body = Report),
        (status = 400, description = "Not a BatchList, no batches, a malformed batch, service id or wait.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 409, description = "Denied: a batch id was accepted before with other bytes; nothing was stored.", body = Report),
        (status = 413, description = "The body is larger than max_body_size.", body = ErrorBody),
        (status = 415, description = "The Content-Type is not application/octet-stream.", body = ErrorBody),
        (status = 429, description = "The service's queue is full (max_queued_per_service).", body = ErrorBody),
        (status = 503, description = "The database is unavailable or the instance is draining.", body = ErrorBody),
    ),
)]
async fn submit(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<WaitQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let wait = parse_wait(query.wait.as_deref())?;
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "payload_too_large",
                format!(
                    "the body is larger than the limit of {} bytes (max_body_size)",
                    state.max_body_bytes
                ),
            )
        } else {
            ApiError::bad_request("body", rejection.body_text())
        }
    })?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    if content_type != Some("application/octet-stream") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the body must be a protobuf BatchList sent as Content-Type: application/octet-stream",
        ));
    }
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this instance is shutting down; retry on another",
        ));
    }
    let list = decode_batch_list(&body).map_err(|error| match error {
        BatchListError::Decode(_) => {
            ApiError::bad_request("body", "the body is not a protobuf BatchList")
        }
        BatchListError::Empty => ApiError::bad_request("body", "the BatchList has no batches"),
        other => ApiError::bad_request("body", format!("invalid BatchList: {other}")),
    })?;
    let batches = one_list_per_batch(list);
    let batch_ids: Vec<String> = batches.iter().map(|b| b.batch_id.clone()).collect();
    let accepted = match state
        .store
        .enqueue_limited(&service_id, &batches, state.max_queued_per_service)
        .await
    {
        Ok(accepted) => accepted,
        Err(StoreError::BatchConflict {
            batch_id,
            existing_seq,
            ..
        }) => {
            return Ok(Report {
                operation: "submit",
                state: ReportState::Denied,
                reason: Some(format!(
                    "batch {batch_id} was already accepted (seq {existing_seq}) with different bytes; nothing was stored"
                )),
                service_id,
                batch_ids,
                batches: Vec::new(),
            }
            .into_response());
        }
        Err(error) => return Err(ApiError::from_store(error)),
    };
    state.wakeup.wake();

    let ids: Vec<&str> = batch_ids.iter().map(String::as_str).collect();
    if !wait.is_zero() {
        states_after_wait(&state, Some(&service_id), &ids, wait)
            .await
            .map_err(ApiError::unavailable)?;
    }
    let found = state
        .store
        .find_batches(Some(&service_id), &ids)
        .await
        .map_err(ApiError::unavailable)?;
    let mut summaries: Vec<BatchSummary> = found.into_iter().map(BatchSummary::from).collect();
    for summary in &mut summaries {
        summary.newly_accepted = accepted
            .iter()
            .find(|batch| batch.batch_id == summary.batch_id)
            .map(|batch| batch.newly_accepted);
    }
    let unfinished: Vec<&BatchSummary> = summaries
        .iter()
        .filter(|summary| {
            !summary
                .status
                .parse::<BatchStatus>()
                .is_ok_and(BatchStatus::is_terminal)
        })
        .collect();
    let (state, reason) = if unfinished.is_empty() {
        (ReportState::Executed, None)
    } else {
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for summary in &unfinished {
            *by_status.entry(summary.status.as_str()).or_default() += 1;
        }
        let counts: Vec<String> = by_status
            .iter()
            .map(|(status, count)| format!("{count} {status}"))
            .collect();
        let why = if wait.is_zero() {
            "accepted; the outcome follows".to_string()
        } else {
            format!("not final after {}", humantime::format_duration(wait))
        };
        (
            ReportState::Postponed,
            Some(format!(
                "{why}: {} of {} batches unfinished ({})",
                unfinished.len(),
                summaries.len(),
                counts.join(", ")
            )),
        )
    };
    Ok(Report {
        operation: "submit",
        state,
        reason,
        service_id,
        batch_ids,
        batches: summaries,
    }
    .into_response())
}

async fn set_paused(
    state: &ApiState,
    service_id: String,
    paused: bool,
) -> Result<Response, ApiError> {
    let found = state
        .store
        .set_service_paused(&service_id, paused)
        .await
        .map_err(ApiError::unavailable)?;
    if !found {
        return Err(ApiError::unknown_service(&service_id));
    }
    if !paused {
        state.wakeup.wake();
    }
    Ok(service_report(
        if paused { "pause" } else { "resume" },
        service_id,
    ))
}

fn service_report(operation: &'static str, service_id: String) -> Response {
    Report {
        operation,
        state: ReportState::Executed,
        reason: None,
        service_id,
        batch_ids: Vec::new(),
        batches: Vec::new(),
    }
    .into_response()
}

/// Stops submitting the service's batches (those in flight finish).
#[utoipa::path(
    post,
    path = "/api/v1/services/{service_id}/pause",
    operation_id = "pause_service",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(("service_id" = String, Path, description = SERVICE_ID, example = "schemathesis::svc")),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "A service id that is not UTF-8.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such service.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn pause(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    set_paused(&state, service_id, true).await
}

/// Submits the service's batches again.
#[utoipa::path(
    post,
    path = "/api/v1/services/{service_id}/resume",
    operation_id = "resume_service",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(("service_id" = String, Path, description = SERVICE_ID, example = "schemathesis::svc")),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "A service id that is not UTF-8.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such service.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn resume(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    set_paused(&state, service_id, false).await
}

/// `{"max_in_flight": k}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct MaxInFlightBody {
    /// Batches of the service between submission and the ledger's verdict at once, 1 to 1000.
    #[schema(minimum = 1, maximum = 1000)]
    max_in_flight: i64,
}

/// Sets how many of the service's batches may be in flight at once (in order).
#[utoipa::path(
    post,
    path = "/api/v1/services/{service_id}/max_in_flight",
    operation_id = "set_max_in_flight",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(("service_id" = String, Path, description = SERVICE_ID, example = "schemathesis::svc")),
    request_body(content = MaxInFlightBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "Not the JSON object expected, or a value out of range.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such service.", body = ErrorBody),
        (status = 413, description = "The body is larger than max_body_size.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn max_in_flight(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: MaxInFlightBody = super::json_object(&body).map_err(|error| {
        ApiError::bad_request(
            "body",
            format!("expected JSON {{\"max_in_flight\": N}}: {error}"),
        )
    })?;
    let value = i32::try_from(body.max_in_flight).map_err(|_| {
        ApiError::bad_request(
            "max_in_flight",
            format!(
                "must be 1 to {}, not {}",
                dltsub_store::MAX_IN_FLIGHT_LIMIT,
                body.max_in_flight
            ),
        )
    })?;
    let found = state
        .store
        .set_service_max_in_flight(&service_id, value)
        .await
        .map_err(ApiError::from_store)?;
    if !found {
        return Err(ApiError::unknown_service(&service_id));
    }
    state.wakeup.wake();
    Ok(service_report("max_in_flight", service_id))
}
