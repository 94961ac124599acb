//! The Sawtooth REST routes, served by dltsub from its database: `POST /batches` (the
//! service is `?service_id=` or the configured `sawtooth_service_id`), `GET /batch_statuses
//! ?id=…` and `POST /batch_statuses` with a JSON array of ids, with Sawtooth's error bodies,
//! absolute links and `wait` semantics.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dltsub_store::{BatchState, StoreError};
use dltsub_wire::sawtooth::{
    BatchStatuses, DEFAULT_WAIT_SECS, ErrorKind, InvalidTransaction, SawtoothBatchStatus, to_json,
};
use dltsub_wire::{BatchListError, BatchStatus, OCTET_STREAM, decode_batch_list};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::openapi::{
    BatchListBody, Link, SawtoothBatchStatuses, SawtoothErrorBody, SawtoothIds, TAG_SAWTOOTH,
};
use super::{ApiState, one_list_per_batch, split_ids, states_after_wait};

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(submit))
        .routes(routes!(statuses_get, statuses_post))
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error(kind: ErrorKind, additional_info: &str) -> Response {
    let status = StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    json_response(status, to_json(&kind.body(additional_info)))
}

/// An error that is dltsub's own (no Sawtooth code fits): same envelope, HTTP status given.
fn own_error(status: StatusCode, title: &str, message: &str) -> Response {
    let body =
        serde_json::json!({"error": {"code": status.as_u16(), "title": title, "message": message}});
    json_response(status, to_json(&body))
}

/// A body that could not be read (over `max_body_size`, cut off), in Sawtooth's envelope.
fn body_refused(rejection: BytesRejection) -> Response {
    own_error(
        rejection.status(),
        "Request Body Refused",
        &rejection.body_text(),
    )
}

/// A query string that does not parse (a parameter given twice, say), in Sawtooth's
/// envelope rather than axum's plain text.
fn query_refused(rejection: QueryRejection) -> Response {
    own_error(
        StatusCode::BAD_REQUEST,
        "Invalid Query",
        &rejection.body_text(),
    )
}

fn link(headers: &HeaderMap, ids: &[&str]) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}/batch_statuses?id={}", ids.join(","))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SubmitQuery {
    /// The service of the batches (default: the configured `sawtooth_service_id`).
    service_id: Option<String>,
}

/// Accepts a BatchList durably, as the Sawtooth REST API would.
#[utoipa::path(
    post,
    path = "/batches",
    operation_id = "sawtooth_submit_batches",
    tag = TAG_SAWTOOTH,
    params(SubmitQuery),
    request_body(content = BatchListBody, content_type = "application/octet-stream",
                 description = "A protobuf BatchList of at least one batch; the Content-Type must be exactly application/octet-stream."),
    responses(
        (status = 202, description = "Accepted; the link (absolute) reads the batches' statuses.", body = Link),
        (status = 400, description = "Sawtooth's code 30 (invalid batches), 34 (no batches), 35 (not a BatchList), 42 (wrong Content-Type), or dltsub's 400 (a malformed service id).", body = SawtoothErrorBody),
        (status = 409, description = "A batch id was accepted before with other bytes; nothing was stored.", body = SawtoothErrorBody),
        (status = 413, description = "The body is larger than max_body_size.", body = SawtoothErrorBody),
        (status = 429, description = "Sawtooth's code 31: the service's queue is full.", body = SawtoothErrorBody),
        (status = 503, description = "Sawtooth's code 15: the database is unavailable.", body = SawtoothErrorBody),
    ),
)]
async fn submit(
    State(state): State<ApiState>,
    query: Result<Query<SubmitQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return query_refused(rejection),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return body_refused(rejection),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if content_type != Some(OCTET_STREAM) {
        return error(ErrorKind::SubmissionWrongContentType, "");
    }
    let list = match decode_batch_list(&body) {
        Ok(list) => list,
        Err(BatchListError::Decode(_)) => return error(ErrorKind::BadProtobufSubmitted, ""),
        Err(BatchListError::Empty) => return error(ErrorKind::NoBatchesSubmitted, ""),
        Err(_) => return error(ErrorKind::SubmittedBatchesInvalid, ""),
    };
    let service_id = query
        .service_id
        .unwrap_or_else(|| state.sawtooth_service_id.clone());
    let batches = one_list_per_batch(list);
    match state
        .store
        .enqueue_limited(&service_id, &batches, state.max_queued_per_service)
        .await
    {
        Ok(accepted) => {
            state.wakeup.wake();
            let ids: Vec<&str> = accepted.iter().map(|b| b.batch_id.as_str()).collect();
            let body = serde_json::json!({ "link": link(&headers, &ids) });
            json_response(StatusCode::ACCEPTED, to_json(&body))
        }
        Err(StoreError::QueueFull { .. }) => error(ErrorKind::BatchQueueFull, ""),
        Err(StoreError::BatchConflict { batch_id, .. }) => own_error(
            StatusCode::CONFLICT,
            "Batch Conflict",
            &format!("batch {batch_id} was already accepted with different bytes"),
        ),
        Err(StoreError::InvalidInput { field, problem }) => own_error(
            StatusCode::BAD_REQUEST,
            "Invalid Request",
            &format!("invalid {field}: {problem}"),
        ),
        Err(store_error) => {
            tracing::error!(error = %store_error, service.id = %service_id, "enqueue failed");
            error(ErrorKind::ValidatorNotReady, "")
        }
    }
}

/// The query of `GET`/`POST /batch_statuses`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// The batch ids, comma-separated, lower case (GET only; a POST names them in its body).
    #[param(
        pattern = "^,*[0-9a-f]{128}(,+[0-9a-f]{128})*,*$",
        example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"
    )]
    pub id: Option<String>,
    /// Seconds to wait for every batch to be final (at most 300); `false` or absent: no
    /// wait; anything else: 285.
    pub wait: Option<String>,
}

/// Sawtooth's `wait`: absent or `false` means no wait; a number of seconds; anything else
/// (a bare `?wait`) the default.
pub fn wait_of(wait: Option<&str>) -> Duration {
    match wait {
        None | Some("false") => Duration::ZERO,
        Some(text) => Duration::from_secs(text.parse().unwrap_or(DEFAULT_WAIT_SECS)),
    }
}

/// The statuses of the batches `id` names, in Sawtooth's JSON; unknown ids read UNKNOWN.
#[utoipa::path(
    get,
    path = "/batch_statuses",
    operation_id = "sawtooth_batch_statuses_get",
    tag = TAG_SAWTOOTH,
    params(StatusQuery),
    responses(
        (status = 200, description = "One entry per id asked, in order, and the link of the query.", body = SawtoothBatchStatuses),
        (status = 400, description = "Sawtooth's code 66 (no ids) or 60 (a malformed id).", body = SawtoothErrorBody),
        (status = 503, description = "Sawtooth's code 15: the database is unavailable.", body = SawtoothErrorBody),
    ),
)]
async fn statuses_get(
    State(state): State<ApiState>,
    query: Result<Query<StatusQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return query_refused(rejection),
    };
    let ids: Vec<String> = split_ids(query.id.as_deref())
        .into_iter()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return error(ErrorKind::StatusIdQueryInvalid, "");
    }
    answer(&state, &ids, wait_of(query.wait.as_deref()), Some(&headers)).await
}

/// The statuses of the batches the JSON array in the body names.
#[utoipa::path(
    post,
    path = "/batch_statuses",
    operation_id = "sawtooth_batch_statuses_post",
    tag = TAG_SAWTOOTH,
    params(StatusQuery),
    request_body(content = SawtoothIds, content_type = "application/json",
                 description = "The batch ids, at least one."),
    responses(
        (status = 200, description = "One entry per id asked, in order, without a link.", body = SawtoothBatchStatuses),
        (status = 400, description = "Sawtooth's code 43 (wrong Content-Type), 46 (not a non-empty JSON array of ids) or 60 (a malformed id).", body = SawtoothErrorBody),
        (status = 413, description = "The body is larger than max_body_size.", body = SawtoothErrorBody),
        (status = 503, description = "Sawtooth's code 15: the database is unavailable.", body = SawtoothErrorBody),
    ),
)]
async fn statuses_post(
    State(state): State<ApiState>,
    query: Result<Query<StatusQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return query_refused(rejection),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return body_refused(rejection),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if content_type != Some("application/json") {
        return error(ErrorKind::StatusWrongContentType, "");
    }
    let ids: Vec<String> = match serde_json::from_slice(&body) {
        Ok(ids) => ids,
        Err(_) => return error(ErrorKind::StatusBodyInvalid, ""),
    };
    if ids.is_empty() {
        return error(ErrorKind::StatusBodyInvalid, "");
    }
    // POSTed status requests carry no link, as on Sawtooth.
    answer(&state, &ids, wait_of(query.wait.as_deref()), None).await
}

async fn answer(
    state: &ApiState,
    ids: &[String],
    wait: Duration,
    link_headers: Option<&HeaderMap>,
) -> Response {
    if let Some(bad) = ids
        .iter()
        .find(|id| !dltsub_wire::is_lowercase_batch_id(id))
    {
        return error(ErrorKind::InvalidResourceId, bad);
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let states = match states_after_wait(state, None, &ids, wait).await {
        Ok(states) => states,
        Err(store_error) => {
            tracing::error!(error = %store_error, "reading batch statuses failed");
            return error(ErrorKind::ValidatorNotReady, "");
        }
    };
    let by_id: HashMap<&str, &BatchState> =
        states.iter().map(|s| (s.batch_id.as_str(), s)).collect();
    let mut seen = HashSet::new();
    let data = ids
        .iter()
        .filter(|id| seen.insert(**id))
        .map(|id| sawtooth_status(id, by_id.get(id).copied()))
        .collect();
    let body = BatchStatuses {
        data,
        link: link_headers.map(|headers| link(headers, &ids)),
    };
    json_response(StatusCode::OK, to_json(&body))
}

/// dltsub's status as Sawtooth would report it: no VALID (it reads PENDING), everything
/// not yet decided PENDING, unknown ids UNKNOWN.
fn sawtooth_status(id: &str, state: Option<&BatchState>) -> SawtoothBatchStatus {
    let (status, invalid_transactions) = match state.map(|s| s.status.as_str()) {
        None => (BatchStatus::Unknown, Vec::new()),
        Some("COMMITTED") => (BatchStatus::Committed, Vec::new()),
        Some("INVALID") => (BatchStatus::Invalid, invalid_transactions(state)),
        Some("CANCELLED") => (
            BatchStatus::Invalid,
            vec![InvalidTransaction {
                extended_data: String::new(),
                id: String::new(),
                message: "cancelled by an operator before submission".into(),
            }],
        ),
        Some(_) => (BatchStatus::Pending, Vec::new()),
    };
    SawtoothBatchStatus {
        id: id.to_string(),
        invalid_transactions,
        status,
    }
}

fn invalid_transactions(state: Option<&BatchState>) -> Vec<InvalidTransaction> {
    let message = state
        .and_then(|s| s.dlt_message.clone())
        .unwrap_or_default();
    if let Ok(list) = serde_json::from_str::<Vec<InvalidTransaction>>(&message)
        && !list.is_empty()
    {
        return list;
    }
    vec![InvalidTransaction {
        extended_data: String::new(),
        id: String::new(),
        message: if message.is_empty() {
            "rejected by the ledger".into()
        } else {
            message
        },
    }]
}
