//! `/api/v1/batches…`: batch statuses by id (with `wait`), one batch with its history,
//! cancel and requeue.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dltsub_store::{BatchMoveKind, BatchRecord, BatchStatus};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    ApiError, ApiPath, ApiQuery, BatchSummary, ErrorBody, Report, ReportState, check_batch_id,
    parse_wait, timestamp,
};
use crate::api::openapi::TAG_V1;
use crate::api::split_ids;
use crate::api::{ApiState, states_after_wait};

/// Most ids one status request may name.
pub const MAX_IDS: usize = 1_000;

pub fn open_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(statuses))
        .routes(routes!(show))
}

pub fn guarded_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(cancel))
        .routes(routes!(requeue))
}

/// The query of `GET /api/v1/batches`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatusesQuery {
    /// The batch ids, comma-separated (at most 1,000; each 128 hexadecimal characters).
    #[param(
        required = true,
        pattern = "^,*[0-9a-fA-F]{128}(,+[0-9a-fA-F]{128})*,*$",
        example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"
    )]
    pub ids: Option<String>,
    /// Only batches of this service.
    pub service_id: Option<String>,
    /// Answer once every batch is final or after this long (`30s`, `500ms`; at most 5m).
    pub wait: Option<String>,
}

/// `{"batches": [...], "unknown_ids": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
struct BatchStatusesView<'a> {
    batches: Vec<BatchSummary>,
    /// The ids asked for that name no batch (of the service, if given).
    unknown_ids: Vec<&'a str>,
}

/// The statuses of the batches `ids` names, after `wait` if given.
#[utoipa::path(
    get,
    path = "/api/v1/batches",
    operation_id = "batch_statuses",
    tag = TAG_V1,
    params(StatusesQuery),
    responses(
        (status = 200, description = "The batches found and the ids unknown.", body = BatchStatusesView),
        (status = 400, description = "No ids, too many, a malformed id or wait.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn statuses(
    State(state): State<ApiState>,
    ApiQuery(query): ApiQuery<StatusesQuery>,
) -> Result<Response, ApiError> {
    let wait = parse_wait(query.wait.as_deref())?;
    let ids = parse_ids(query.ids.as_deref())?;
    let service_id = query.service_id.as_deref();
    if !wait.is_zero() {
        states_after_wait(&state, service_id, &ids, wait)
            .await
            .map_err(ApiError::unavailable)?;
    }
    let found = state
        .store
        .find_batches(service_id, &ids)
        .await
        .map_err(ApiError::unavailable)?;
    let unknown_ids: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !found.iter().any(|batch| batch.batch_id == *id))
        .collect();
    let batches: Vec<BatchSummary> = found.into_iter().map(BatchSummary::from).collect();
    Ok(Json(BatchStatusesView {
        batches,
        unknown_ids,
    })
    .into_response())
}

/// The `ids` of `GET /api/v1/batches`: 1 to [`MAX_IDS`] batch ids, comma-separated.
pub fn parse_ids(text: Option<&str>) -> Result<Vec<&str>, ApiError> {
    let ids = split_ids(text);
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            "ids",
            "give the batch ids as ?ids=a,b (comma-separated)",
        ));
    }
    if ids.len() > MAX_IDS {
        return Err(ApiError::bad_request(
            "ids",
            format!("at most {MAX_IDS} ids per request, not {}", ids.len()),
        ));
    }
    for id in &ids {
        check_batch_id("ids", id)?;
    }
    Ok(ids)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ServiceQuery {
    /// The service of the batch; needed when the id exists in several services.
    service_id: Option<String>,
}

/// The one batch `batch_id` names (in `service_id` if given): 404 if none, 409 if the
/// id exists in several services and none was given.
async fn one_batch(
    state: &ApiState,
    batch_id: &str,
    service_id: Option<&str>,
) -> Result<BatchRecord, ApiError> {
    check_batch_id("batch_id", batch_id)?;
    let mut found = state
        .store
        .find_batches(service_id, &[batch_id])
        .await
        .map_err(ApiError::unavailable)?;
    match found.len() {
        0 => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_batch",
            match service_id {
                Some(service_id) => format!("no batch {batch_id} in service {service_id:?}"),
                None => format!("no batch {batch_id}"),
            },
        )),
        1 => Ok(found.remove(0)),
        _ => {
            let services: Vec<&str> = found.iter().map(|b| b.service_id.as_str()).collect();
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "ambiguous_batch",
                format!(
                    "batch {batch_id} exists in several services ({}); add ?service_id=",
                    services.join(", ")
                ),
            ))
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
struct HistoryEntry {
    at: String,
    old_status: Option<String>,
    new_status: String,
    epoch: Option<i64>,
    instance_id: Option<String>,
    detail: Option<String>,
}

/// A batch with every transition it went through.
#[derive(Debug, Serialize, ToSchema)]
struct BatchWithHistory {
    #[serde(flatten)]
    batch: BatchSummary,
    history: Vec<HistoryEntry>,
}

/// One batch with its history (every transition, epoch, instance).
#[utoipa::path(
    get,
    path = "/api/v1/batches/{batch_id}",
    operation_id = "get_batch",
    tag = TAG_V1,
    params(
        ("batch_id" = String, Path, description = "The batch id (128 hexadecimal characters).",
         pattern = "^[0-9a-fA-F]{128}$", example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"),
        ServiceQuery,
    ),
    responses(
        (status = 200, description = "The batch and its history.", body = BatchWithHistory),
        (status = 400, description = "A malformed batch id.", body = ErrorBody),
        (status = 404, description = "No such batch.", body = ErrorBody),
        (status = 409, description = "The id exists in several services; add ?service_id=.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn show(
    State(state): State<ApiState>,
    ApiPath(batch_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ServiceQuery>,
) -> Result<Response, ApiError> {
    let batch = one_batch(&state, &batch_id, query.service_id.as_deref()).await?;
    let history = state
        .store
        .batch_history(batch.seq)
        .await
        .map_err(ApiError::unavailable)?
        .into_iter()
        .map(|event| HistoryEntry {
            at: timestamp(event.at_us),
            old_status: event.old_status,
            new_status: event.new_status,
            epoch: event.epoch,
            instance_id: event.instance_id,
            detail: event.detail,
        })
        .collect();
    Ok(Json(BatchWithHistory {
        batch: batch.into(),
        history,
    })
    .into_response())
}

/// Cancels a QUEUED batch; denied once it is mid-submission or later.
#[utoipa::path(
    post,
    path = "/api/v1/batches/{batch_id}/cancel",
    operation_id = "cancel_batch",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(
        ("batch_id" = String, Path, description = "The batch id (128 hexadecimal characters).",
         pattern = "^[0-9a-fA-F]{128}$", example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"),
        ServiceQuery,
    ),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "A malformed batch id.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such batch.", body = ErrorBody),
        (status = 409, description = "Denied (an execution report), or the id exists in several services (an error; add ?service_id=).",
         content_type = "application/json", body = inline(MoveConflict)),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn cancel(
    State(state): State<ApiState>,
    ApiPath(batch_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ServiceQuery>,
) -> Result<Response, ApiError> {
    move_batch(
        &state,
        &batch_id,
        query.service_id.as_deref(),
        BatchMoveKind::Cancel,
    )
    .await
}

/// Requeues a QUEUED (backoff cleared) or IN_DOUBT batch; denied on others.
#[utoipa::path(
    post,
    path = "/api/v1/batches/{batch_id}/requeue",
    operation_id = "requeue_batch",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(
        ("batch_id" = String, Path, description = "The batch id (128 hexadecimal characters).",
         pattern = "^[0-9a-fA-F]{128}$", example = "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab"),
        ServiceQuery,
    ),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "A malformed batch id.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such batch.", body = ErrorBody),
        (status = 409, description = "Denied (an execution report), or the id exists in several services (an error; add ?service_id=).",
         content_type = "application/json", body = inline(MoveConflict)),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn requeue(
    State(state): State<ApiState>,
    ApiPath(batch_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ServiceQuery>,
) -> Result<Response, ApiError> {
    move_batch(
        &state,
        &batch_id,
        query.service_id.as_deref(),
        BatchMoveKind::Requeue,
    )
    .await
}

/// A 409 of a move: a denied execution report or an ambiguous id.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // describes the two bodies
enum MoveConflict {
    #[schema(title = "denied")]
    Denied(Report),
    #[schema(title = "ambiguous")]
    Ambiguous(ErrorBody),
}

async fn move_batch(
    state: &ApiState,
    batch_id: &str,
    service_id: Option<&str>,
    kind: BatchMoveKind,
) -> Result<Response, ApiError> {
    let batch = one_batch(state, batch_id, service_id).await?;
    let moved = state
        .store
        .move_batch(batch.seq, kind)
        .await
        .map_err(ApiError::unavailable)?
        .ok_or_else(|| {
            // Retention removed it between the two reads.
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_batch",
                format!("no batch {batch_id}"),
            )
        })?;
    let (operation, report_state, reason) = decide(kind, moved.changed, moved.before);
    if moved.changed {
        state.wakeup.wake();
    }
    Ok(Report {
        operation,
        state: report_state,
        reason: reason.map(|why| format!("batch {batch_id} {why}")),
        service_id: moved.batch.service_id.clone(),
        batch_ids: vec![batch_id.to_string()],
        batches: vec![moved.batch.into()],
    }
    .into_response())
}

/// The report for an operator move on a batch that was `before`: the conflict rules of
/// DESIGN.md §6.
fn decide(
    kind: BatchMoveKind,
    changed: bool,
    before: BatchStatus,
) -> (&'static str, ReportState, Option<String>) {
    let operation = match kind {
        BatchMoveKind::Cancel => "cancel",
        BatchMoveKind::Requeue => "requeue",
    };
    if changed {
        let note = (kind == BatchMoveKind::Requeue && before == BatchStatus::InDoubt).then(|| {
            "was IN_DOUBT and is QUEUED again: if the ledger had received it, a scabbard ledger executes it twice"
                .to_string()
        });
        return (operation, ReportState::Executed, note);
    }
    if kind == BatchMoveKind::Cancel && before == BatchStatus::Cancelled {
        return (
            operation,
            ReportState::Executed,
            Some("was already CANCELLED".into()),
        );
    }
    let why = match before {
        BatchStatus::Submitting => "mid-submission",
        BatchStatus::Pending | BatchStatus::Valid => {
            "in the ledger's hands, waiting for its verdict"
        }
        BatchStatus::InDoubt => {
            "the ledger may have it and is being asked (requeue it to resubmit)"
        }
        BatchStatus::Committed | BatchStatus::Invalid | BatchStatus::Cancelled => {
            "final and cannot change"
        }
        // Only reached if a concurrent move changed it between the read and the update.
        BatchStatus::Queued => "changed while the move was decided; retry",
    };
    (
        operation,
        ReportState::Denied,
        Some(format!("is {before}: {why}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_rules() {
        use BatchMoveKind::{Cancel, Requeue};
        use BatchStatus::*;
        let state = |kind, changed, before| decide(kind, changed, before).1;
        assert_eq!(state(Cancel, true, Queued), ReportState::Executed);
        assert_eq!(state(Cancel, false, Cancelled), ReportState::Executed);
        for before in [Submitting, Pending, Valid, InDoubt, Committed, Invalid] {
            assert_eq!(
                state(Cancel, false, before),
                ReportState::Denied,
                "{before}"
            );
        }
        assert_eq!(state(Requeue, true, Queued), ReportState::Executed);
        assert_eq!(state(Requeue, true, InDoubt), ReportState::Executed);
        for before in [Submitting, Pending, Valid, Committed, Invalid, Cancelled] {
            assert_eq!(
                state(Requeue, false, before),
                ReportState::Denied,
                "{before}"
            );
        }
        let (_, _, reason) = decide(Cancel, false, Submitting);
        assert_eq!(reason.as_deref(), Some("is SUBMITTING: mid-submission"));
        let (_, _, reason) = decide(Requeue, false, Committed);
        assert_eq!(
            reason.as_deref(),
            Some("is COMMITTED: final and cannot change")
        );
    }
}
