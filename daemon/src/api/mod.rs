//! dltsub's HTTP API on `listen`: the ledger-compatible ingest routes (a client written for
//! the ledger points at dltsub unchanged), the native JSON API under `/api/v1`, and health
//! and readiness for the load balancer.

mod health;
pub mod limits;
pub mod openapi;
pub mod sawtooth;
pub mod scabbard;
pub mod v1;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::{Extension, Router};
use dltsub_store::Store;
use dltsub_submitter::Wakeup;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What every handler may use.
#[derive(Clone)]
pub struct ApiState {
    pub store: Store,
    /// Wakes this instance's submitter when a batch is accepted.
    pub wakeup: Wakeup,
    /// Set once shutdown starts: `/readyz` answers 503 so the load balancer drains us.
    pub draining: Arc<AtomicBool>,
    /// The service of batches POSTed to Sawtooth's `/batches` without `?service_id=`.
    pub sawtooth_service_id: String,
    /// Cap on a service's unfinished batches; a submission beyond it answers 429.
    pub max_queued_per_service: Option<u64>,
    /// When set, the native API's operations and admin reads need `Bearer <token>`.
    pub api_token: Option<String>,
    /// Largest request body accepted (a BatchList): a bound on memory per request.
    pub max_body_bytes: usize,
    /// What the operator console shows of the configuration (`crate::console`).
    pub console: crate::console::ConsoleSettings,
    /// The limits every request is checked against (`limits::guard`) and their state.
    pub limits: Arc<limits::Limits>,
}

/// The API's router. Every route but the console's is registered with its OpenAPI
/// operation (`openapi.rs`), so the document served at `/api/v1/openapi.json` lists exactly
/// the routes served.
pub fn router(state: ApiState) -> Router {
    let (api, document) = documented_routes(state.clone()).split_for_parts();
    let document = openapi::OpenApiJson(Arc::new(
        openapi::finish(document)
            .to_json()
            .expect("the OpenAPI document serialises"),
    ));
    api.merge(crate::console::routes(state.clone()))
        .layer(Extension(document))
        // Every limit, before any handler (`limits.rs`); the console's reads too.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limits::guard,
        ))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

fn documented_routes(state: ApiState) -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(scabbard::routes())
        .merge(sawtooth::routes())
        .merge(health::routes())
        .merge(v1::routes(state))
        .routes(routes!(openapi::openapi_json))
}

/// Serves the API on `listen` until `shutdown`.
pub async fn serve(
    listen: SocketAddr,
    state: ApiState,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for the API on {listen}"))?;
    tracing::info!("API on http://{}", listener.local_addr()?);
    // With the peer's address, for the rate limit per client.
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("API server")
}

/// How often a status `wait` re-reads the database.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(25);
/// The longest `wait` honoured, whatever the client asks and `max_wait` says.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The states of `ids`, re-read until every one is final in dltsub (COMMITTED, INVALID,
/// CANCELLED) or `wait` has passed — the ledgers' `wait` semantics, answered from the
/// database.
/// A wait also ends when the instance starts draining, so shutdown is not held up by
/// long polls.
async fn states_after_wait(
    state: &ApiState,
    service_id: Option<&str>,
    ids: &[&str],
    wait: std::time::Duration,
) -> Result<Vec<dltsub_store::BatchState>, dltsub_store::StoreError> {
    let deadline =
        tokio::time::Instant::now() + wait.min(state.limits.settings.max_wait.min(MAX_WAIT));
    loop {
        let states = state.store.batch_states(service_id, ids).await?;
        let all_final = ids.iter().all(|id| {
            states.iter().any(|state| {
                state.batch_id == *id
                    && state
                        .status
                        .parse::<dltsub_store::BatchStatus>()
                        .is_ok_and(|status| status.is_terminal())
            })
        });
        let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
        if all_final || draining || tokio::time::Instant::now() >= deadline {
            return Ok(states);
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// The ids of a status query's comma-separated id list (`?ids=a,b`, `?id=a,b`), in the
/// order given, empty items skipped; no id (absent or only commas) is an empty list.
pub fn split_ids(text: Option<&str>) -> Vec<&str> {
    text.unwrap_or("")
        .split(',')
        .filter(|id| !id.is_empty())
        .collect()
}

/// Each batch of a POSTed list, stored as a BatchList of its own: what dltsub POSTs to the
/// ledger, alone or concatenated with the next ones of its service.
pub fn one_list_per_batch(list: dltsub_wire::BatchList) -> Vec<dltsub_store::NewBatch> {
    use prost::Message;
    list.batches
        .into_iter()
        .map(|batch| dltsub_store::NewBatch {
            batch_id: batch.header_signature.clone(),
            serialized_batch: dltsub_wire::BatchList {
                batches: vec![batch],
            }
            .encode_to_vec(),
        })
        .collect()
}
