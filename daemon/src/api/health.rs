//! `/healthz` (the process answers) and `/readyz` (it can do its job: database reachable,
//! schema current, not draining) for the load balancer.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};

use super::ApiState;

pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
}

async fn readyz(State(state): State<ApiState>) -> (StatusCode, Json<Value>) {
    if state.draining.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
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
