//! `/api/v1/batches…`: batch statuses by id (with `wait`), one batch with its history,
//! cancel and requeue.

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dltsub_store::{BatchMoveKind, BatchRecord, BatchStatus};
use serde::{Deserialize, Serialize};

use super::{ApiError, BatchSummary, Report, ReportState, check_batch_id, parse_wait, timestamp};
use crate::api::split_ids;
use crate::api::{ApiState, states_after_wait};

/// Most ids one status request may name.
pub const MAX_IDS: usize = 1_000;

pub fn open_routes() -> Router<ApiState> {
    Router::new()
        .route("/api/v1/batches", get(statuses))
        .route("/api/v1/batches/{batch_id}", get(show))
}

pub fn guarded_routes() -> Router<ApiState> {
    Router::new()
        .route("/api/v1/batches/{batch_id}/cancel", post(cancel))
        .route("/api/v1/batches/{batch_id}/requeue", post(requeue))
}

/// The query of `GET /api/v1/batches`.
#[derive(Debug, Deserialize)]
pub struct StatusesQuery {
    pub ids: Option<String>,
    pub service_id: Option<String>,
    pub wait: Option<String>,
}

async fn statuses(
    State(state): State<ApiState>,
    Query(query): Query<StatusesQuery>,
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
    Ok(Json(serde_json::json!({ "batches": batches, "unknown_ids": unknown_ids })).into_response())
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

#[derive(Debug, Deserialize)]
struct ServiceQuery {
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

#[derive(Debug, Serialize)]
struct HistoryEntry {
    at: String,
    old_status: Option<String>,
    new_status: String,
    epoch: Option<i64>,
    instance_id: Option<String>,
    detail: Option<String>,
}

#[derive(Debug, Serialize)]
struct BatchWithHistory {
    #[serde(flatten)]
    batch: BatchSummary,
    history: Vec<HistoryEntry>,
}

async fn show(
    State(state): State<ApiState>,
    Path(batch_id): Path<String>,
    Query(query): Query<ServiceQuery>,
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

async fn cancel(
    State(state): State<ApiState>,
    Path(batch_id): Path<String>,
    Query(query): Query<ServiceQuery>,
) -> Result<Response, ApiError> {
    move_batch(
        &state,
        &batch_id,
        query.service_id.as_deref(),
        BatchMoveKind::Cancel,
    )
    .await
}

async fn requeue(
    State(state): State<ApiState>,
    Path(batch_id): Path<String>,
    Query(query): Query<ServiceQuery>,
) -> Result<Response, ApiError> {
    move_batch(
        &state,
        &batch_id,
        query.service_id.as_deref(),
        BatchMoveKind::Requeue,
    )
    .await
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
