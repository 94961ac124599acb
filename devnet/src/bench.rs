//! `dltsub bench devnet`: how fast devnet accepts and commits on loopback, so that it is
//! known never to be the bottleneck of a dltsub benchmark.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use serde::Serialize;
use tokio::time::Instant;

use crate::config::{DevnetConfig, Dialect, Faults, Latency};
use crate::server::Devnet;

/// `dltsub bench devnet`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevnetBenchArgs {
    /// Ledger API to drive.
    #[arg(long, value_enum, default_value_t = Dialect::Scabbard)]
    pub dialect: Dialect,
    /// Concurrent HTTP clients (one connection each).
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// How long the clients submit.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Batches per POSTed BatchList.
    #[arg(long, default_value_t = 10)]
    pub batches_per_list: usize,
    /// Scabbard services the clients spread over (Sawtooth has one ledger).
    #[arg(long, default_value_t = 16)]
    pub services: usize,
    /// Commit latency of the devnet under test.
    #[arg(long, default_value = "0s")]
    pub commit_latency: Latency,
}

impl Default for DevnetBenchArgs {
    fn default() -> Self {
        Self {
            dialect: Dialect::Scabbard,
            clients: 32,
            duration: Duration::from_secs(5),
            batches_per_list: 10,
            services: 16,
            commit_latency: Latency::ZERO,
        }
    }
}

/// What a benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub dialect: Dialect,
    pub clients: usize,
    pub batches_per_list: usize,
    pub services: usize,
    /// Length of the submission window.
    pub seconds: f64,
    /// POSTs answered 202.
    pub posts: u64,
    /// POSTs answered anything else, or failed.
    pub errors: u64,
    /// Batches answered 202 within the window.
    pub accepted: u64,
    /// Batches committed within the window.
    pub committed: u64,
    pub accepted_per_sec: f64,
    pub committed_per_sec: f64,
    /// Batches committed in the end (all accepted ones, unless the drain timed out).
    pub committed_total: u64,
    /// Time after the window until every accepted batch was committed.
    pub drain_seconds: f64,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "devnet bench: {} dialect, {} clients, {} batches per list, {} service(s), {:.1} s",
            self.dialect, self.clients, self.batches_per_list, self.services, self.seconds
        )?;
        writeln!(
            f,
            "  accepted  {:>10} batches  {:>10.0} batches/s  ({} POSTs, {} errors)",
            self.accepted, self.accepted_per_sec, self.posts, self.errors
        )?;
        write!(
            f,
            "  committed {:>10} batches  {:>10.0} batches/s  (all {} committed {:.3} s after the window)",
            self.committed, self.committed_per_sec, self.committed_total, self.drain_seconds
        )
    }
}

/// Starts a devnet on loopback (back-pressure off, so the bench measures devnet's own speed),
/// drives it with `clients` concurrent HTTP clients for `duration`, then waits (at most 30 s)
/// for every accepted batch to commit.
pub async fn run_bench(args: &DevnetBenchArgs) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        args.batches_per_list > 0,
        "--batches-per-list must be at least 1"
    );
    anyhow::ensure!(args.services > 0, "--services must be at least 1");
    let services = match args.dialect {
        Dialect::Scabbard => args.services,
        Dialect::Sawtooth => 1,
    };
    let mut config = DevnetConfig::new(args.dialect);
    config.faults = Faults {
        commit_latency: args.commit_latency,
        ..Faults::default()
    };
    config.backpressure_high = usize::MAX;
    config.backpressure_low = usize::MAX;
    config.ledger_limit = 10_000;
    config.post_log_limit = 1_000;
    let devnet = Devnet::spawn(config).await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients)
        .timeout(Duration::from_secs(30))
        .build()?;

    let posts = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut clients = Vec::with_capacity(args.clients);
    for number in 0..args.clients {
        let url = match args.dialect {
            Dialect::Scabbard => format!(
                "{}/batches",
                devnet.scabbard_url("bench", &format!("s{:03}", number % services))
            ),
            Dialect::Sawtooth => format!("{}/batches", devnet.base_url()),
        };
        clients.push(tokio::spawn(submit(
            client.clone(),
            url,
            number as u64,
            args.batches_per_list,
            deadline,
            posts.clone(),
            errors.clone(),
        )));
    }
    for client in clients {
        client.await.context("bench client panicked")?;
    }
    let window = start.elapsed();
    let committed = committed_total(&devnet);

    let posts = posts.load(Ordering::Relaxed);
    let accepted = posts * args.batches_per_list as u64;
    let drain_start = Instant::now();
    let drain_limit = drain_start + args.commit_latency.max + Duration::from_secs(30);
    let mut committed_end = committed_total(&devnet);
    // A benchmark's own bookkeeping: read the counters until everything committed.
    while committed_end < accepted && Instant::now() < drain_limit {
        tokio::time::sleep(Duration::from_millis(2)).await;
        committed_end = committed_total(&devnet);
    }
    let drain_seconds = drain_start.elapsed().as_secs_f64();
    devnet.shutdown().await?;

    let seconds = window.as_secs_f64();
    Ok(BenchReport {
        dialect: args.dialect,
        clients: args.clients,
        batches_per_list: args.batches_per_list,
        services,
        seconds,
        posts,
        errors: errors.load(Ordering::Relaxed),
        accepted,
        committed,
        accepted_per_sec: accepted as f64 / seconds,
        committed_per_sec: committed as f64 / seconds,
        committed_total: committed_end,
        drain_seconds,
    })
}

fn committed_total(devnet: &Devnet) -> u64 {
    devnet
        .control()
        .stats()
        .ledgers
        .values()
        .map(|ledger| ledger.committed)
        .sum()
}

/// One client: POSTs fresh BatchLists back to back until `deadline`.
async fn submit(
    client: reqwest::Client,
    url: String,
    client_number: u64,
    batches_per_list: usize,
    deadline: Instant,
    posts: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let mut counter = 0u64;
    while Instant::now() < deadline {
        let list = BatchList {
            batches: (0..batches_per_list)
                .map(|_| {
                    counter += 1;
                    bench_batch(client_number, counter)
                })
                .collect(),
        };
        let sent = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, dltsub_wire::OCTET_STREAM)
            .body(list.encode_to_vec())
            .send()
            .await;
        match sent {
            Ok(response) if response.status() == reqwest::StatusCode::ACCEPTED => {
                // Read the body so the connection goes back to the pool.
                let _ = response.bytes().await;
                posts.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A batch with a unique id (client number and counter, in hex) and one transaction.
fn bench_batch(client_number: u64, counter: u64) -> Batch {
    Batch {
        header: b"bench".to_vec(),
        header_signature: format!("{client_number:064x}{counter:064x}"),
        transactions: vec![Transaction {
            header: b"bench".to_vec(),
            header_signature: format!("{counter:064x}{client_number:064x}"),
            payload: b"bench".to_vec(),
        }],
        trace: false,
    }
}
