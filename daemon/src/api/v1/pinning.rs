//! `POST /api/v1/services/{service_id}/pin`: pins a service to an instance label or keeps
//! it away from one (DESIGN.md §3, pinning), answered with an execution report.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use dltsub_store::Pin;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ApiPath, ErrorBody, Report, ReportState};
use crate::api::ApiState;
use crate::api::openapi::TAG_V1;

pub fn guarded_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(pin))
}

/// `{"pin_label": "gpu" | null, "exclude_label": "eu" | null}`; a missing field is null,
/// so `{}` clears both.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PinBody {
    /// Only instances with this label may hold the service (lowercase letters, digits, `.`
    /// and `-`; empty or null: any).
    #[serde(default)]
    pin_label: Option<String>,
    /// No instance with this label may hold the service (empty or null: none excluded).
    #[serde(default)]
    exclude_label: Option<String>,
}

/// Pins the service to an instance label, or keeps it away from one.
#[utoipa::path(
    post,
    path = "/api/v1/services/{service_id}/pin",
    operation_id = "pin_service",
    tag = TAG_V1,
    security(("bearer" = [])),
    params(("service_id" = String, Path, description = "The service.", example = "schemathesis::svc")),
    request_body(content = PinBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Executed.", body = Report),
        (status = 400, description = "Not the JSON object expected, or a malformed label.", body = ErrorBody),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 404, description = "No such service.", body = ErrorBody),
        (status = 413, description = "The body is larger than max_body_size.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn pin(
    State(state): State<ApiState>,
    ApiPath(service_id): ApiPath<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: PinBody = super::json_object(&body).map_err(|error| {
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
