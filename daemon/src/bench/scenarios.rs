//! The measurements of `dltsub bench all` that run dltsub itself: drain, ingest, latency,
//! failover and claim scale. Each runs in a database of its own (a scratch PostgreSQL
//! schema or SQLite file, dropped afterwards) against a simulated ledger in this process,
//! with real `dltsub run` processes (the claim scale runs the queuers in process).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use dltsub_devnet::{Devnet, DevnetConfig, Dialect, Faults, Latency};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{BatchStatus, Store};
use tokio_util::sync::CancellationToken;

use super::instances::{Instance, InstanceSpec, stop_all};
use super::report::{Report, mib, millis, thousands};
use super::workload::{self, Load};

pub fn backend_name(backend: TestBackend) -> &'static str {
    match backend {
        TestBackend::Postgres => "postgres",
        TestBackend::Sqlite => "sqlite",
    }
}

/// A simulated scabbard ledger in this process: commit latency as given, the real
/// node's back-pressure and history, logs sized for a benchmark.
async fn ledger(commit_latency: Duration, post_log: usize) -> anyhow::Result<Devnet> {
    let mut config = DevnetConfig::new(Dialect::Scabbard);
    config.faults = Faults {
        commit_latency: Latency::fixed(commit_latency),
        ..Faults::default()
    };
    config.ledger_limit = 1_000;
    config.post_log_limit = post_log;
    Devnet::spawn(config).await
}

async fn unfinished(store: &Store) -> anyhow::Result<i64> {
    Ok(store
        .count_unfinished_by_status()
        .await?
        .iter()
        .filter(|(status, _)| !status.is_terminal())
        .map(|(_, count)| count)
        .sum())
}

/// Waits until no batch is unfinished; `Err` after `timeout`.
async fn wait_drained(store: &Store, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = unfinished(store).await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} batches still unfinished after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn committed_on_ledger(devnet: &Devnet) -> (u64, u64) {
    let stats = devnet.control().stats();
    (
        stats.ledgers.values().map(|l| l.committed).sum(),
        stats.ledgers.values().map(|l| l.duplicates).sum(),
    )
}

/// Options of the drain.
#[derive(Debug, Clone)]
pub struct DrainCase {
    pub backend: TestBackend,
    pub instances: usize,
    pub batches: u64,
    pub services: u64,
    pub max_in_flight: i32,
    pub timeout: Duration,
}

/// What one drain measured.
#[derive(Debug, Clone)]
pub struct DrainOutcome {
    pub per_sec: f64,
    pub peak_rss: u64,
}

/// `batches` batches already accepted over `services` services; `instances` instances
/// started at once; the time from their start until every batch is COMMITTED.
pub async fn drain(
    case: &DrainCase,
    dir: &Path,
    report: &mut Report,
) -> anyhow::Result<DrainOutcome> {
    let database = TestDatabase::migrated(case.backend).await;
    let store = database.store().await;
    let run = workload::run_id();
    let loading = Instant::now();
    workload::preload(&store, run, case.batches, case.services, case.max_in_flight).await?;
    let loaded_in = loading.elapsed();
    let devnet = ledger(Duration::ZERO, 1_000).await?;
    let spec = InstanceSpec::new(&database.options.url, devnet.base_url());

    let started = Instant::now();
    let mut instances = Vec::new();
    for n in 0..case.instances {
        instances.push(Instance::spawn(
            &spec,
            dir,
            &format!("drain-{}-{n}", backend_name(case.backend)),
        )?);
    }
    for instance in &mut instances {
        instance.wait_ready().await?;
    }
    let drained = wait_drained(&store, case.timeout).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut round_trips = 0;
    let mut peak_rss = 0;
    let mut cpu = 0.0;
    for instance in &instances {
        round_trips += instance.round_trips().await?;
        peak_rss = peak_rss.max(instance.peak_rss()?);
        cpu += instance.cpu_seconds()?;
    }
    stop_all(instances).await;
    drained?;
    let (on_ledger, duplicates) = committed_on_ledger(&devnet);
    let posts = devnet.control().posts().total;
    devnet.shutdown().await?;
    if on_ledger != case.batches {
        bail!(
            "the ledger committed {on_ledger} of {} batches",
            case.batches
        );
    }
    let per_sec = case.batches as f64 / seconds;
    report.add(
        "drain",
        format!(
            "{}, {} instance{}{}",
            backend_name(case.backend),
            case.instances,
            if case.instances == 1 { "" } else { "s" },
            if case.max_in_flight == 1 {
                String::new()
            } else {
                format!(", max_in_flight {}", case.max_in_flight)
            }
        ),
        format!("{} batches/s", thousands(per_sec)),
        format!(
            "{} batches over {} services in {}; {:.2} SQL statements/batch; {:.2} batches/POST; \
             instance CPU {:.0}% of one core; peak RSS {}; ledger {} committed, {} duplicates; \
             backlog loaded in {}",
            thousands(case.batches as f64),
            thousands(case.services as f64),
            millis(seconds),
            round_trips as f64 / case.batches as f64,
            case.batches as f64 / posts.max(1) as f64,
            cpu / seconds * 100.0,
            mib(peak_rss),
            thousands(on_ledger as f64),
            duplicates,
            millis(loaded_in.as_secs_f64()),
        ),
        per_sec,
    );
    Ok(DrainOutcome { per_sec, peak_rss })
}

/// Options of the ingest.
#[derive(Debug, Clone)]
pub struct IngestCase {
    pub backend: TestBackend,
    pub clients: usize,
    pub batches_per_list: u64,
    pub services: u64,
    pub duration: Duration,
}

/// One instance; `clients` concurrent clients POST BatchLists of `batches_per_list` to it
/// for `duration`, as fast as it answers (it submits them to the ledger meanwhile).
pub async fn ingest(case: &IngestCase, dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let database = TestDatabase::migrated(case.backend).await;
    let devnet = ledger(Duration::ZERO, 1_000).await?;
    let spec = InstanceSpec::new(&database.options.url, devnet.base_url())
        .flag("max_queued_per_service", "0");
    let instance = Instance::start(
        &spec,
        dir,
        &format!("ingest-{}", backend_name(case.backend)),
    )
    .await?;
    let stop = CancellationToken::new();
    let load = tokio::spawn(workload::generate(
        Load {
            urls: vec![instance.url.clone()],
            services: case.services,
            batches_per_list: case.batches_per_list,
            clients: case.clients,
            rate: None,
            max_batches: None,
            run: workload::run_id(),
        },
        stop.clone(),
    ));
    tokio::time::sleep(case.duration).await;
    stop.cancel();
    let outcome = load.await.context("the load generator panicked")??;
    instance.stop().await;
    devnet.shutdown().await?;
    let store = database.store().await;
    let stored = store.count_rows_for_tests("batches").await;
    if stored as u64 != outcome.accepted {
        bail!("{} batches answered 202, {stored} stored", outcome.accepted);
    }
    report.add(
        "ingest",
        format!(
            "{}, {} clients, {} batch{}/list",
            backend_name(case.backend),
            case.clients,
            case.batches_per_list,
            if case.batches_per_list == 1 { "" } else { "es" }
        ),
        format!("{} batches/s", thousands(outcome.per_sec())),
        format!(
            "{} batches in {} POSTs over {}, {} errors; {} services",
            thousands(outcome.accepted as f64),
            thousands(outcome.lists as f64),
            millis(outcome.seconds),
            outcome.errors,
            case.services
        ),
        outcome.per_sec(),
    );
    Ok(())
}

/// Options of the latency measurement.
#[derive(Debug, Clone)]
pub struct LatencyCase {
    pub backend: TestBackend,
    pub rate: f64,
    pub duration: Duration,
    pub services: u64,
    pub commit_latency: Duration,
}

/// One instance; batches offered one per POST at a fixed rate; the time from acceptance to
/// COMMITTED of each, on the database clock.
pub async fn latency(case: &LatencyCase, dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let database = TestDatabase::migrated(case.backend).await;
    let devnet = ledger(case.commit_latency, 1_000).await?;
    let spec = InstanceSpec::new(&database.options.url, devnet.base_url());
    let instance = Instance::start(
        &spec,
        dir,
        &format!("latency-{}", backend_name(case.backend)),
    )
    .await?;
    // Warm-up: one batch per service, so that every service is claimed before the
    // measurement (a new service is claimed on the next claim tick, which would otherwise
    // be part of its first batch's latency).
    let store = database.store().await;
    let run = workload::run_id();
    let warm_up = Load {
        urls: vec![instance.url.clone()],
        services: case.services,
        batches_per_list: 1,
        clients: 8,
        rate: None,
        max_batches: Some(case.services),
        run,
    };
    workload::generate(warm_up, CancellationToken::new()).await?;
    wait_drained(&store, Duration::from_secs(60)).await?;
    let since = store.database_now_us().await?;
    let total = (case.rate * case.duration.as_secs_f64()).round() as u64;
    let outcome = workload::generate(
        Load {
            urls: vec![instance.url.clone()],
            services: case.services,
            batches_per_list: 1,
            clients: 64,
            rate: Some(case.rate),
            max_batches: Some(total),
            run: run + 1,
        },
        CancellationToken::new(),
    )
    .await?;
    let offered = Instant::now();
    let drained = wait_drained(&store, Duration::from_secs(120)).await;
    let backlog_cleared = offered.elapsed().as_secs_f64();
    instance.stop().await;
    devnet.shutdown().await?;
    drained?;
    let mut latencies = store.commit_latencies_us_for_bench(since).await?;
    latencies.sort_unstable();
    if latencies.is_empty() {
        bail!("no batch was committed");
    }
    let percentile =
        |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64 / 1e6;
    let (p50, p99, max) = (percentile(0.5), percentile(0.99), percentile(1.0));
    report.add(
        "latency",
        format!(
            "{}, ledger commit {} ms, {} batches/s",
            backend_name(case.backend),
            case.commit_latency.as_millis(),
            thousands(case.rate)
        ),
        format!("p50 {} / p99 {}", millis(p50), millis(p99)),
        format!(
            "accepted -> COMMITTED on the database clock; {} batches ({} refused) over {} \
             services in {}, one per POST; max {}; all COMMITTED {} after the last was offered",
            thousands(latencies.len() as f64),
            outcome.errors,
            case.services,
            millis(outcome.seconds),
            millis(max),
            millis(backlog_cleared)
        ),
        p99,
    );
    Ok(())
}

/// Claim timings of a failover case.
#[derive(Debug, Clone)]
pub struct Expiries {
    pub name: &'static str,
    pub fast: Duration,
    pub slow: Duration,
    pub tick: Duration,
    pub request_timeout: Duration,
}

impl Expiries {
    pub fn default_config() -> Self {
        Self {
            name: "default",
            fast: Duration::from_secs(10),
            slow: Duration::from_secs(60),
            tick: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        }
    }

    pub fn short() -> Self {
        Self {
            name: "short",
            fast: Duration::from_secs(1),
            slow: Duration::from_secs(3),
            tick: Duration::from_millis(300),
            request_timeout: Duration::from_secs(2),
        }
    }

    fn flags(&self, spec: InstanceSpec) -> InstanceSpec {
        let d = |d: Duration| format!("{}ms", d.as_millis());
        spec.flag("fast_expiry", d(self.fast))
            .flag("slow_expiry", d(self.slow))
            .flag("renew_interval", d(self.tick))
            .flag("dlt_request_timeout", d(self.request_timeout))
            .flag("status_wait", d(self.request_timeout / 2))
            .flag(
                "idle_in_transaction_timeout",
                d(self.fast.min(Duration::from_secs(2))),
            )
            .flag("lock_timeout", d(self.fast.min(Duration::from_secs(2))))
    }
}

/// SIGKILL or SIGSTOP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill,
    Stop,
}

/// Two instances on PostgreSQL under a steady load sent to one of them; the other (the
/// victim, once it holds services) is killed or stopped; the time from the signal to the
/// first POST of one of its services by the survivor, and until every one of them was
/// POSTed. A stopped victim is caught mid-POST (the ledger answers slowly at that moment),
/// so its services with a batch SUBMITTING wait for the slow expiry: the slow path.
pub async fn failover(
    backend: TestBackend,
    expiries: &Expiries,
    fault: Fault,
    dir: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    const SERVICES: u64 = 20;
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let devnet = ledger(Duration::ZERO, 50_000).await?;
    let spec = expiries.flags(InstanceSpec::new(&database.options.url, devnet.base_url()));
    let label = format!("failover-{}-{:?}", expiries.name, fault).to_lowercase();
    let victim = Instance::start(&spec, dir, &format!("{label}-victim")).await?;
    let survivor = Instance::start(&spec, dir, &format!("{label}-survivor")).await?;
    let stop_load = CancellationToken::new();
    let load = tokio::spawn(workload::generate(
        Load {
            urls: vec![survivor.url.clone()],
            services: SERVICES,
            batches_per_list: 1,
            clients: 8,
            rate: Some(200.0),
            max_batches: None,
            run: workload::run_id(),
        },
        stop_load.clone(),
    ));

    // Wait until both hold services (fair share settles within a few ticks) and the
    // victim has POSTed.
    let deadline = Instant::now() + expiries.tick * 20 + Duration::from_secs(10);
    let victim_id = loop {
        let instances = store.instances().await?;
        let victim_id = instances
            .iter()
            .find(|i| i.pid == i64::from(victim.pid))
            .map(|i| i.instance_id.clone());
        if let Some(victim_id) = victim_id {
            let claims = store.claims().await?;
            let held = claims
                .iter()
                .filter(|c| c.claimant.as_deref() == Some(&victim_id))
                .count();
            let others = claims
                .iter()
                .filter(|c| c.claimant.is_some() && c.claimant.as_deref() != Some(&victim_id))
                .count();
            let posted = devnet
                .control()
                .posts()
                .entries
                .iter()
                .any(|p| p.instance.as_deref() == Some(&victim_id));
            if held > 0 && others > 0 && posted {
                break victim_id;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the two instances did not share the services; see {}",
                victim.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Steady state for a moment.
    tokio::time::sleep(expiries.tick * 2).await;
    if fault == Fault::Stop {
        // Slow answers from the ledger, so the victim stops with a POST in flight.
        devnet.control().set_faults(Faults {
            response_latency: Latency::fixed(expiries.request_timeout / 4),
            ..Faults::default()
        })?;
        tokio::time::sleep(expiries.request_timeout / 8).await;
    }
    let held: HashSet<String> = store
        .claims()
        .await?
        .into_iter()
        .filter(|c| c.claimant.as_deref() == Some(&victim_id))
        .map(|c| c.service_id)
        .collect();
    let signalled_at = now_us();
    victim
        .signal(if fault == Fault::Kill { "KILL" } else { "STOP" })
        .await?;
    let signalled = Instant::now();
    if fault == Fault::Stop {
        devnet.control().set_faults(Faults::default())?;
    }
    // What the victim left mid-submission decides the path (fast or slow expiry).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let submitting: usize = store
        .services(None)
        .await?
        .iter()
        .filter(|s| held.contains(&s.service_id))
        .filter(|s| s.counts.get(&BatchStatus::Submitting).copied().unwrap_or(0) > 0)
        .count();

    let limit =
        expiries.slow + expiries.request_timeout + expiries.tick * 4 + Duration::from_secs(10);
    let mut first_post: HashMap<String, u64> = HashMap::new();
    while first_post.len() < held.len() && signalled.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for post in devnet.control().posts().entries {
            if post.time_us > signalled_at
                && held.contains(&post.ledger)
                && post.instance.as_deref().is_some_and(|i| i != victim_id)
                && post.status == Some(202)
            {
                first_post
                    .entry(post.ledger.clone())
                    .or_insert(post.time_us);
            }
        }
    }
    stop_load.cancel();
    let _ = load.await;
    if fault == Fault::Kill {
        victim.reap().await;
    } else {
        victim.stop().await;
    }
    survivor.stop().await;
    devnet.shutdown().await?;

    let case = format!(
        "{} after SIG{}, {} expiries (fast {}, slow {}, tick {})",
        backend_name(backend),
        if fault == Fault::Kill { "KILL" } else { "STOP" },
        expiries.name,
        millis(expiries.fast.as_secs_f64()),
        millis(expiries.slow.as_secs_f64()),
        millis(expiries.tick.as_secs_f64()),
    );
    let seconds = |us: u64| us.saturating_sub(signalled_at) as f64 / 1e6;
    let first = first_post.values().min().map(|&t| seconds(t));
    let last = first_post.values().max().map(|&t| seconds(t));
    let Some(first) = first else {
        report.add(
            "failover",
            case,
            "no takeover POST".into(),
            format!(
                "none of {} services POSTed by the survivor within {}",
                held.len(),
                millis(limit.as_secs_f64())
            ),
            f64::NAN,
        );
        return Ok(());
    };
    let goal = expiries.fast + expiries.tick;
    report.add(
        "failover",
        case,
        format!("first POST after {}", millis(first)),
        format!(
            "all {} of {} services after {}; {} had a batch SUBMITTING (slow path); goal fast \
             path <= fast + tick = {}",
            first_post.len(),
            held.len(),
            millis(last.unwrap_or(first)),
            submitting,
            millis(goal.as_secs_f64())
        ),
        first,
    );
    Ok(())
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The claim tick with many services and instances (the queuers in process).
pub async fn claim_scale(
    backend: TestBackend,
    services: usize,
    instances: usize,
    rounds: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let database = TestDatabase::migrated(backend).await;
    let row =
        dltsub_queuer::bench::run_queuer_bench(&database.options, services, instances, rounds)
            .await
            .with_context(|| format!("claim tick with {services} services"))?;
    report.add(
        "claims",
        format!(
            "{}, {} services, {} instances",
            backend_name(backend),
            thousands(services as f64),
            instances
        ),
        format!(
            "tick median {} / p95 {}",
            millis(row.median_tick.as_secs_f64()),
            millis(row.p95_tick.as_secs_f64())
        ),
        format!(
            "{:.1} statements/tick over {} ticks",
            row.round_trips_per_tick, row.ticks
        ),
        row.median_tick.as_secs_f64(),
    );
    Ok(())
}
