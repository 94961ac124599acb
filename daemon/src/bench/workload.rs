//! What the benchmarks submit: batches with unique ids, loaded straight into the
//! database (the drain's backlog) or POSTed as protobuf BatchLists to instances' scabbard
//! routes by concurrent clients, closed-loop (as fast as answered) or paced.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use dltsub_store::{NewBatch, Store};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use tokio_util::sync::CancellationToken;

/// The scabbard circuit of every benchmark service: service `n` is `bench::sNNNNN`.
pub const CIRCUIT: &str = "bench";

pub fn service_id(n: u64) -> String {
    format!("{CIRCUIT}::s{n:05}")
}

/// Batch `n` of benchmark run `run`: a 128-hex id unique across runs, one transaction.
pub fn batch(run: u64, n: u64) -> Batch {
    Batch {
        header: b"bench".to_vec(),
        header_signature: format!("{run:016x}{n:0112x}"),
        transactions: vec![Transaction {
            header: b"bench".to_vec(),
            header_signature: format!("{n:0112x}{run:016x}"),
            payload: b"bench".to_vec(),
        }],
        trace: false,
    }
}

/// A fresh run number, so that ids never repeat between runs against one ledger.
pub fn run_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Stores `batches` batches spread round-robin over `services` services, as if clients had
/// submitted them (the drain's backlog), and sets each service's `max_in_flight`.
pub async fn preload(
    store: &Store,
    run: u64,
    batches: u64,
    services: u64,
    max_in_flight: i32,
) -> anyhow::Result<()> {
    const PER_REQUEST: u64 = 500;
    const WRITERS: u64 = 4;
    let mut writers = Vec::new();
    for writer in 0..WRITERS.min(services) {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            let mut service = writer;
            while service < services {
                let ids: Vec<u64> = (service..batches).step_by(services as usize).collect();
                for chunk in ids.chunks(PER_REQUEST as usize) {
                    let new: Vec<NewBatch> = chunk
                        .iter()
                        .map(|&n| {
                            let batch = batch(run, n);
                            NewBatch {
                                batch_id: batch.header_signature.clone(),
                                serialized_batch: BatchList {
                                    batches: vec![batch],
                                }
                                .encode_to_vec(),
                            }
                        })
                        .collect();
                    store.enqueue(&service_id(service), &new).await?;
                }
                if max_in_flight != 1 {
                    store
                        .set_service_max_in_flight(&service_id(service), max_in_flight)
                        .await?;
                }
                service += WRITERS;
            }
            Ok::<_, dltsub_store::StoreError>(())
        }));
    }
    for writer in writers {
        writer.await.context("a preload writer panicked")??;
    }
    Ok(())
}

/// How a load generator submits.
#[derive(Debug, Clone)]
pub struct Load {
    /// Base URLs of the instances; lists go to them in turn.
    pub urls: Vec<String>,
    pub services: u64,
    pub batches_per_list: u64,
    pub clients: usize,
    /// Batches per second offered (paced), or `None` for as fast as answered.
    pub rate: Option<f64>,
    /// Stop after this many batches (at most).
    pub max_batches: Option<u64>,
    pub run: u64,
}

/// What a load generator did.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub accepted: u64,
    pub lists: u64,
    pub errors: u64,
    pub seconds: f64,
}

impl LoadReport {
    pub fn per_sec(&self) -> f64 {
        self.accepted as f64 / self.seconds.max(1e-9)
    }
}

/// Runs `load` until `stop` is cancelled or `max_batches` were offered.
pub async fn generate(load: Load, stop: CancellationToken) -> anyhow::Result<LoadReport> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(load.clients)
        .timeout(Duration::from_secs(30))
        .build()?;
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let lists = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let load = Arc::new(load);
    let mut clients = Vec::new();
    for _ in 0..load.clients {
        let (http, next, accepted, lists, errors, load, stop) = (
            http.clone(),
            next.clone(),
            accepted.clone(),
            lists.clone(),
            errors.clone(),
            load.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            loop {
                let list = next.fetch_add(1, Ordering::Relaxed);
                let first = list * load.batches_per_list;
                if stop.is_cancelled() || load.max_batches.is_some_and(|max| first >= max) {
                    return;
                }
                if let Some(rate) = load.rate {
                    let due = started + Duration::from_secs_f64(first as f64 / rate);
                    tokio::select! {
                        _ = tokio::time::sleep_until(due.into()) => {}
                        _ = stop.cancelled() => return,
                    }
                }
                let service = list % load.services;
                let body = BatchList {
                    batches: (first..first + load.batches_per_list)
                        .map(|n| batch(load.run, n))
                        .collect(),
                }
                .encode_to_vec();
                let url = &load.urls[list as usize % load.urls.len()];
                let answer = http
                    .post(format!("{url}/scabbard/{CIRCUIT}/s{service:05}/batches"))
                    .header("Content-Type", "application/octet-stream")
                    .body(body)
                    .send()
                    .await;
                match answer {
                    Ok(response) if response.status().as_u16() == 202 => {
                        let _ = response.bytes().await;
                        accepted.fetch_add(load.batches_per_list, Ordering::Relaxed);
                        lists.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for client in clients {
        client.await.context("a load client panicked")?;
    }
    Ok(LoadReport {
        accepted: accepted.load(Ordering::Relaxed),
        lists: lists.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    })
}
