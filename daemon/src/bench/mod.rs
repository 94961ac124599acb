//! `dltsub bench …`: benchmark commands that print figures. Performance targets live
//! here, never in timed tests.
//!
//! - `all` (`all.rs`): every figure of BENCHMARKS.md in one run — drain, ingest, latency,
//!   failover, claim scale, memory, and the peer job queues on the same database — as one
//!   table. Real `dltsub run` processes (`instances.rs`) against the simulated ledger in this
//!   process, with the load of `workload.rs`; the measurements are in `scenarios.rs`, the
//!   peers and pgbench in `peers.rs`, the table in `report.rs`.
//! - `queuer`: the cost of one claim tick.
//! - `devnet`: the simulated ledger's own speed.

mod all;
mod instances;
mod peers;
mod report;
mod scenarios;
mod workload;

pub use all::AllArgs;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use dltsub_store::testing::{TestBackend, TestDatabase};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Every figure of BENCHMARKS.md in one run, printed as one table: drain throughput
    /// (1, 2, 4 instances; PostgreSQL and SQLite), ingest, latency, failover, claim scale,
    /// memory, and PgQueuer, graphile-worker and pgbench on the same PostgreSQL. Uses
    /// scratch schemas of the test database (`DLTSUB_TEST_DATABASE_URL`, default
    /// postgres://dltsub:dltsub@127.0.0.1:5432/dltsub_test) and temporary SQLite files.
    All(Box<AllArgs>),
    /// The cost of one claim tick: duration and database statements, for several numbers
    /// of services. Runs in a scratch schema of the test database (`scripts/setup-postgres`
    /// creates it; `DLTSUB_TEST_DATABASE_URL` overrides) or a scratch SQLite file.
    Queuer(QueuerBenchArgs),
    /// How many batches per second the simulated ledger accepts and commits on loopback
    /// (it must be far above what dltsub needs, so it is never a benchmark's bottleneck).
    Devnet(dltsub_devnet::DevnetBenchArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Postgres,
    Sqlite,
}

#[derive(Debug, Args)]
pub struct QueuerBenchArgs {
    #[arg(long, value_enum, default_value = "postgres")]
    backend: Backend,
    /// Numbers of services to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    services: Vec<usize>,
    /// Instances ticking against the same database.
    #[arg(long, default_value_t = 4)]
    instances: usize,
    /// Measured rounds (every instance ticks once per round).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::All(args) => all::run(*args).await,
        BenchCommand::Queuer(args) => queuer(args).await,
        BenchCommand::Devnet(args) => {
            let report = dltsub_devnet::run_bench(&args).await?;
            println!("{report}");
            Ok(())
        }
    }
}

async fn queuer(args: QueuerBenchArgs) -> anyhow::Result<()> {
    let backend = match args.backend {
        Backend::Postgres => TestBackend::Postgres,
        Backend::Sqlite => TestBackend::Sqlite,
    };
    println!(
        "queuer tick on {:?}, {} instances, {} measured rounds",
        args.backend, args.instances, args.rounds
    );
    println!(
        "{:>9} {:>7} {:>12} {:>12} {:>16}",
        "services", "ticks", "median tick", "p95 tick", "statements/tick"
    );
    for services in &args.services {
        let database = TestDatabase::migrated(backend).await;
        let row = dltsub_queuer::bench::run_queuer_bench(
            &database.options,
            *services,
            args.instances,
            args.rounds,
        )
        .await
        .with_context(|| format!("benchmark with {services} services"))?;
        println!(
            "{:>9} {:>7} {:>12} {:>12} {:>16.1}",
            row.services,
            row.ticks,
            format!("{:.2?}", row.median_tick),
            format!("{:.2?}", row.p95_tick),
            row.round_trips_per_tick
        );
    }
    Ok(())
}
