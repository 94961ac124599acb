//! `/healthz` (the process answers) and `/readyz` (it can do its job: a writable primary
//! reachable, schema current, not draining) for the load balancer.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::ApiState;
use super::openapi::{HealthStatus, TAG_OPERATIONS};

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// 200 while the process runs.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = TAG_OPERATIONS,
    responses((status = 200, description = "The process answers: `{\"status\": \"ok\"}`.", body = HealthStatus)),
)]
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the database. While no host takes writes (a failover) the
/// pool keeps a caller waiting for its whole connect timeout; a load balancer's check must
/// get its 503 sooner than that.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

/// 200 when a writable database answers and the schema is current; 503 otherwise and
/// while draining.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = TAG_OPERATIONS,
    responses(
        (status = 200, description = "Ready: `{\"status\": \"ready\"}`.", body = HealthStatus),
        (status = 503, description = "Draining, the database unreachable or read-only, or migrations pending.", body = HealthStatus),
    ),
)]
async fn readyz(State(state): State<ApiState>) -> (StatusCode, Json<Value>) {
    if state.draining.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        );
    }
    match tokio::time::timeout(READINESS_TIMEOUT, database_readiness(&state)).await {
        Ok(answer) => answer,
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "database unreachable",
                "error": format!("no writable database answered within {READINESS_TIMEOUT:?}"),
            })),
        ),
    }
}

async fn database_readiness(state: &ApiState) -> (StatusCode, Json<Value>) {
    // Reachable is not enough: after a failover a session may still sit on the old
    // primary, now a standby. Not ready until a session on a writable primary answers.
    if let Err(error) = state.store.check_writable().await {
        let status = if matches!(error, dltsub_store::StoreError::ReadOnly) {
            "database read-only"
        } else {
            "database unreachable"
        };
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": status, "error": error.to_string()})),
        );
    }
    match state.store.pending_migrations().await {
        Ok(0) => (StatusCode::OK, Json(json!({"status": "ready"}))),
        Ok(pending) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "schema not current", "pending_migrations": pending})),
        ),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "database unreachable", "error": error.to_string()})),
        ),
    }
}
