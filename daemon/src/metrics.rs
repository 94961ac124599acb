//! The Prometheus endpoint: `/metrics` on its own port (`metrics_listen`).
//!
//! Counters and histograms are recorded by the crates as things happen; gauges derived from
//! the database (the backlog by status) are computed at scrape time, so they are never
//! stale and cost nothing between scrapes. They are cluster-wide: every instance reports
//! the same numbers (aggregate with `max`, not `sum`).

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use dltsub_store::{BatchStatus, Store};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// Batches by status, over the unfinished statuses (computed at scrape time).
pub const BATCHES: &str = "dltsub_batches";
/// Statements (including BEGIN and COMMIT) this instance has sent to the database.
pub const DATABASE_ROUND_TRIPS: &str = "dltsub_database_round_trips_total";
/// Database errors while computing the scrape-time gauges.
pub const SCRAPE_ERRORS: &str = "dltsub_metrics_scrape_errors_total";

/// Installs the process-wide recorder, with histogram buckets for the latency metrics so
/// Prometheus can aggregate them across instances. Call once per process.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let latency = dltsub_submitter::metrics::LATENCY_BUCKETS;
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(dltsub_submitter::metrics::POST_SECONDS.into()),
            latency,
        )?
        .set_buckets_for_metric(
            Matcher::Full(dltsub_queuer::metrics::TICK_SECONDS.into()),
            latency,
        )?
        .install_recorder()
        .context("installing the metrics recorder")
}

pub fn describe() {
    metrics::describe_gauge!(
        BATCHES,
        "Unfinished batches by status, cluster-wide (computed at scrape time)"
    );
    metrics::describe_counter!(
        DATABASE_ROUND_TRIPS,
        "Statements, BEGINs and COMMITs this instance sent to the database"
    );
    metrics::describe_counter!(
        SCRAPE_ERRORS,
        "Scrapes whose database-derived gauges failed"
    );
}

#[derive(Clone)]
struct Scrape {
    handle: PrometheusHandle,
    store: Store,
}

/// Serves `/metrics` on `listen` until `shutdown`.
pub async fn serve(
    listen: SocketAddr,
    handle: PrometheusHandle,
    store: Store,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape { handle, store });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("metrics server")
}

async fn scrape(State(scrape): State<Scrape>) -> impl IntoResponse {
    // Read before this scrape's own query, so a scrape does not count itself.
    metrics::counter!(DATABASE_ROUND_TRIPS).absolute(scrape.store.round_trips());
    match scrape.store.count_unfinished_by_status().await {
        Ok(counts) => {
            for status in BatchStatus::ALL.into_iter().filter(|s| !s.is_terminal()) {
                let count = counts.get(&status).copied().unwrap_or(0);
                metrics::gauge!(BATCHES, "status" => status.as_str()).set(count as f64);
            }
        }
        Err(error) => {
            // Serve the process's own metrics anyway; the gauges keep their last values.
            metrics::counter!(SCRAPE_ERRORS).increment(1);
            tracing::warn!(%error, "computing batch gauges for a scrape failed");
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        scrape.handle.render(),
    )
}
