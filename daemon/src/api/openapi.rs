//! The OpenAPI 3 document of the HTTP API, served at `GET /api/v1/openapi.json`.
//!
//! Every route of the API is registered through `utoipa_axum`'s `OpenApiRouter` with
//! `routes!`, which adds the handler to the axum router and its `#[utoipa::path]` to the
//! document in one step: a route cannot be served without being documented, nor documented
//! without being served (`daemon/tests/openapi.rs` checks both against a running instance).
//! The console (`/console/…`) is the one part left out: a page and its private reads.
//!
//! The JSON shapes of the ledger-compatible routes are the ledgers' own (`dltsub_wire`);
//! the schemas here describe them for the document without making `wire` depend on utoipa.

use std::sync::Arc;

use axum::Extension;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// The document as served, rendered once when the router is built.
#[derive(Clone)]
pub struct OpenApiJson(pub Arc<String>);

/// Tag of the native API's routes.
pub const TAG_V1: &str = "api-v1";
/// Tag of the scabbard-compatible routes.
pub const TAG_SCABBARD: &str = "scabbard";
/// Tag of the Sawtooth-compatible routes.
pub const TAG_SAWTOOTH: &str = "sawtooth";
/// Tag of `/healthz`, `/readyz` and the document itself.
pub const TAG_OPERATIONS: &str = "operations";
// The patterns and examples below are repeated as literals in the handlers' attributes
// (utoipa takes only literals there): batch ids are 128 hexadecimal characters; lists are
// comma-separated, empty items skipped; the example service `schemathesis::svc` and batch
// `abab…` are those scripts/schemathesis creates before its run.

/// The security scheme of the native API's guarded routes.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dltsub",
        description = "A high-availability batch submitter for a distributed ledger. \
            The ledger-compatible routes (scabbard, Sawtooth) answer as the ledger does; \
            the native API under /api/v1 answers every operation with an execution report \
            and every refusal with {\"error\": {\"code\", \"field\"?, \"message\"}} \
            (docs/api-v1.md).",
    ),
    modifiers(&BearerScheme),
    tags(
        (name = TAG_V1, description = "The native JSON API (docs/api-v1.md)."),
        (name = TAG_SCABBARD, description = "Splinter scabbard's routes, answered from dltsub's database; service_id = circuit::service."),
        (name = TAG_SAWTOOTH, description = "The Sawtooth REST API's routes, answered from dltsub's database."),
        (name = TAG_OPERATIONS, description = "Health, readiness and this document."),
    ),
)]
pub struct ApiDoc;

/// `Authorization: Bearer <api_token>`, needed by the guarded routes when `api_token` is set.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The document of `router`'s routes, completed with the top-level information.
pub fn finish(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    document.info.version = env!("CARGO_PKG_VERSION").to_string();
    add_limit_responses(&mut document);
    document
}

/// The limits layer (`limits.rs`) answers before any handler, so its refusals are added
/// to every operation it guards here rather than in each handler's attribute: 429 for the
/// request rate per client and for waits beyond `max_concurrent_waits`, and 413 for a body
/// over `max_body_size` (or too many batches or transactions) on every operation with a
/// body. Each in the error shape of the operation's family. `/healthz` and `/readyz` are
/// never limited.
fn add_limit_responses(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    for (path, item) in document.paths.paths.iter_mut() {
        if path == "/healthz" || path == "/readyz" {
            continue;
        }
        let error_schema = if path.starts_with("/api/v1/") {
            "ErrorBody"
        } else if path.starts_with("/scabbard/") {
            "ScabbardErrorBody"
        } else {
            "SawtoothErrorBody"
        };
        let response = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name(error_schema)))
                        .build(),
                )
                .build()
        };
        let operations = [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ];
        for operation in operations.into_iter().flatten() {
            let responses = &mut operation.responses.responses;
            responses.entry("429".into()).or_insert_with(|| {
                response(
                    "Too many requests from this client (rate_limit_per_client) or too many \
                     requests waiting at once (max_concurrent_waits); see Retry-After.",
                )
                .into()
            });
            if operation.request_body.is_some() {
                responses
                    .entry("413".into())
                    .or_insert_with(|| response("The body is larger than max_body_size.").into());
            }
        }
    }
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "openapi_document",
    tag = TAG_OPERATIONS,
    responses(
        (status = 200, description = "The OpenAPI 3 document of every route but the console's.",
         content_type = "application/json", body = Object),
    ),
)]
pub async fn openapi_json(Extension(document): Extension<OpenApiJson>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document.0.as_str().to_owned(),
    )
        .into_response()
}

/// A protobuf `BatchList` (`BatchList { repeated Batch batches = 1 }`), as a ledger client
/// POSTs it.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct BatchListBody(pub Vec<u8>);

/// `{"link": …}`: where the batches' statuses can be read.
#[derive(Serialize, ToSchema)]
pub struct Link {
    pub link: String,
}

/// `/healthz` and `/readyz`.
#[derive(Serialize, ToSchema)]
pub struct HealthStatus {
    /// `ok`, `ready`, `draining`, `database unreachable`, `database read-only`, `schema not
    /// current`.
    pub status: String,
    /// Why the instance is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Migrations the database lacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_migrations: Option<u64>,
}

/// Splinter's error body: `{"code": "400", "message": …}` (the code is a string).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // describes dltsub_wire::scabbard::ScabbardError
pub struct ScabbardErrorBody {
    /// The HTTP status, as text.
    pub code: String,
    pub message: String,
}

/// Scabbard's status of one batch.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // describes dltsub_wire::scabbard::ScabbardBatchInfo
pub struct ScabbardBatchInfo {
    pub id: String,
    pub status: ScabbardStatus,
    /// When dltsub accepted the batch (for an unknown id: when it answered).
    pub timestamp: ScabbardTimestamp,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ScabbardTimestamp {
    pub secs_since_epoch: u64,
    pub nanos_since_epoch: u32,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ScabbardStatus {
    #[serde(rename = "statusType")]
    pub status_type: ScabbardStatusType,
    /// Empty for Pending and Unknown; the ledger's transactions otherwise.
    pub message: Vec<ScabbardTransaction>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub enum ScabbardStatusType {
    Pending,
    Invalid,
    Valid,
    Committed,
    Unknown,
}

/// A transaction of a Valid or Committed batch (`transaction_id`), or of an Invalid one
/// (with `error_message` and `error_data`, bytes).
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ScabbardTransaction {
    pub transaction_id: String,
    pub error_message: Option<String>,
    pub error_data: Option<Vec<u8>>,
}

/// The Sawtooth REST API's error body: `{"error": {"code": 34, "message", "title"}}`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // describes dltsub_wire::sawtooth::ErrorBody
pub struct SawtoothErrorBody {
    pub error: SawtoothError,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SawtoothError {
    /// Sawtooth's error code (30, 31, 34, 35, 42, 43, 46, 60, 66, 15) or, for dltsub's own
    /// refusals (409, 413), the HTTP status.
    pub code: u32,
    pub message: String,
    pub title: String,
}

/// A Sawtooth `batch_statuses` answer.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // describes dltsub_wire::sawtooth::BatchStatuses
pub struct SawtoothBatchStatuses {
    pub data: Vec<SawtoothBatchStatus>,
    /// The queried URL, absolute; only for a GET.
    pub link: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SawtoothBatchStatus {
    pub id: String,
    pub invalid_transactions: Vec<SawtoothInvalidTransaction>,
    pub status: SawtoothStatusType,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
#[serde(rename_all = "UPPERCASE")]
pub enum SawtoothStatusType {
    Pending,
    Invalid,
    Committed,
    Unknown,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SawtoothInvalidTransaction {
    pub id: String,
    pub message: Option<String>,
    pub extended_data: Option<String>,
}

/// The body of a POSTed Sawtooth status request: a JSON array of at least one lower-case
/// batch id.
pub struct SawtoothIds;

impl utoipa::PartialSchema for SawtoothIds {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
        ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9a-f]{128}$")),
            )
            .min_items(Some(1))
            .into()
    }
}

impl ToSchema for SawtoothIds {}
