//! `dltsub demo`: the first command a newcomer runs. In a temporary directory: an SQLite
//! database, the simulated ledger (in this process), three `dltsub run` instances as real
//! child processes, and a load generator that POSTs BatchLists over many services to the
//! instances in turn, as a load balancer would. Half-way it kills the instance holding the
//! most services with SIGKILL. It shows live progress, then checks the ledger against the
//! database — every accepted batch on the ledger exactly once, in order per service, the
//! invalid ones rejected — and prints a summary. Nothing lost is the only success.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dltsub_devnet::{Devnet, DevnetConfig, Dialect, INVALID_PAYLOAD_PREFIX, Latency};
use dltsub_store::{BatchStatus, Store};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use tokio::process::{Child, Command};

use crate::config::{Config, ConfigArgs};

/// Options of `dltsub demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Services the batches are spread over (at least 3).
    #[arg(long, default_value_t = 24)]
    pub services: u32,
    /// Batches to submit in all (at least 20).
    #[arg(long, default_value_t = 3_000)]
    pub batches: u64,
    /// Batches per second the generator offers (it slows down if dltsub pushes back).
    #[arg(long, default_value_t = 150)]
    pub rate: u32,
    /// Keep the temporary directory (database and instance logs) and print its path.
    #[arg(long)]
    pub keep: bool,
}

/// One batch in 50 carries a payload the simulated ledger rejects.
const INVALID_EVERY: u64 = 50;
const INSTANCES: usize = 3;
/// The longest the demo waits for the last batches after the generator is done.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the demo; `Ok(true)` when nothing was lost or duplicated.
pub async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    if args.services < 3 {
        bail!("--services must be at least 3, not {}", args.services);
    }
    if args.batches < 20 {
        bail!("--batches must be at least 20, not {}", args.batches);
    }
    if args.rate == 0 {
        bail!("--rate must be at least 1");
    }
    let dir = tempfile::Builder::new()
        .prefix("dltsub-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let outcome = tokio::select! {
        outcome = demo(&args, dir.path()) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    // Instances were started with kill_on_drop: whatever happened, none outlives us.
    if args.keep || outcome.is_err() {
        let kept = dir.keep();
        eprintln!("database and instance logs kept in {}", kept.display());
    }
    outcome
}

struct Instance {
    child: Child,
    url: String,
    log: PathBuf,
    alive: bool,
}

async fn demo(args: &DemoArgs, dir: &Path) -> anyhow::Result<bool> {
    let started = Instant::now();
    let database_url = format!("sqlite://{}", dir.join("demo.db").display());
    let config = Config::load_from(
        &ConfigArgs::from_pairs(&[("database_url", database_url.clone())])?,
        std::iter::empty(),
    )?;
    dltsub_store::run_migrations(&config.store_options())
        .await
        .context("migrating the demo database")?;
    let store = Store::connect(&config.store_options()).await?;

    let mut ledger_config = DevnetConfig::new(Dialect::Scabbard);
    ledger_config.faults.commit_latency = Latency::fixed(Duration::from_millis(50));
    let ledger = Devnet::spawn(ledger_config).await?;
    eprintln!(
        "ledger: simulated Splinter scabbard at {}; database: {}",
        ledger.base_url(),
        dir.join("demo.db").display()
    );

    let exe = std::env::current_exe().context("cannot find the dltsub executable")?;
    let mut instances = Vec::with_capacity(INSTANCES);
    for index in 0..INSTANCES {
        instances.push(start_instance(
            &exe,
            dir,
            index,
            &database_url,
            ledger.base_url(),
        )?);
    }
    for instance in &mut instances {
        wait_ready(instance).await?;
    }
    eprintln!(
        "instances: {} (logs in {})",
        instances
            .iter()
            .map(|i| i.url.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        dir.display()
    );

    // The generator runs beside the progress loop, which also does the kill.
    let accepted = Arc::new(AtomicU64::new(0));
    let alive: Arc<Vec<std::sync::atomic::AtomicBool>> = Arc::new(
        (0..INSTANCES)
            .map(|_| std::sync::atomic::AtomicBool::new(true))
            .collect(),
    );
    let urls: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
    let generator = tokio::spawn(generate(
        args.services,
        args.batches,
        args.rate,
        urls,
        alive.clone(),
        accepted.clone(),
    ));

    let mut progress = Progress::new();
    let mut kill: Option<Kill> = None;
    let mut drain_deadline: Option<Instant> = None;
    let final_counts = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let done_accepting = generator.is_finished();
        let counts = status_counts(&store).await?;
        let accepted_now = accepted.load(Ordering::Relaxed);

        if kill.is_none() && accepted_now >= args.batches / 2 {
            kill = Some(kill_busiest(&store, &mut instances, started).await?);
        }
        if let Some(kill) = &mut kill
            && kill.moved_after.is_none()
        {
            kill.check_moved(&store).await?;
        }
        let unfinished: i64 = counts
            .iter()
            .filter(|(status, _)| !status.is_terminal())
            .map(|(_, count)| count)
            .sum();
        progress.show(
            started,
            accepted_now,
            args.batches,
            &counts,
            instances.iter().filter(|i| i.alive).count(),
            kill.as_ref(),
        );
        if done_accepting {
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_TIMEOUT);
            let moved = kill.as_ref().is_none_or(|k| k.moved_after.is_some());
            if unfinished == 0 && moved {
                break counts;
            }
            if Instant::now() > deadline {
                progress.finish();
                bail!(
                    "{unfinished} batches still unfinished {}s after the last was accepted",
                    DRAIN_TIMEOUT.as_secs()
                );
            }
        }
    };
    progress.finish();
    let generated = generator.await.context("the load generator panicked")??;
    let elapsed = started.elapsed();

    for instance in instances.iter_mut().filter(|i| i.alive) {
        stop_gracefully(instance).await;
    }

    let verdict = verify(&store, &ledger, &generated).await?;
    let kill = kill.context("the demo ended before the half-way kill")?;
    print_summary(
        &generated,
        &final_counts,
        &verdict,
        &kill,
        elapsed,
        accepted.load(Ordering::Relaxed),
    );
    Ok(verdict.problems.is_empty())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_instance(
    exe: &Path,
    dir: &Path,
    index: usize,
    database_url: &str,
    ledger_url: &str,
) -> anyhow::Result<Instance> {
    let port = free_port()?;
    let log = dir.join(format!("instance-{}.log", index + 1));
    let log_file = std::fs::File::create(&log)?;
    let child = Command::new(exe)
        .args([
            "run",
            "--database-url",
            database_url,
            "--dlt-url",
            ledger_url,
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--migrate-on-start",
            "false",
        ])
        // Short claim timings so a killed instance's services move within seconds.
        .args([
            "--fast-expiry",
            "3s",
            "--slow-expiry",
            "10s",
            "--renew-interval",
            "1s",
        ])
        .args(["--dlt-request-timeout", "2s", "--status-wait", "2s"])
        .env("DLTSUB_LOG", "warn")
        .env_remove("DLTSUB_CONFIG")
        .stdout(Stdio::null())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    Ok(Instance {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
        alive: true,
    })
}

async fn wait_ready(instance: &mut Instance) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let http = reqwest::Client::new();
    loop {
        if let Ok(response) = http.get(format!("{}/readyz", instance.url)).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        if let Some(status) = instance.child.try_wait()? {
            bail!(
                "instance {} exited with {status} before it was ready; see {}",
                instance.url,
                instance.log.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "instance {} not ready after 30s; see {}",
                instance.url,
                instance.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM, then wait for the exit (SIGKILL after 20 s).
async fn stop_gracefully(instance: &mut Instance) {
    if let Some(pid) = instance.child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    if tokio::time::timeout(Duration::from_secs(20), instance.child.wait())
        .await
        .is_err()
    {
        let _ = instance.child.kill().await;
    }
    instance.alive = false;
}

/// What the generator sent: per service, the batch ids in the order dltsub accepted them
/// is read back from the database; here only what was offered.
struct Generated {
    offered: u64,
    invalid_ids: HashSet<String>,
    posts: u64,
    retries: u64,
}

fn batch_id(run: u64, n: u64) -> String {
    format!("{run:032x}{n:096x}")
}

fn make_batch(run: u64, n: u64) -> Batch {
    let payload = if n % INVALID_EVERY == INVALID_EVERY / 3 {
        [
            INVALID_PAYLOAD_PREFIX,
            format!(": demo batch {n}").as_bytes(),
        ]
        .concat()
    } else {
        format!("demo batch {n}").into_bytes()
    };
    Batch {
        header: format!("header {n}").into_bytes(),
        header_signature: batch_id(run, n),
        transactions: vec![Transaction {
            header: format!("txn header {n}").into_bytes(),
            header_signature: format!("{run:032x}{:096x}", n | (1 << 60)),
            payload,
        }],
        trace: false,
    }
}

/// Offers `total` batches at about `rate` per second, in BatchLists of 1 to 4 batches of
/// one service, to the live instances in turn. A 429 or 503 is retried after a pause, a
/// refused connection on the next instance; nothing is given up.
async fn generate(
    services: u32,
    total: u64,
    rate: u32,
    urls: Vec<String>,
    alive: Arc<Vec<std::sync::atomic::AtomicBool>>,
    accepted: Arc<AtomicU64>,
) -> anyhow::Result<Generated> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let next_instance = AtomicUsize::new(0);
    let mut invalid_ids = HashSet::new();
    let mut posts = 0;
    let mut retries = 0;
    let started = Instant::now();
    let mut n = 0;
    let mut list_number = 0u64;
    while n < total {
        let service = (list_number % u64::from(services)) as u32;
        let size = (1 + list_number % 4).min(total - n);
        list_number += 1;
        let batches: Vec<Batch> = (n..n + size).map(|k| make_batch(run, k)).collect();
        for batch in &batches {
            if batch.transactions[0]
                .payload
                .starts_with(INVALID_PAYLOAD_PREFIX)
            {
                invalid_ids.insert(batch.header_signature.clone());
            }
        }
        let body = BatchList { batches }.encode_to_vec();
        loop {
            if alive.iter().all(|a| !a.load(Ordering::Relaxed)) {
                // Every instance failed once: pause, then try them all again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                alive.iter().for_each(|a| a.store(true, Ordering::Relaxed));
            }
            let index = next_instance.fetch_add(1, Ordering::Relaxed) % urls.len();
            if !alive[index].load(Ordering::Relaxed) {
                continue;
            }
            posts += 1;
            let answer = http
                .post(format!(
                    "{}/scabbard/demo/svc{service:02}/batches",
                    urls[index]
                ))
                .header("Content-Type", "application/octet-stream")
                .body(body.clone())
                .send()
                .await;
            match answer.map(|r| r.status().as_u16()) {
                Ok(202) => break,
                Ok(429 | 503) => {
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(status) => bail!("instance {} answered {status}", urls[index]),
                // Refused (killed) or timed out: like a load balancer's passive health
                // check, stop sending to it, and offer the list to the next instance.
                Err(_) => {
                    retries += 1;
                    alive[index].store(false, Ordering::Relaxed);
                }
            }
        }
        n += size;
        accepted.store(n, Ordering::Relaxed);
        // Pace to `rate` batches per second.
        let due = Duration::from_secs_f64(n as f64 / f64::from(rate));
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(Generated {
        offered: n,
        invalid_ids,
        posts,
        retries,
    })
}

async fn status_counts(store: &Store) -> anyhow::Result<BTreeMap<BatchStatus, i64>> {
    let mut totals: BTreeMap<BatchStatus, i64> = BTreeMap::new();
    for service in store.services(None).await? {
        for (status, count) in service.counts {
            *totals.entry(status).or_default() += count;
        }
    }
    Ok(totals)
}

/// The SIGKILL half-way and how long its services took to move.
struct Kill {
    instance_id: String,
    at: Duration,
    killed_at: Instant,
    services: HashSet<String>,
    moved_after: Option<Duration>,
}

impl Kill {
    /// Done when none of the dead instance's services is still held by it and each has a
    /// live holder.
    async fn check_moved(&mut self, store: &Store) -> anyhow::Result<()> {
        let claims = store.claims().await?;
        let moved = claims
            .iter()
            .filter(|claim| self.services.contains(&claim.service_id))
            .all(|claim| {
                claim
                    .claimant
                    .as_deref()
                    .is_some_and(|holder| holder != self.instance_id)
            });
        if moved {
            self.moved_after = Some(self.killed_at.elapsed());
        }
        Ok(())
    }
}

/// SIGKILLs the instance that holds the most services.
async fn kill_busiest(
    store: &Store,
    instances: &mut [Instance],
    started: Instant,
) -> anyhow::Result<Kill> {
    let claims = store.claims().await?;
    let registered = store.instances().await?;
    let mut held: HashMap<&str, HashSet<String>> = HashMap::new();
    for claim in &claims {
        if let Some(holder) = &claim.claimant {
            held.entry(holder.as_str())
                .or_default()
                .insert(claim.service_id.clone());
        }
    }
    let (index, instance_id, services) = instances
        .iter()
        .enumerate()
        .filter_map(|(index, instance)| {
            let pid = i64::from(instance.child.id()?);
            let record = registered.iter().find(|r| r.pid == pid)?;
            let services = held
                .get(record.instance_id.as_str())
                .cloned()
                .unwrap_or_default();
            Some((index, record.instance_id.clone(), services))
        })
        .max_by_key(|(_, _, services)| services.len())
        .context("no running instance is registered")?;
    // The generator finds out by itself: its next POST there is refused.
    instances[index].child.start_kill()?;
    instances[index].alive = false;
    Ok(Kill {
        instance_id,
        at: started.elapsed(),
        killed_at: Instant::now(),
        services,
        moved_after: None,
    })
}

struct Progress {
    terminal: bool,
    last_line: Option<Instant>,
}

impl Progress {
    fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            last_line: None,
        }
    }

    fn show(
        &mut self,
        started: Instant,
        accepted: u64,
        total: u64,
        counts: &BTreeMap<BatchStatus, i64>,
        alive: usize,
        kill: Option<&Kill>,
    ) {
        // On a terminal the line is redrawn; in a log, one line every 2 s.
        if !self.terminal
            && self
                .last_line
                .is_some_and(|at| at.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.last_line = Some(Instant::now());
        let count = |status| counts.get(&status).copied().unwrap_or(0);
        let in_flight = count(BatchStatus::Submitting)
            + count(BatchStatus::Pending)
            + count(BatchStatus::Valid)
            + count(BatchStatus::InDoubt);
        let mut line = format!(
            "[{:5.1}s] accepted {accepted}/{total}  queued {}  in flight {in_flight}  committed {}  invalid {}  instances {alive}/{INSTANCES}",
            started.elapsed().as_secs_f64(),
            count(BatchStatus::Queued),
            count(BatchStatus::Committed),
            count(BatchStatus::Invalid),
        );
        if let Some(kill) = kill {
            match kill.moved_after {
                Some(after) => line.push_str(&format!(
                    "  | killed at {:.1}s; its {} services moved in {:.1}s",
                    kill.at.as_secs_f64(),
                    kill.services.len(),
                    after.as_secs_f64()
                )),
                None => line.push_str(&format!(
                    "  | killed at {:.1}s; {} services waiting for a new holder",
                    kill.at.as_secs_f64(),
                    kill.services.len()
                )),
            }
        }
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.terminal {
            eprintln!();
        }
    }
}

/// What the ledger shows against what the database recorded.
struct Verdict {
    on_ledger: u64,
    ledger_invalid: u64,
    duplicates: u64,
    lost: u64,
    out_of_order_services: u64,
    problems: Vec<String>,
}

async fn verify(store: &Store, ledger: &Devnet, generated: &Generated) -> anyhow::Result<Verdict> {
    let snapshot = ledger.control().ledger();
    let stats = ledger.control().stats();
    let duplicates: u64 = stats.ledgers.values().map(|l| l.duplicates).sum();
    let ledger_invalid: u64 = stats.ledgers.values().map(|l| l.invalid).sum();
    let mut problems = Vec::new();
    let mut lost = 0;
    let mut on_ledger = 0;
    let mut out_of_order_services = 0;
    let mut seen_invalid = 0;

    for service in store.services(None).await? {
        let ids = store.batch_ids_in_order(&service.service_id).await?;
        let committed_on_ledger: Vec<&str> = snapshot
            .ledgers
            .get(&service.service_id)
            .map(|view| view.committed.iter().map(String::as_str).collect())
            .unwrap_or_default();
        on_ledger += committed_on_ledger.len() as u64;
        let ledger_set: HashSet<&str> = committed_on_ledger.iter().copied().collect();
        let mut expected_order = Vec::new();
        for (batch_id, status) in &ids {
            let should_be_invalid = generated.invalid_ids.contains(batch_id);
            match (status.as_str(), should_be_invalid) {
                ("COMMITTED", false) if ledger_set.contains(batch_id.as_str()) => {
                    expected_order.push(batch_id.as_str());
                }
                ("INVALID", true) => seen_invalid += 1,
                (status, _) => {
                    lost += 1;
                    if problems.len() < 10 {
                        problems.push(format!(
                            "batch {}… of {} is {status} in dltsub, {} on the ledger",
                            &batch_id[..16],
                            service.service_id,
                            if ledger_set.contains(batch_id.as_str()) {
                                "committed"
                            } else {
                                "absent"
                            }
                        ));
                    }
                }
            }
        }
        if committed_on_ledger != expected_order {
            out_of_order_services += 1;
            problems.push(format!(
                "service {}: the ledger's order differs from the order dltsub accepted",
                service.service_id
            ));
        }
    }
    let accepted_total: u64 = store
        .services(None)
        .await?
        .iter()
        .map(|s| s.counts.values().sum::<i64>() as u64)
        .sum();
    if accepted_total != generated.offered {
        problems.push(format!(
            "{} batches offered, {accepted_total} stored",
            generated.offered
        ));
    }
    if duplicates > 0 {
        problems.push(format!("the ledger saw {duplicates} batches twice"));
    }
    if seen_invalid != generated.invalid_ids.len() as u64 || ledger_invalid != seen_invalid {
        problems.push(format!(
            "{} batches were meant to be invalid; dltsub recorded {seen_invalid}, the ledger rejected {ledger_invalid}",
            generated.invalid_ids.len()
        ));
    }
    Ok(Verdict {
        on_ledger,
        ledger_invalid,
        duplicates,
        lost,
        out_of_order_services,
        problems,
    })
}

fn print_summary(
    generated: &Generated,
    counts: &BTreeMap<BatchStatus, i64>,
    verdict: &Verdict,
    kill: &Kill,
    elapsed: Duration,
    accepted: u64,
) {
    let count = |status| counts.get(&status).copied().unwrap_or(0);
    let moved = kill
        .moved_after
        .map(|d| format!("{:.1} s", d.as_secs_f64()))
        .unwrap_or_else(|| "never".into());
    let rows = [
        ("batches accepted by dltsub", accepted.to_string()),
        (
            "BatchList POSTs (retried)",
            format!("{} ({})", generated.posts, generated.retries),
        ),
        (
            "committed (dltsub)",
            count(BatchStatus::Committed).to_string(),
        ),
        ("committed (on the ledger)", verdict.on_ledger.to_string()),
        (
            "invalid (dltsub / ledger)",
            format!(
                "{} / {}",
                count(BatchStatus::Invalid),
                verdict.ledger_invalid
            ),
        ),
        ("lost", verdict.lost.to_string()),
        (
            "duplicates seen by the ledger",
            verdict.duplicates.to_string(),
        ),
        (
            "services out of order",
            verdict.out_of_order_services.to_string(),
        ),
        (
            "instance killed (SIGKILL)",
            format!("{} at {:.1} s", kill.instance_id, kill.at.as_secs_f64()),
        ),
        (
            "its services moved after",
            format!("{moved} ({} services)", kill.services.len()),
        ),
        (
            "total time",
            format!(
                "{:.1} s ({:.0} batches/s end to end)",
                elapsed.as_secs_f64(),
                accepted as f64 / elapsed.as_secs_f64()
            ),
        ),
    ];
    println!();
    println!("dltsub demo summary");
    for (label, value) in rows {
        println!("  {label:<31} {value}");
    }
    if verdict.problems.is_empty() {
        println!("\nnothing lost, nothing duplicated, every service in order");
    } else {
        println!("\nFAILED:");
        for problem in &verdict.problems {
            println!("  - {problem}");
        }
    }
}
