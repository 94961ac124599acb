//! dltsub's HTTP API on `listen`: the ledger-compatible ingest routes (a client written for
//! the ledger points at dltsub unchanged), health and readiness for the load balancer.

mod health;
mod scabbard;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use dltsub_store::Store;
use dltsub_submitter::Wakeup;
use tokio_util::sync::CancellationToken;

/// Largest request body accepted (a BatchList): a bound on memory per request.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// What every handler may use.
#[derive(Clone)]
pub struct ApiState {
    pub store: Store,
    /// Wakes this instance's submitter when a batch is accepted.
    pub wakeup: Wakeup,
    /// Set once shutdown starts: `/readyz` answers 503 so the load balancer drains us.
    pub draining: Arc<AtomicBool>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .merge(scabbard::routes())
        .merge(health::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
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
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("API server")
}
