//! `/api/v1/claims` and `/api/v1/instances`: who holds what, and for how long.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use dltsub_store::ClaimRecord;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{ApiError, ErrorBody, millis_until, timestamp};
use crate::api::ApiState;
use crate::api::openapi::TAG_V1;

pub fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(claims))
        .routes(routes!(instances))
}

/// Where a claim stands at `now` (DESIGN.md §3).
fn phase(claim: &ClaimRecord, now_us: i64) -> &'static str {
    if claim.claimant.is_none() {
        "unclaimed"
    } else if now_us < claim.fast_expiry_us {
        "held"
    } else if now_us < claim.slow_expiry_us {
        "fast_expired"
    } else {
        "expired"
    }
}

#[derive(Debug, Serialize, ToSchema)]
struct ClaimView {
    service_id: String,
    claimant: Option<String>,
    epoch: i64,
    /// `unclaimed`, `held`, `fast_expired` or `expired`.
    phase: &'static str,
    fast_expiry: Option<String>,
    slow_expiry: Option<String>,
    fast_left_ms: Option<i64>,
    slow_left_ms: Option<i64>,
    claimed_at: Option<String>,
}

/// `{"read_at", "claims": [...]}`: the database's time of the read and every claim.
#[derive(Debug, Serialize, ToSchema)]
struct ClaimList {
    read_at: String,
    claims: Vec<ClaimView>,
}

/// Who holds which service, at which epoch, in which phase, and the time left.
#[utoipa::path(
    get,
    path = "/api/v1/claims",
    operation_id = "list_claims",
    tag = TAG_V1,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The claims.", body = ClaimList),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn claims(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let claims = state.store.claims().await.map_err(ApiError::unavailable)?;
    let now_us = state
        .store
        .database_now_us()
        .await
        .map_err(ApiError::unavailable)?;
    let views: Vec<ClaimView> = claims
        .iter()
        .map(|claim| {
            let held = claim.claimant.is_some();
            ClaimView {
                service_id: claim.service_id.clone(),
                claimant: claim.claimant.clone(),
                epoch: claim.epoch,
                phase: phase(claim, now_us),
                fast_expiry: held.then(|| timestamp(claim.fast_expiry_us)),
                slow_expiry: held.then(|| timestamp(claim.slow_expiry_us)),
                fast_left_ms: held.then(|| millis_until(claim.fast_expiry_us, now_us)),
                slow_left_ms: held.then(|| millis_until(claim.slow_expiry_us, now_us)),
                claimed_at: claim.claimed_at_us.map(timestamp),
            }
        })
        .collect();
    Ok(Json(ClaimList {
        read_at: timestamp(now_us),
        claims: views,
    })
    .into_response())
}

#[derive(Debug, Serialize, ToSchema)]
struct InstanceView {
    instance_id: String,
    hostname: String,
    pid: i64,
    version: String,
    capacity: i32,
    state: String,
    started_at: String,
    heartbeat_at: String,
    heartbeat_age_ms: i64,
    claims: usize,
}

/// `{"read_at", "instances": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
struct InstanceList {
    read_at: String,
    instances: Vec<InstanceView>,
}

/// The live instances with their heartbeat age and the claims each holds.
#[utoipa::path(
    get,
    path = "/api/v1/instances",
    operation_id = "list_instances",
    tag = TAG_V1,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The instances.", body = InstanceList),
        (status = 401, description = "api_token is set and the request lacks its bearer token.", body = ErrorBody),
        (status = 503, description = "The database is unavailable.", body = ErrorBody),
    ),
)]
async fn instances(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let instances = state
        .store
        .instances()
        .await
        .map_err(ApiError::unavailable)?;
    let claims = state.store.claims().await.map_err(ApiError::unavailable)?;
    let mut held: HashMap<&str, usize> = HashMap::new();
    for claim in &claims {
        if let Some(claimant) = &claim.claimant {
            *held.entry(claimant.as_str()).or_default() += 1;
        }
    }
    let read_at_us = instances.first().map(|i| i.read_at_us);
    let views: Vec<InstanceView> = instances
        .iter()
        .map(|instance| InstanceView {
            instance_id: instance.instance_id.clone(),
            hostname: instance.hostname.clone(),
            pid: instance.pid,
            version: instance.version.clone(),
            capacity: instance.capacity,
            state: instance.state.clone(),
            started_at: timestamp(instance.started_at_us),
            heartbeat_at: timestamp(instance.heartbeat_at_us),
            heartbeat_age_ms: (instance.read_at_us - instance.heartbeat_at_us) / 1_000,
            claims: held
                .get(instance.instance_id.as_str())
                .copied()
                .unwrap_or(0),
        })
        .collect();
    let read_at_us = match read_at_us {
        Some(at) => at,
        None => state
            .store
            .database_now_us()
            .await
            .map_err(ApiError::unavailable)?,
    };
    Ok(Json(InstanceList {
        read_at: timestamp(read_at_us),
        instances: views,
    })
    .into_response())
}
