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
/// Age of the oldest batch in each unfinished status, since it entered it (scrape time).
pub const BATCHES_OLDEST: &str = "dltsub_batches_oldest_seconds";
/// Services with unfinished batches and no live claim (scrape time).
pub const SERVICES_UNCLAIMED: &str = "dltsub_services_unclaimed";
/// How long the longest-waiting of those services has gone without a live claim.
pub const SERVICES_UNCLAIMED_SECONDS: &str = "dltsub_services_unclaimed_seconds";
/// Services pinned to a label (or excluding one) that no live instance may hold (scrape
/// time).
pub const SERVICES_UNSERVED: &str = "dltsub_services_unserved";
/// Statements (including BEGIN and COMMIT) this instance has sent to the database.
pub const DATABASE_ROUND_TRIPS: &str = "dltsub_database_round_trips_total";
/// Database errors while computing the scrape-time gauges.
pub const SCRAPE_ERRORS: &str = "dltsub_metrics_scrape_errors_total";
/// API requests refused by a limit (`crate::api::limits`), by the limit.
pub const API_LIMITED: &str = "dltsub_api_limited_total";
/// The values of `API_LIMITED`'s `limit` label.
pub const API_LIMITS: &[&str] = &[
    "body_size",
    "batches_per_list",
    "transactions_per_batch",
    "ids_per_query",
    "wait",
    "concurrent_waits",
    "queued_per_service",
    "queued_total",
    "rate",
    "draining",
];

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
    metrics::describe_gauge!(
        BATCHES_OLDEST,
        metrics::Unit::Seconds,
        "Age of the oldest unfinished batch in each status since it entered it, cluster-wide (computed at scrape time)"
    );
    metrics::describe_gauge!(
        SERVICES_UNCLAIMED,
        "Services with unfinished batches and no live claim, cluster-wide (computed at scrape time)"
    );
    metrics::describe_gauge!(
        SERVICES_UNCLAIMED_SECONDS,
        metrics::Unit::Seconds,
        "How long the longest-waiting service with unfinished batches has had no live claim (computed at scrape time)"
    );
    metrics::describe_gauge!(
        SERVICES_UNSERVED,
        "Services pinned to a label (or excluding one) that no live instance may hold, cluster-wide (computed at scrape time)"
    );
    metrics::describe_counter!(
        DATABASE_ROUND_TRIPS,
        "Statements, BEGINs and COMMITs this instance sent to the database"
    );
    metrics::describe_counter!(
        SCRAPE_ERRORS,
        "Scrapes whose database-derived gauges failed"
    );
    metrics::describe_counter!(
        API_LIMITED,
        "API requests refused by a limit (body size, list and query sizes, waits, queue caps, rate, draining), by limit"
    );
}

#[derive(Clone)]
struct Scrape {
    handle: PrometheusHandle,
    store: Store,
    /// An instance silent this long is not live (for the unserved gauge).
    instance_stale_after: std::time::Duration,
}

/// Serves `/metrics` on `listen` until `shutdown`.
pub async fn serve(
    listen: SocketAddr,
    handle: PrometheusHandle,
    store: Store,
    instance_stale_after: std::time::Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape {
            handle,
            store,
            instance_stale_after,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("metrics server")
}

async fn scrape(State(scrape): State<Scrape>) -> impl IntoResponse {
    // Read before this scrape's own query, so a scrape does not count itself.
    metrics::counter!(DATABASE_ROUND_TRIPS).absolute(scrape.store.round_trips());
    match scrape.store.backlog_gauges().await {
        Ok(gauges) => {
            for status in BatchStatus::ALL.into_iter().filter(|s| !s.is_terminal()) {
                let gauge = gauges.by_status.get(&status).copied().unwrap_or_default();
                metrics::gauge!(BATCHES, "status" => status.as_str()).set(gauge.count as f64);
                metrics::gauge!(BATCHES_OLDEST, "status" => status.as_str())
                    .set(seconds(gauge.oldest_age_us));
            }
            metrics::gauge!(SERVICES_UNCLAIMED).set(gauges.unclaimed_services as f64);
            metrics::gauge!(SERVICES_UNCLAIMED_SECONDS)
                .set(seconds(gauges.unclaimed_oldest_age_us));
        }
        Err(error) => {
            // Serve the process's own metrics anyway; the gauges keep their last values.
            metrics::counter!(SCRAPE_ERRORS).increment(1);
            tracing::warn!(%error, "computing batch gauges for a scrape failed");
        }
    }
    match scrape
        .store
        .unserved_services(scrape.instance_stale_after)
        .await
    {
        Ok(unserved) => metrics::gauge!(SERVICES_UNSERVED).set(unserved as f64),
        Err(error) => {
            metrics::counter!(SCRAPE_ERRORS).increment(1);
            tracing::warn!(%error, "computing the unserved services gauge for a scrape failed");
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        scrape.handle.render(),
    )
}

fn seconds(micros: i64) -> f64 {
    micros as f64 / 1e6
}

/// A metric family dltsub exports: its name and the labels whose values are a closed set.
#[derive(Debug, Clone)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    /// `(label, every value it takes)`.
    pub labels: Vec<(&'static str, &'static [&'static str])>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

const STATUSES: &[&str] = &[
    "QUEUED",
    "SUBMITTING",
    "PENDING",
    "VALID",
    "IN_DOUBT",
    "COMMITTED",
    "INVALID",
    "CANCELLED",
];
const UNFINISHED: &[&str] = &["QUEUED", "SUBMITTING", "PENDING", "VALID", "IN_DOUBT"];

/// Every metric family dltsub exports, built from the constants the crates record them
/// under, so renaming a metric or a label value in the code changes this list. The
/// deploy test checks that every `dltsub_` name and label value used by the alerting
/// rules, their unit tests and the dashboard is in it (`daemon/tests/deploy_rules.rs`),
/// and the end-to-end test that every family a real instance exports is.
pub fn catalogue() -> Vec<Family> {
    use dltsub_observer::metrics as observer;
    use dltsub_queuer::metrics as queuer;
    use dltsub_submitter::metrics as submitter;
    let outcome = || vec![("outcome", submitter::OUTCOMES)];
    let family = |name, kind, labels: &[(&'static str, &'static [&'static str])]| Family {
        name,
        kind,
        labels: labels.to_vec(),
    };
    vec![
        family(BATCHES, Kind::Gauge, &[("status", UNFINISHED)]),
        family(BATCHES_OLDEST, Kind::Gauge, &[("status", UNFINISHED)]),
        family(SERVICES_UNCLAIMED, Kind::Gauge, &[]),
        family(SERVICES_UNCLAIMED_SECONDS, Kind::Gauge, &[]),
        family(SERVICES_UNSERVED, Kind::Gauge, &[]),
        family(SCRAPE_ERRORS, Kind::Counter, &[]),
        family(DATABASE_ROUND_TRIPS, Kind::Counter, &[]),
        family(API_LIMITED, Kind::Counter, &[("limit", API_LIMITS)]),
        family(submitter::SUBMISSIONS, Kind::Counter, &outcome()),
        family(submitter::SUBMITTED_BATCHES, Kind::Counter, &outcome()),
        family(submitter::POST_SECONDS, Kind::Histogram, &[]),
        family(submitter::IN_FLIGHT, Kind::Gauge, &[]),
        family(submitter::SELF_FENCED, Kind::Counter, &[]),
        family(
            observer::TRANSITIONS,
            Kind::Counter,
            &[("status", STATUSES)],
        ),
        family(observer::POLLS, Kind::Counter, &[]),
        family(observer::POLL_ERRORS, Kind::Counter, &[]),
        family(queuer::CLAIMS_HELD, Kind::Gauge, &[]),
        family(queuer::CLAIMS_ACQUIRED, Kind::Counter, &[]),
        family(queuer::CLAIMS_RELEASED, Kind::Counter, &[]),
        family(queuer::CLAIMS_LOST, Kind::Counter, &[]),
        family(queuer::GONE_HOLDERS, Kind::Counter, &[]),
        family(queuer::FENCED_WRITES_REJECTED, Kind::Counter, &[]),
        family(queuer::TICK_SECONDS, Kind::Histogram, &[]),
        family(queuer::TICK_ERRORS, Kind::Counter, &[]),
        family(queuer::IS_LEADER, Kind::Gauge, &[]),
    ]
}

#[cfg(test)]
mod tests {
    use dltsub_store::BatchStatus;

    /// The status label values of the catalogue are the store's own names.
    #[test]
    fn catalogue_statuses_are_the_stores() {
        let all: Vec<&str> = BatchStatus::ALL
            .into_iter()
            .map(BatchStatus::as_str)
            .collect();
        assert_eq!(all, super::STATUSES);
        let unfinished: Vec<&str> = BatchStatus::ALL
            .into_iter()
            .filter(|status| !status.is_terminal())
            .map(BatchStatus::as_str)
            .collect();
        assert_eq!(unfinished, super::UNFINISHED);
    }
}
