//! `dltsub bench queuer`: the cost of one claim tick with many services and instances.
//!
//! Creates `services` services (one queued batch each) in a scratch database, starts
//! `instances` queuers with a pool each, ticks them until the fair share has settled, then
//! measures `ticks` more rounds: the duration of each tick and the database round trips
//! (statements, BEGIN, COMMIT) it made. Prints one line per configuration; the statement
//! count must not grow with the number of services.

use std::time::{Duration, Instant};

use dltsub_store::{NewBatch, Store, StoreOptions};

use crate::{Queuer, QueuerConfig};

/// One measured configuration.
#[derive(Debug, Clone)]
pub struct QueuerBenchRow {
    pub services: usize,
    pub instances: usize,
    pub ticks: usize,
    pub median_tick: Duration,
    pub p95_tick: Duration,
    pub round_trips_per_tick: f64,
}

/// Runs the benchmark on the database of `options` (which must be migrated and empty:
/// the caller gives it a scratch schema or file).
pub async fn run_queuer_bench(
    options: &StoreOptions,
    services: usize,
    instances: usize,
    ticks: usize,
) -> Result<QueuerBenchRow, BenchError> {
    let setup = Store::connect(options).await?;
    let started = Instant::now();
    let mut writers = Vec::new();
    let writer_count = 8.min(services.max(1));
    for writer in 0..writer_count {
        let store = setup.clone();
        writers.push(tokio::spawn(async move {
            let mut n = writer;
            while n < services {
                let batch = NewBatch {
                    batch_id: format!("{n:0128x}"),
                    serialized_batch: n.to_le_bytes().to_vec(),
                };
                store.enqueue(&format!("bench-{n:06}"), &[batch]).await?;
                n += writer_count;
            }
            Ok::<_, dltsub_store::StoreError>(())
        }));
    }
    for writer in writers {
        writer
            .await
            .map_err(|error| BenchError::Setup(error.to_string()))??;
    }
    eprintln!("  created {services} services in {:.1?}", started.elapsed());

    let config = QueuerConfig::from_timings(
        Duration::from_secs(10),
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    let mut queuers = Vec::new();
    for n in 0..instances {
        let store = Store::connect(options).await?;
        let me = dltsub_store::InstanceInfo {
            instance_id: format!("bench:{n}:00000000"),
            hostname: "bench".into(),
            pid: n as i64,
            version: env!("CARGO_PKG_VERSION").into(),
            capacity: 1,
            session_tag: None,
            labels: Vec::new(),
        };
        queuers.push((store.clone(), Queuer::new(store, me, config.clone())));
    }
    // Register everyone, then let the shares settle.
    for _ in 0..4 {
        for (_, queuer) in &mut queuers {
            queuer.tick().await?;
        }
    }
    let mut durations = Vec::new();
    let mut round_trips = 0;
    for _ in 0..ticks {
        for (store, queuer) in &mut queuers {
            let before = store.round_trips();
            let started = Instant::now();
            queuer.tick().await?;
            durations.push(started.elapsed());
            round_trips += store.round_trips() - before;
        }
    }
    durations.sort();
    let held: usize = queuers.iter().map(|(_, q)| q.current().len()).sum();
    if held != services {
        return Err(BenchError::Setup(format!(
            "after settling the instances hold {held} of {services} services"
        )));
    }
    Ok(QueuerBenchRow {
        services,
        instances,
        ticks: durations.len(),
        median_tick: durations[durations.len() / 2],
        p95_tick: durations[durations.len() * 95 / 100],
        round_trips_per_tick: round_trips as f64 / durations.len() as f64,
    })
}

/// Why a benchmark run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Store(#[from] dltsub_store::StoreError),
    #[error("benchmark setup failed: {0}")]
    Setup(String),
}
