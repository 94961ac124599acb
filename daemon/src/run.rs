//! `dltsub run`: one instance — the queuer, the submitter and the observer, wired together
//! — until a shutdown signal, then a graceful hand-over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use dltsub_observer::{Backoff, Observer, ObserverConfig};
use dltsub_queuer::{Queuer, QueuerConfig, this_instance};
use dltsub_store::Store;
use dltsub_submitter::{Dialect, DltClient, InFlight, Submitter, SubmitterConfig, Wakeup};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::ApiState;
use crate::config::{Config, DltDialect};

/// Outcomes waiting for the observer; the submitter waits when it is full, which bounds
/// memory while the database is slow.
const RESULTS_CHANNEL: usize = 4_096;

/// Starts an instance and runs it until `shutdown` is cancelled; then stops submitting,
/// lets in-flight POSTs finish (up to `shutdown_timeout`), records their outcomes, releases
/// the claims and returns.
///
/// With `metrics`, serves them on `metrics_listen` (the recorder is process-wide, so the
/// binary installs it once; in-process tests pass `None`).
pub async fn run(
    config: &Config,
    shutdown: CancellationToken,
    metrics: Option<PrometheusHandle>,
) -> anyhow::Result<()> {
    let capacity = i32::try_from(config.instance_capacity).unwrap_or(i32::MAX);
    let mut me = this_instance(capacity);
    me.labels = config.instance_labels.clone();
    let mut options = config.store_options();
    // Every session carries the instance's tag, so that other instances can tell when its
    // process is gone (store/src/liveness.rs).
    options.application_name = me.session_tag.clone();
    if config.migrate_on_start {
        dltsub_store::run_migrations(&options)
            .await
            .with_context(|| format!("migrating {}", options.url))?;
    }
    let store = Store::connect(&options)
        .await
        .with_context(|| format!("connecting to {}", options.url))?;
    tracing::info!(
        instance.id = %me.instance_id,
        database = %options.url,
        dlt = %dltsub_store::redact_url(config.dlt_url.as_str()),
        "dltsub instance {} starting",
        me.instance_id
    );
    describe_metrics();

    let mut queuer_config = QueuerConfig::from_timings(
        config.fast_expiry,
        config.slow_expiry,
        config.renew_interval,
    );
    queuer_config.timing.instance_stale_after = config.renew_interval * 3;
    let queuer = Queuer::new(store.clone(), me, queuer_config);
    let claims = queuer.handle();
    let dialect = match config.dlt_dialect {
        DltDialect::Scabbard => Dialect::Scabbard,
        DltDialect::Sawtooth => Dialect::Sawtooth,
    };
    let client = DltClient::new(config.dlt_url.clone(), dialect, config.dlt_request_timeout)
        .context("building the ledger client")?;
    let wakeup = Wakeup::default();
    let in_flight = InFlight::default();
    let (results_tx, results_rx) = mpsc::channel(RESULTS_CHANNEL);
    let submitter = Submitter::new(
        claims.clone(),
        client.clone(),
        SubmitterConfig {
            max_in_flight: config.instance_max_in_flight as usize,
            idle_poll: config.submit_poll_interval,
            drain_timeout: config.shutdown_timeout,
        },
        wakeup.clone(),
        results_tx,
        in_flight.clone(),
    );
    let observer = Observer::new(
        claims,
        client,
        ObserverConfig {
            poll_interval: config.status_poll_interval,
            status_wait: config.status_wait,
            unknown_grace: config.unknown_grace,
            backoff: Backoff {
                base: config.retry_backoff_base,
                max: config.retry_backoff_max,
            },
            // Scabbard puts the ids in the URL (129 bytes each): 50 keep it under the 8 KB
            // many proxies allow. Sawtooth POSTs them above 15.
            ids_per_request: match dialect {
                Dialect::Scabbard => 50,
                Dialect::Sawtooth => 100,
            },
            concurrent_polls: 64,
            record_batch: 1_000,
            // Twice the longest a POST may take: a batch still SUBMITTING with nothing of it
            // in this process by then was lost track of.
            stranded_after: config.dlt_request_timeout * 2,
        },
        wakeup.clone(),
        in_flight,
    );

    // Shutdown runs in order: stop starting POSTs and drain them, record their outcomes,
    // stop polling, then release the claims (the queuer's own shutdown).
    let submit_stop = CancellationToken::new();
    let poll_stop = CancellationToken::new();
    let queuer_stop = CancellationToken::new();
    let queuer_drain = CancellationToken::new();
    let queuer_task = tokio::spawn(queuer.run(queuer_drain.clone(), queuer_stop.clone()));
    let submitter_task = tokio::spawn(submitter.run(submit_stop.clone()));
    let observer_task = tokio::spawn(observer.run(results_rx, poll_stop.clone()));
    let api_stop = CancellationToken::new();
    let draining = Arc::new(AtomicBool::new(false));
    let mut api_failure: Option<anyhow::Error> = None;
    let mut api_task = tokio::spawn(crate::api::serve(
        config.listen,
        ApiState {
            store: store.clone(),
            wakeup: wakeup.clone(),
            draining: draining.clone(),
            sawtooth_service_id: config.sawtooth_service_id.clone(),
            max_queued_per_service: config.max_queued_per_service,
            api_token: config.api_token.clone(),
            max_body_bytes: config.max_body_size as usize,
            console: crate::console::ConsoleSettings::new(
                config.fast_expiry,
                config.slow_expiry,
                config.renew_interval * 3,
            ),
            limits: Arc::new(crate::api::limits::Limits::new(
                crate::api::limits::LimitSettings::from_config(config),
            )),
        },
        api_stop.clone(),
    ));
    let metrics_stop = CancellationToken::new();
    let metrics_task = metrics.map(|handle| {
        tokio::spawn(crate::metrics::serve(
            config.metrics_listen,
            handle,
            store.clone(),
            config.renew_interval * 3,
            metrics_stop.clone(),
        ))
    });

    tokio::select! {
        _ = shutdown.cancelled() => {}
        result = &mut api_task => {
            // The API could not start (port taken) or died: stop the instance cleanly.
            let error = match result {
                Ok(Err(error)) => error,
                Ok(Ok(())) => anyhow::anyhow!("the API server stopped"),
                Err(error) => anyhow::anyhow!("the API server task failed: {error}"),
            };
            tracing::error!("{error:#}; shutting down");
            api_failure = Some(error);
        }
    }
    // Stop taking batches first: the load balancer sees /readyz fail and the listener
    // closes after in-flight requests finish.
    draining.store(true, Ordering::SeqCst);
    queuer_drain.cancel();
    // Behind a load balancer, keep answering while its health checks see /readyz fail, so
    // it stops sending here before the listener closes (instead of meeting refused
    // connections). Submissions go on meanwhile; only acquiring stopped.
    if api_failure.is_none() && !config.shutdown_delay.is_zero() {
        tracing::info!(
            delay_ms = config.shutdown_delay.as_millis() as u64,
            "draining: /readyz answers 503; serving requests for {} before closing the listener",
            humantime::format_duration(config.shutdown_delay)
        );
        tokio::time::sleep(config.shutdown_delay).await;
    }
    api_stop.cancel();
    if api_failure.is_none()
        && tokio::time::timeout(config.shutdown_timeout, &mut api_task)
            .await
            .is_err()
    {
        tracing::warn!("API requests still open after the drain timeout; closing them");
        api_task.abort();
    }
    tracing::info!("shutting down: draining in-flight submissions");
    submit_stop.cancel();
    let _ = submitter_task.await;
    // The submitter has dropped its sender: the observer records what is left, and its
    // recording loop ends; polling stops now.
    poll_stop.cancel();
    let _ = observer_task.await;
    queuer_stop.cancel();
    let _ = queuer_task.await;
    metrics_stop.cancel();
    if let Some(task) = metrics_task {
        match task.await {
            Ok(Err(error)) => tracing::error!("{error:#}"),
            Err(error) => tracing::error!(%error, "metrics server task failed"),
            Ok(Ok(())) => {}
        }
    }
    tracing::info!("shutdown complete");
    match api_failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn describe_metrics() {
    dltsub_queuer::metrics::describe();
    dltsub_submitter::metrics::describe();
    dltsub_observer::metrics::describe();
    crate::metrics::describe();
}
