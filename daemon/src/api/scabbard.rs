//! The Splinter scabbard routes, served by dltsub from its database:
//! `POST /scabbard/{circuit}/{service}/batches` accepts a BatchList durably and answers 202
//! with a link to dltsub's own `batch_statuses`, which answers in scabbard's JSON with its
//! `wait` semantics. The `service_id` is `circuit::service`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dltsub_store::{BatchState, StoreError};
use dltsub_wire::scabbard::{
    MSG_INVALID_QUERY, MSG_NO_IDS, MSG_NO_VALID_BATCHES, MSG_NOT_A_BATCH_LIST, ScabbardBatchInfo,
    ScabbardError, ScabbardInvalidTransaction, ScabbardStatus, ScabbardTimestamp,
    ScabbardValidTransaction, batch_statuses_link,
};
use dltsub_wire::{BatchListError, decode_batch_list};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::openapi::{BatchListBody, Link, ScabbardErrorBody, TAG_SCABBARD};
use super::{ApiState, one_list_per_batch, split_ids, states_after_wait};

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(submit))
        .routes(routes!(statuses))
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = ScabbardError {
        code: status.as_u16().to_string(),
        message: message.to_string(),
    };
    (status, Json(body)).into_response()
}

/// Accepts a BatchList durably for the service `circuit::service`, as scabbard would.
#[utoipa::path(
    post,
    path = "/scabbard/{circuit}/{service}/batches",
    operation_id = "scabbard_submit_batches",
    tag = TAG_SCABBARD,
    params(
        ("circuit" = String, Path, description = "The circuit.", example = "schemathesis"),
        ("service" = String, Path, description = "The scabbard service.", example = "svc"),
    ),
    request_body(content = BatchListBody, content_type = "application/octet-stream",
                 description = "A protobuf BatchList of at least one batch."),
    responses(
        (status = 202, description = "Accepted; the link reads the batches' statuses.", body = Link),
        (status = 400, description = "Not a BatchList, no batches, a malformed batch or service id.", body = ScabbardErrorBody),
        (status = 409, description = "A batch id was accepted before with other bytes; nothing was stored.", body = ScabbardErrorBody),
        (status = 413, description = "The body is larger than max_body_size.", body = ScabbardErrorBody),
        (status = 429, description = "The service's queue is full: scabbard's back-pressure, with an empty body."),
        (status = 503, description = "The database is unavailable.", body = ScabbardErrorBody),
    ),
)]
async fn submit(
    State(state): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (circuit, service) = match path {
        Ok(Path(path)) => path,
        Err(rejection) => return error(StatusCode::BAD_REQUEST, &rejection.body_text()),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return error(rejection.status(), &rejection.body_text()),
    };
    let list = match decode_batch_list(&body) {
        Ok(list) => list,
        Err(BatchListError::Decode(_)) => {
            return error(StatusCode::BAD_REQUEST, MSG_NOT_A_BATCH_LIST);
        }
        Err(_) => return error(StatusCode::BAD_REQUEST, MSG_NO_VALID_BATCHES),
    };
    let service_id = format!("{circuit}::{service}");
    let batches = one_list_per_batch(list);
    match state
        .store
        .enqueue_limited(&service_id, &batches, state.max_queued_per_service)
        .await
    {
        Ok(accepted) => {
            state.wakeup.wake();
            let ids = accepted.iter().map(|b| b.batch_id.as_str());
            let link = batch_statuses_link(&circuit, &service, ids);
            (
                StatusCode::ACCEPTED,
                Json(serde_json::json!({ "link": link })),
            )
                .into_response()
        }
        // Scabbard's own back-pressure answer: 429 with an empty body.
        Err(StoreError::QueueFull { .. }) => StatusCode::TOO_MANY_REQUESTS.into_response(),
        Err(StoreError::BatchConflict { batch_id, .. }) => error(
            StatusCode::CONFLICT,
            &format!("batch {batch_id} was already accepted with different bytes"),
        ),
        Err(StoreError::InvalidInput { field, problem }) => error(
            StatusCode::BAD_REQUEST,
            &format!("invalid {field}: {problem}"),
        ),
        Err(store_error) => {
            tracing::error!(error = %store_error, service.id = %service_id, "enqueue failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "The service is unavailable",
            )
        }
    }
}

/// The query of `GET /scabbard/{circuit}/{service}/batch_statuses`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusQuery {
    /// The batch ids, comma-separated.
    #[param(
        required = true,
        pattern = "[^,]",
        example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"
    )]
    pub ids: Option<String>,
    /// Seconds to wait for every batch to be final (at most 300); `false`: no wait.
    pub wait: Option<String>,
}

/// Scabbard's `wait`: absent or `false` means no wait, else whole seconds; `None` for
/// anything else (answered 400).
pub fn wait_of(wait: Option<&str>) -> Option<Duration> {
    match wait {
        None | Some("false") => Some(Duration::ZERO),
        Some(text) => text.parse::<u64>().ok().map(Duration::from_secs),
    }
}

/// The statuses of the batches `ids` names, in scabbard's JSON; unknown ids read Unknown.
#[utoipa::path(
    get,
    path = "/scabbard/{circuit}/{service}/batch_statuses",
    operation_id = "scabbard_batch_statuses",
    tag = TAG_SCABBARD,
    params(
        ("circuit" = String, Path, description = "The circuit.", example = "schemathesis"),
        ("service" = String, Path, description = "The scabbard service.", example = "svc"),
        StatusQuery,
    ),
    responses(
        (status = 200, description = "One entry per id asked, in order.", body = Vec<super::openapi::ScabbardBatchInfo>),
        (status = 400, description = "No ids, or a wait that is not a number.", body = ScabbardErrorBody),
        (status = 503, description = "The database is unavailable.", body = ScabbardErrorBody),
    ),
)]
async fn statuses(
    State(state): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Response {
    let (circuit, service) = match path {
        Ok(Path(path)) => path,
        Err(rejection) => return error(StatusCode::BAD_REQUEST, &rejection.body_text()),
    };
    // A query string that does not parse (a parameter given twice, say): scabbard's own
    // answer to a bad query, not axum's plain text.
    let Ok(Query(query)) = query else {
        return error(StatusCode::BAD_REQUEST, MSG_INVALID_QUERY);
    };
    let ids = split_ids(query.ids.as_deref());
    if ids.is_empty() {
        return error(StatusCode::BAD_REQUEST, MSG_NO_IDS);
    }
    let Some(wait) = wait_of(query.wait.as_deref()) else {
        return error(StatusCode::BAD_REQUEST, MSG_INVALID_QUERY);
    };
    let service_id = format!("{circuit}::{service}");
    match states_after_wait(&state, Some(&service_id), &ids, wait).await {
        Ok(states) => (StatusCode::OK, Json(answer(&ids, &states))).into_response(),
        Err(store_error) => {
            tracing::error!(error = %store_error, "reading batch statuses failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "The service is unavailable",
            )
        }
    }
}

/// One entry per asked id, in the order asked (each id once), Unknown when not found.
fn answer(ids: &[&str], states: &[BatchState]) -> Vec<ScabbardBatchInfo> {
    let by_id: HashMap<&str, &BatchState> =
        states.iter().map(|s| (s.batch_id.as_str(), s)).collect();
    let mut seen = std::collections::HashSet::new();
    ids.iter()
        .filter(|id| seen.insert(**id))
        .map(|id| match by_id.get(id) {
            Some(state) => ScabbardBatchInfo {
                id: (*id).to_string(),
                status: scabbard_status(state),
                timestamp: ScabbardTimestamp::from(
                    UNIX_EPOCH + Duration::from_micros(state.created_at_us.max(0) as u64),
                ),
            },
            None => ScabbardBatchInfo {
                id: (*id).to_string(),
                status: ScabbardStatus::Unknown,
                timestamp: ScabbardTimestamp::from(SystemTime::now()),
            },
        })
        .collect()
}

/// dltsub's status as scabbard would report it. Everything not yet decided by the ledger
/// is Pending; the ledger's own transaction list is passed on when it was stored.
fn scabbard_status(state: &BatchState) -> ScabbardStatus {
    let message: Option<serde_json::Value> = state
        .dlt_message
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok());
    match state.status.as_str() {
        "COMMITTED" => ScabbardStatus::Committed(valid_transactions(message)),
        "VALID" => ScabbardStatus::Valid(valid_transactions(message)),
        "INVALID" => ScabbardStatus::Invalid(invalid_transactions(message, state)),
        "CANCELLED" => ScabbardStatus::Invalid(vec![ScabbardInvalidTransaction {
            transaction_id: String::new(),
            error_message: "cancelled by an operator before submission".into(),
            error_data: Vec::new(),
        }]),
        _ => ScabbardStatus::Pending,
    }
}

fn valid_transactions(message: Option<serde_json::Value>) -> Vec<ScabbardValidTransaction> {
    message
        .and_then(|value| serde_json::from_value(value).ok())
        .unwrap_or_default()
}

fn invalid_transactions(
    message: Option<serde_json::Value>,
    state: &BatchState,
) -> Vec<ScabbardInvalidTransaction> {
    if let Some(list) = message
        .clone()
        .and_then(|value| serde_json::from_value::<Vec<ScabbardInvalidTransaction>>(value).ok())
        .filter(|list| !list.is_empty())
    {
        return list;
    }
    // A 400 body or a Sawtooth-style list: keep the ledger's words as the error message.
    vec![ScabbardInvalidTransaction {
        transaction_id: String::new(),
        error_message: message
            .map(|value| value.to_string())
            .or_else(|| state.dlt_message.clone())
            .unwrap_or_else(|| "rejected by the ledger".into()),
        error_data: Vec::new(),
    }]
}
