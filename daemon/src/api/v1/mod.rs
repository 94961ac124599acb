//! The native JSON API under `/api/v1` (docs/api-v1.md): services, batches, claims and
//! instances, and the operator's moves, each answered with an execution report.
//!
//! Every failure is an [`ApiError`]: a 4xx or 5xx with a JSON body naming the problem.
//! Handlers validate everything before they write, so a refused request wrote nothing.

mod batches;
mod cluster;
mod pinning;
mod services;

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use dltsub_store::{BatchRecord, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;

use super::ApiState;

pub use batches::{MAX_IDS, StatusesQuery, parse_ids};

/// The `/api/v1` routes; those that change something or show the cluster's inner
/// workings sit behind the bearer token when one is configured.
pub fn routes(state: ApiState) -> OpenApiRouter<ApiState> {
    let guarded = OpenApiRouter::new()
        .merge(services::guarded_routes())
        .merge(batches::guarded_routes())
        .merge(cluster::routes())
        .merge(pinning::guarded_routes())
        .route_layer(middleware::from_fn_with_state(state, require_token));
    let open = OpenApiRouter::new()
        .merge(services::open_routes())
        .merge(batches::open_routes());
    OpenApiRouter::new()
        .merge(guarded)
        .merge(open)
        .fallback(|| async { ApiError::not_found("no such route") })
}

/// An error answered as `{"error": {"code", "field"?, "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    field: Option<&'static str>,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            field: None,
            message: message.into(),
        }
    }

    pub fn bad_request(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field),
            ..Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
        }
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn unknown_service(service_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown_service",
            format!("no service {service_id:?}"),
        )
    }

    /// Failures of the database or other infrastructure: logged here, answered 503 so
    /// a client retries (the load balancer may send it to a healthy instance).
    pub fn unavailable(error: StoreError) -> Self {
        tracing::error!(%error, "API request failed");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database is unavailable; retry later",
        )
    }

    /// Maps the storage errors a request can cause to their 4xx; the rest are 503.
    pub fn from_store(error: StoreError) -> Self {
        match error {
            StoreError::InvalidInput { field, problem } => {
                Self::bad_request(field, format!("invalid {field}: {problem}"))
            }
            StoreError::QueueFull { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                error.to_string(),
            ),
            StoreError::BatchConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            other => Self::unavailable(other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                field: self.field,
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

/// Every refusal of the native API: `{"error": {"code", "field"?, "message"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// `bad_request`, `unauthorized`, `not_found`, `unknown_service`, `unknown_batch`,
    /// `ambiguous_batch`, `conflict`, `payload_too_large`, `unsupported_media_type`,
    /// `queue_full`, `unavailable`.
    pub code: &'static str,
    /// The request part at fault (a query parameter, `body`, a body field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<&'static str>,
    pub message: String,
}

/// axum's `Query`, refused as an [`ApiError`] (JSON, field `query`) rather than axum's plain
/// text: a query string that does not parse (a parameter given twice, say) is a 400 like
/// every other refusal of this API.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(query)) => Ok(Self(query)),
            Err(rejection) => Err(ApiError::bad_request("query", rejection.body_text())),
        }
    }
}

/// axum's `Path`, refused as an [`ApiError`] (JSON, field `path`): a path segment that is
/// not UTF-8 once percent-decoded.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(path)) => Ok(Self(path)),
            Err(rejection) => Err(ApiError::bad_request("path", rejection.body_text())),
        }
    }
}

/// A JSON body that must be an object: serde would also read a struct from an array of its
/// fields' values (`[null, null]`), which the API documents as a refusal.
pub fn json_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("the body is not a JSON object".into());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// Refuses the request with 401 unless it carries `Authorization: Bearer <api_token>`
/// (when a token is configured).
pub(crate) async fn require_token(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(token) = &state.api_token
        && !bearer_matches(request.headers(), token)
    {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this route needs the header Authorization: Bearer <api_token>",
        ));
    }
    Ok(next.run(request).await)
}

fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
    else {
        return false;
    };
    tokens_match(given, token)
}

/// Compares the SHA-256 digests of the two tokens, every byte whatever the first
/// difference: the time taken tells an attacker neither the token's length nor how much of
/// a guess was right.
fn tokens_match(given: &str, token: &str) -> bool {
    use sha2::{Digest, Sha256};
    let given = Sha256::digest(given.as_bytes());
    let token = Sha256::digest(token.as_bytes());
    let difference = given
        .iter()
        .zip(token.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

/// `executed | postponed | denied`, answered 200, 202 and 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReportState {
    Executed,
    Postponed,
    Denied,
}

/// What an operation did (docs/api-v1.md, "Execution reports").
#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    pub operation: &'static str,
    pub state: ReportState,
    pub reason: Option<String>,
    pub service_id: String,
    pub batch_ids: Vec<String>,
    pub batches: Vec<BatchSummary>,
}

impl IntoResponse for Report {
    fn into_response(self) -> Response {
        let status = match self.state {
            ReportState::Executed => StatusCode::OK,
            ReportState::Postponed => StatusCode::ACCEPTED,
            ReportState::Denied => StatusCode::CONFLICT,
        };
        (status, Json(self)).into_response()
    }
}

/// A batch as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchSummary {
    pub service_id: String,
    pub batch_id: String,
    pub seq: i64,
    pub status: String,
    pub attempts: i32,
    pub submit_epoch: Option<i64>,
    pub submitted_by: Option<String>,
    /// The ledger's last status message, as the JSON it was (any JSON value).
    #[schema(value_type = Option<serde_json::Value>)]
    pub dlt_message: Option<serde_json::Value>,
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newly_accepted: Option<bool>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<BatchRecord> for BatchSummary {
    fn from(batch: BatchRecord) -> Self {
        Self {
            dlt_message: batch
                .dlt_message
                .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))),
            service_id: batch.service_id,
            batch_id: batch.batch_id,
            seq: batch.seq,
            status: batch.status,
            attempts: batch.attempts,
            submit_epoch: batch.submit_epoch,
            submitted_by: batch.submitted_by,
            last_error: batch.last_error,
            newly_accepted: None,
            created_at: timestamp(batch.created_at_us),
            updated_at: timestamp(batch.updated_at_us),
        }
    }
}

/// Microseconds since the Unix epoch as RFC 3339 with milliseconds, in UTC.
pub fn timestamp(micros: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The `wait` query parameter: a humantime duration, at most [`super::MAX_WAIT`].
pub fn parse_wait(text: Option<&str>) -> Result<Duration, ApiError> {
    let Some(text) = text else {
        return Ok(Duration::ZERO);
    };
    let wait = humantime::parse_duration(text).map_err(|_| {
        ApiError::bad_request(
            "wait",
            format!("invalid wait {text:?}: expected a duration such as 30s or 500ms"),
        )
    })?;
    if wait > super::MAX_WAIT {
        return Err(ApiError::bad_request(
            "wait",
            format!(
                "wait {text:?} is longer than the longest allowed, {}",
                humantime::format_duration(super::MAX_WAIT)
            ),
        ));
    }
    Ok(wait)
}

/// Checks that `id` is a batch header signature (128 hex characters).
pub fn check_batch_id(field: &'static str, id: &str) -> Result<(), ApiError> {
    if dltsub_store::is_batch_id(id) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            field,
            format!("{id:?} is not a batch id (128 hexadecimal characters)"),
        ))
    }
}

/// Milliseconds from `now_us` to `at_us`; negative when past.
pub fn millis_until(at_us: i64, now_us: i64) -> i64 {
    (at_us - now_us) / 1_000
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        let token = "test-token-0123456789";
        assert!(tokens_match(token, token));
        assert!(!tokens_match("test-token-0123456788", token));
        assert!(!tokens_match("test-token-012345678", token), "a prefix");
        assert!(!tokens_match("test-token-01234567890", token), "longer");
        assert!(!tokens_match("", token));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        assert!(bearer_matches(&headers, token));
        headers.insert(
            header::AUTHORIZATION,
            format!("Basic {token}").parse().unwrap(),
        );
        assert!(!bearer_matches(&headers, token));
    }
}
