//! `dltsub bench all`: every figure of BENCHMARKS.md in one run, on one machine and one
//! database, printed as one table. See the README's Benchmarks section.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use dltsub_store::testing::{TestBackend, TestDatabase};

use super::Backend;
use super::peers;
use super::report::{Report, mib, millis};
use super::scenarios::{self, DrainCase, Expiries, Fault, IngestCase, LatencyCase, backend_name};

/// Claim timings of the failover measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExpiryChoice {
    /// fast 1 s, slow 3 s, tick 300 ms.
    Short,
    /// The configuration defaults: fast 10 s, slow 60 s, tick 2 s.
    Default,
}

/// The parts of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Section {
    Drain,
    Ingest,
    Latency,
    Failover,
    Claims,
    Peers,
    Pgbench,
}

#[derive(Debug, Clone, Args)]
pub struct AllArgs {
    /// Measure only these parts, comma-separated (default: all). The table still has a
    /// row for every part; the others say `skipped`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Drain: batches already accepted when the instances start.
    #[arg(long, default_value_t = 100_000)]
    pub batches: u64,
    /// Drain: services the batches are spread over.
    #[arg(long, default_value_t = 1_000)]
    pub services: u64,
    /// Drain: numbers of instances to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub instances: Vec<usize>,
    /// Backends of the drain, ingest and latency measurements.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "postgres,sqlite"
    )]
    pub backends: Vec<Backend>,
    /// Drain: `max_in_flight` of every service, comma-separated (one set of rows each).
    /// 1, the service default, submits a service's batches one at a time; k lets up to k
    /// be in flight, several in one BatchList.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub max_in_flight: Vec<i32>,
    /// Drain: give up after this long.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Ingest: concurrent HTTP clients.
    #[arg(long, default_value_t = 32)]
    pub ingest_clients: usize,
    /// Ingest: batches per POSTed BatchList, comma-separated (one row each).
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    pub ingest_batches_per_list: Vec<u64>,
    /// Ingest: how long the clients submit.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub ingest_duration: Duration,
    /// Latency: batches per second offered (one per POST).
    #[arg(long, default_value_t = 50.0)]
    pub latency_rate: f64,
    /// Latency: how long the rate is offered.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub latency_duration: Duration,
    /// Latency: services the batches are spread over.
    #[arg(long, default_value_t = 100)]
    pub latency_services: u64,
    /// Latency: the ledger's commit latencies to measure with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0ms,50ms", value_parser = humantime::parse_duration)]
    pub latency_commit: Vec<Duration>,
    /// Failover: claim timings to measure with, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "short,default"
    )]
    pub failover: Vec<ExpiryChoice>,
    /// Claim scale: services.
    #[arg(long, default_value_t = 10_000)]
    pub claim_services: usize,
    /// Claim scale: instances ticking against the same database.
    #[arg(long, default_value_t = 4)]
    pub claim_instances: usize,
    /// Claim scale: measured rounds (every instance ticks once per round).
    #[arg(long, default_value_t = 10)]
    pub claim_rounds: usize,
    /// Skip the peer job queues (PgQueuer, graphile-worker), which are installed from PyPI
    /// and npm on each run. Their rows then say so.
    #[arg(long)]
    pub no_peers: bool,
    /// Install the peers into DIR, or reuse the installation there (default: a new
    /// temporary directory, removed afterwards).
    #[arg(long)]
    pub peers_dir: Option<PathBuf>,
    /// Peers: jobs each peer drains (default: the drain's --batches).
    #[arg(long)]
    pub peer_jobs: Option<u64>,
    /// pgbench: how long each of its two runs lasts.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub pgbench_duration: Duration,
    /// Also write the rows as tab-separated values to FILE (for scripts/bench-plot).
    #[arg(long)]
    pub tsv: Option<PathBuf>,
    /// Keep the directory with the instances' logs and print its path.
    #[arg(long)]
    pub keep: bool,
}

fn test_backend(backend: Backend) -> TestBackend {
    match backend {
        Backend::Postgres => TestBackend::Postgres,
        Backend::Sqlite => TestBackend::Sqlite,
    }
}

pub async fn run(args: AllArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.batches > 0 && args.services > 0,
        "--batches and --services must be positive"
    );
    anyhow::ensure!(
        args.services <= args.batches,
        "--services must not exceed --batches"
    );
    anyhow::ensure!(
        args.instances.iter().all(|&n| n > 0),
        "--instances must be positive"
    );
    anyhow::ensure!(args.latency_rate > 0.0, "--latency-rate must be positive");
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("dltsub-bench-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let machine = machine().await;
    eprintln!("{machine}");
    let mut report = Report::default();
    let outcome = measure(&args, dir.path(), &mut report).await;

    println!("dltsub bench all");
    println!("{machine}");
    println!(
        "command: dltsub bench all {}",
        std::env::args().skip(3).collect::<Vec<_>>().join(" ")
    );
    println!();
    print!("{}", report.render());
    println!("\ntotal time {}", millis(started.elapsed().as_secs_f64()));
    if let Some(path) = &args.tsv {
        std::fs::write(path, report.tsv())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.keep || outcome.is_err() {
        let kept = dir.keep();
        eprintln!("instance logs kept in {}", kept.display());
    }
    outcome
}

fn skipped(report: &mut Report, section: &'static str, case: &str) {
    report.add(
        section,
        case.to_string(),
        "skipped (--only)".into(),
        String::new(),
        f64::NAN,
    );
}

async fn measure(args: &AllArgs, dir: &std::path::Path, report: &mut Report) -> anyhow::Result<()> {
    let wanted = |section: Section| args.only.is_empty() || args.only.contains(&section);
    // 1 and 6: drain throughput and the peak memory of one instance.
    // The PostgreSQL 1-instance drain rate per max_in_flight, for the ratios to the peers.
    let mut one_instance_pg: Vec<(i32, f64)> = Vec::new();
    if !wanted(Section::Drain) {
        skipped(report, "drain", "dltsub drain");
        skipped(report, "memory", "peak RSS of one instance");
    }
    for &backend in args.backends.iter().filter(|_| wanted(Section::Drain)) {
        let mut smallest: Option<(usize, u64)> = None;
        for (&max_in_flight, &instances) in args
            .max_in_flight
            .iter()
            .flat_map(|k| args.instances.iter().map(move |n| (k, n)))
        {
            eprintln!("drain: {backend:?}, {instances} instance(s), max_in_flight {max_in_flight}");
            let outcome = scenarios::drain(
                &DrainCase {
                    backend: test_backend(backend),
                    instances,
                    batches: args.batches,
                    services: args.services,
                    max_in_flight,
                    timeout: args.drain_timeout,
                },
                dir,
                report,
            )
            .await
            .with_context(|| format!("drain on {backend:?} with {instances} instance(s)"))?;
            if instances == 1 && backend == Backend::Postgres {
                one_instance_pg.push((max_in_flight, outcome.per_sec));
            }
            if max_in_flight == 1 && smallest.is_none_or(|(n, _)| instances < n) {
                smallest = Some((instances, outcome.peak_rss));
            }
        }
        if let Some((instances, rss)) = smallest {
            report.add(
                "memory",
                format!(
                    "{}, peak RSS of one instance",
                    backend_name(test_backend(backend))
                ),
                mib(rss),
                format!(
                    "VmHWM during the drain with {instances} instance(s) (the largest of them)"
                ),
                rss as f64 / (1024.0 * 1024.0),
            );
        }
    }

    // 2: ingest.
    if !wanted(Section::Ingest) {
        skipped(report, "ingest", "dltsub ingest");
    }
    for &backend in args.backends.iter().filter(|_| wanted(Section::Ingest)) {
        for &per_list in &args.ingest_batches_per_list {
            eprintln!("ingest: {backend:?}, {per_list} batch(es) per list");
            scenarios::ingest(
                &IngestCase {
                    backend: test_backend(backend),
                    clients: args.ingest_clients,
                    batches_per_list: per_list,
                    services: args.services,
                    duration: args.ingest_duration,
                },
                dir,
                report,
            )
            .await
            .with_context(|| format!("ingest on {backend:?}"))?;
        }
    }

    // 3: latency.
    if !wanted(Section::Latency) {
        skipped(report, "latency", "dltsub latency");
    }
    for &backend in args.backends.iter().filter(|_| wanted(Section::Latency)) {
        for &commit_latency in &args.latency_commit {
            eprintln!("latency: {backend:?}, ledger commit latency {commit_latency:?}");
            scenarios::latency(
                &LatencyCase {
                    backend: test_backend(backend),
                    rate: args.latency_rate,
                    duration: args.latency_duration,
                    services: args.latency_services,
                    commit_latency,
                },
                dir,
                report,
            )
            .await
            .with_context(|| format!("latency on {backend:?}"))?;
        }
    }

    // 4: failover, on PostgreSQL (the production backend).
    if !wanted(Section::Failover) {
        skipped(report, "failover", "dltsub failover");
    }
    for choice in args.failover.iter().filter(|_| wanted(Section::Failover)) {
        let expiries = match choice {
            ExpiryChoice::Short => Expiries::short(),
            ExpiryChoice::Default => Expiries::default_config(),
        };
        for fault in [Fault::Kill, Fault::Stop] {
            eprintln!("failover: {} expiries, {fault:?}", expiries.name);
            scenarios::failover(TestBackend::Postgres, &expiries, fault, dir, report)
                .await
                .with_context(|| format!("failover ({} expiries, {fault:?})", expiries.name))?;
        }
    }

    // 5: claim scale.
    if !wanted(Section::Claims) {
        skipped(report, "claims", "dltsub claim tick");
    }
    for &backend in args.backends.iter().filter(|_| wanted(Section::Claims)) {
        eprintln!("claim scale: {backend:?}");
        scenarios::claim_scale(
            test_backend(backend),
            args.claim_services,
            args.claim_instances,
            args.claim_rounds,
            report,
        )
        .await?;
    }

    // 7: peers on the same PostgreSQL, and pgbench.
    let jobs = args.peer_jobs.unwrap_or(args.batches);
    let mut rates = Vec::new();
    if !wanted(Section::Peers) {
        skipped(report, "peers", "pgqueuer, graphile-worker");
    } else if args.no_peers {
        for peer in ["pgqueuer", "graphile-worker"] {
            report.add(
                "peers",
                format!("{peer}, drain of no-op jobs"),
                "skipped (--no-peers)".into(),
                String::new(),
                f64::NAN,
            );
        }
    } else {
        let temporary;
        let peers_dir = match &args.peers_dir {
            Some(dir) => dir.clone(),
            None => {
                temporary = tempfile::Builder::new()
                    .prefix("dltsub-bench-peers-")
                    .tempdir()?;
                temporary.path().to_path_buf()
            }
        };
        match peers::install(&peers_dir).await {
            Ok(installed) => {
                eprintln!("peers: draining {jobs} no-op jobs each");
                let default = one_instance_pg
                    .iter()
                    .find(|(k, _)| *k == 1)
                    .map(|(_, rate)| *rate);
                rates = peers::drains(&installed, jobs, default, report).await;
            }
            Err(error) => {
                for peer in ["pgqueuer", "graphile-worker"] {
                    report.unavailable(
                        "peers",
                        format!("{peer}, drain of no-op jobs"),
                        format!("{error:#}"),
                    );
                }
            }
        }
    }
    if wanted(Section::Pgbench) {
        eprintln!("pgbench");
        peers::pgbench(args.pgbench_duration, report).await;
    } else {
        skipped(report, "peers", "pgbench");
    }

    // The goals of issue #8, stated against this run's own figures.
    summary(args, &one_instance_pg, &rates, report);
    Ok(())
}

fn summary(args: &AllArgs, dltsub: &[(i32, f64)], rates: &[(String, f64)], report: &mut Report) {
    let fastest = rates.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    match fastest {
        Some((peer, rate)) if !dltsub.is_empty() => {
            for (k, dltsub) in dltsub {
                for (peer, rate) in rates {
                    report.add(
                        "summary",
                        format!("dltsub (postgres, 1 instance, max_in_flight {k}) / {peer}"),
                        super::report::ratio(dltsub / rate),
                        "drain rates on the same database, same run".into(),
                        dltsub / rate,
                    );
                }
                report.add(
                    "summary",
                    format!("goal: drain >= fastest peer (max_in_flight {k})"),
                    if dltsub >= rate {
                        "met".into()
                    } else {
                        "not met".into()
                    },
                    format!("dltsub {dltsub:.0}/s vs {peer} {rate:.0}/s on the same database"),
                    dltsub / rate,
                );
            }
        }
        _ => report.add(
            "summary",
            "goal: drain >= fastest peer".into(),
            "not measured".into(),
            if dltsub.is_empty() {
                "no PostgreSQL 1-instance drain in this run".into()
            } else {
                "no peer ran".into()
            },
            f64::NAN,
        ),
    }
    let kill = report
        .rows
        .iter()
        .filter(|row| {
            row.section == "failover" && row.case.contains("SIGKILL") && row.case.contains("short")
        })
        .map(|row| row.value)
        .next();
    let goal = Expiries::short().fast + Expiries::short().tick;
    match kill {
        Some(seconds) if seconds.is_finite() => report.add(
            "summary",
            "goal: SIGKILL failover <= fast + tick (short)".into(),
            if seconds <= goal.as_secs_f64() {
                "met".into()
            } else {
                "not met".into()
            },
            format!("{} vs {}", millis(seconds), millis(goal.as_secs_f64())),
            seconds,
        ),
        _ if !args.failover.contains(&ExpiryChoice::Short) => {}
        _ => report.add(
            "summary",
            "goal: SIGKILL failover <= fast + tick (short)".into(),
            "not measured".into(),
            String::new(),
            f64::NAN,
        ),
    }
}

/// One line on the machine, for the table's header.
async fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                line.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, v)| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let kib: u64 = line
                    .strip_prefix("MemTotal:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()?;
                Some(format!("{:.0} GiB", kib as f64 / (1024.0 * 1024.0)))
            })
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let database = TestDatabase::empty(TestBackend::Postgres).await;
    let postgres = match dltsub_store::Store::connect(&database.options).await {
        Ok(store) => {
            let version = store
                .scalar_i64_for_tests("current_setting('server_version_num')::bigint")
                .await;
            let fsync = store
                .scalar_i64_for_tests("(current_setting('fsync') = 'on')::int::bigint")
                .await;
            format!(
                "PostgreSQL {}.{} (fsync {})",
                version / 10_000,
                version % 10_000,
                if fsync == 1 { "on" } else { "OFF" }
            )
        }
        Err(error) => format!("PostgreSQL unreachable: {error}"),
    };
    format!(
        "machine: {cpu}, {cores} cores, {memory}, Linux {}; {postgres}, SQLite bundled; dltsub {} ({} build)",
        kernel.trim(),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    )
}
