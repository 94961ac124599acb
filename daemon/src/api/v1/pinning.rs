//! `POST /api/v1/services/{service_id}/pin`: pins a service to an instance label or keeps
//! it away from one (DESIGN.md §3, pinning), answered with an execution report.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use dltsub_store::Pin;
use serde::Deserialize;

use super::{ApiError, Report, ReportState};
use crate::api::ApiState;

pub fn guarded_routes() -> Router<ApiState> {
    Router::new().route("/api/v1/services/{service_id}/pin", post(pin))
}

/// `{"pin_label": "gpu" | null, "exclude_label": "eu" | null}`; a missing field is null,
/// so `{}` clears both.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinBody {
    #[serde(default)]
    pin_label: Option<String>,
    #[serde(default)]
    exclude_label: Option<String>,
}

async fn pin(
    State(state): State<ApiState>,
    Path(service_id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: PinBody = serde_json::from_slice(&body).map_err(|error| {
        ApiError::bad_request(
            "body",
            format!("expected JSON {{\"pin_label\": LABEL or null, \"exclude_label\": LABEL or null}}: {error}"),
        )
    })?;
    // An empty text from a form means "none".
    let none_if_empty = |label: Option<String>| label.filter(|label| !label.trim().is_empty());
    let pin = Pin {
        pin_label: none_if_empty(body.pin_label),
        exclude_label: none_if_empty(body.exclude_label),
    };
    let found = state
        .store
        .set_service_pin(&service_id, &pin)
        .await
        .map_err(ApiError::from_store)?;
    if !found {
        return Err(ApiError::unknown_service(&service_id));
    }
    let reason = match (&pin.pin_label, &pin.exclude_label) {
        (None, None) => "any instance may hold the service".to_string(),
        (Some(pin), None) => format!("only instances labelled {pin:?} may hold the service"),
        (None, Some(exclude)) => format!("no instance labelled {exclude:?} may hold the service"),
        (Some(pin), Some(exclude)) => {
            format!("only instances labelled {pin:?} and not {exclude:?} may hold the service")
        }
    };
    Ok(Report {
        operation: "pin",
        state: ReportState::Executed,
        reason: Some(format!(
            "{reason}; the holder hands it over on its next tick if it no longer qualifies"
        )),
        service_id,
        batch_ids: Vec::new(),
        batches: Vec::new(),
    }
    .into_response())
}
