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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dltsub_devnet::{Devnet, DevnetConfig, Dialect, INVALID_PAYLOAD_PREFIX, Latency};
use dltsub_store::{BatchStatus, ServiceRecord, Store};
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
    /// Concurrent HTTP clients of the generator (each POSTs one BatchList at a time).
    #[arg(long, default_value_t = 4)]
    pub clients: u32,
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
    if !(1..=64).contains(&args.clients) {
        bail!("--clients must be between 1 and 64, not {}", args.clients);
    }
    let dir = tempfile::Builder::new()
        .prefix("dltsub-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let outcome = tokio::select! {
        outcome = demo(&args, dir.path()) => outcome,
        _ = tokio::signal::ctrl_c() => {
            if std::io::stderr().is_terminal() {
                // Below the progress line.
                eprintln!();
            }
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    // Instances were started with kill_on_drop: whatever happened, none outlives us.
    if args.keep || !matches!(outcome, Ok(true)) {
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
    /// It exited before it was ready (see `wait_ready`).
    exited_early: bool,
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
    for (index, instance) in instances.iter_mut().enumerate() {
        // A free port is found by binding and releasing it: another process may take it
        // before the instance binds it. Then the instance exits early; start it again.
        let mut attempt = 1;
        while let Err(error) = wait_ready(instance).await {
            if attempt == 3 || !instance.exited_early {
                return Err(error);
            }
            attempt += 1;
            *instance = start_instance(&exe, dir, index, &database_url, ledger.base_url())?;
        }
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
    let alive: Arc<Vec<AtomicBool>> =
        Arc::new((0..INSTANCES).map(|_| AtomicBool::new(true)).collect());
    let urls: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
    let mut generator = tokio::spawn(generate(
        args.services,
        args.batches,
        args.rate,
        args.clients,
        urls,
        alive.clone(),
        accepted.clone(),
    ));

    let mut progress = Progress::new();
    let mut kill: Option<Kill> = None;
    let mut drain_deadline: Option<Instant> = None;
    let mut generated: Option<Generated> = None;
    let final_counts = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if generated.is_none() && generator.is_finished() {
            // A generator that failed ends the demo now.
            let outcome = (&mut generator)
                .await
                .context("the load generator panicked")
                .and_then(|outcome| outcome);
            match outcome {
                Ok(done) => generated = Some(done),
                Err(error) => {
                    progress.finish();
                    return Err(error.context("the load generator failed"));
                }
            }
        }
        let done_accepting = generated.is_some();
        let services = store.services(None).await?;
        let counts = status_counts(&services);
        let accepted_now = accepted.load(Ordering::Relaxed);

        // Half-way, once an instance holds services (claims follow the first batches
        // within a claim tick), kill the one with the most work.
        if kill.is_none() && accepted_now >= args.batches / 2 {
            kill = kill_busiest(&store, &services, &mut instances, started).await?;
            if let Some(kill) = &kill {
                progress.event(&format!(
                    "killed {} with SIGKILL at {:.1}s: it held {} services, {} batches in flight",
                    kill.instance_id,
                    kill.at.as_secs_f64(),
                    kill.services.len(),
                    kill.in_flight
                ));
            }
        }
        if let Some(kill) = &mut kill
            && kill.moved_after.is_none()
        {
            kill.check_moved(&store).await?;
            if let Some(after) = kill.moved_after {
                progress.event(&format!(
                    "its {} services have new holders {:.1}s after the kill (at {:.1}s)",
                    kill.services.len(),
                    after.as_secs_f64(),
                    started.elapsed().as_secs_f64()
                ));
            }
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
        );
        if done_accepting {
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_TIMEOUT);
            let moved = kill.as_ref().is_some_and(|k| k.moved_after.is_some());
            if unfinished == 0 && moved {
                break counts;
            }
            if Instant::now() > deadline {
                progress.finish();
                let logs = instances
                    .iter()
                    .map(|i| i.log.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                match &kill {
                    None => bail!(
                        "no instance held a service {}s after the last batch was accepted \
                         (nothing to kill); see {logs}",
                        DRAIN_TIMEOUT.as_secs()
                    ),
                    Some(kill) if kill.moved_after.is_none() => bail!(
                        "the services of the killed instance {} found no new holder in {}s \
                         ({unfinished} batches unfinished); see {logs}",
                        kill.instance_id,
                        kill.killed_at.elapsed().as_secs()
                    ),
                    Some(_) => bail!(
                        "{unfinished} batches still unfinished {}s after the last was \
                         accepted; see {logs}",
                        DRAIN_TIMEOUT.as_secs()
                    ),
                }
            }
        }
    };
    progress.finish();
    let generated = generated.context("the load generator did not finish")?;
    let elapsed = started.elapsed();

    let mut stopped = Vec::new();
    for instance in instances.iter_mut().filter(|i| i.alive) {
        stopped.push(stop_gracefully(instance).await);
    }

    let verdict = verify(&store, &ledger, &generated).await?;
    let kill = kill.context("the demo ended before the half-way kill")?;
    print_summary(
        &generated,
        &final_counts,
        &verdict,
        &kill,
        &stopped,
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
    let mut command = Command::new(exe);
    // The demo's settings only: no DLTSUB_* configuration from the caller's environment.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("DLTSUB_") {
            command.env_remove(name);
        }
    }
    let child = command
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
        // Short claim timings so a killed instance's services move within seconds: after
        // the fast expiry (3 s) if none of its batches was mid-POST, else after the slow
        // one (7 s), which leaves the ledger request timeout (2 s) twice over to end.
        .args([
            "--fast-expiry",
            "3s",
            "--slow-expiry",
            "7s",
            "--renew-interval",
            "1s",
        ])
        .args(["--dlt-request-timeout", "2s", "--status-wait", "2s"])
        .env("DLTSUB_LOG", "warn")
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
        exited_early: false,
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
            instance.exited_early = true;
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

/// SIGTERM, then wait for the exit (SIGKILL after 20 s). Says how it ended.
async fn stop_gracefully(instance: &mut Instance) -> String {
    let started = Instant::now();
    if let Some(pid) = instance.child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stdin(Stdio::null())
            .status()
            .await;
    }
    instance.alive = false;
    match tokio::time::timeout(Duration::from_secs(20), instance.child.wait()).await {
        Ok(Ok(status)) if status.success() => {
            format!("exited 0 after {:.1} s", started.elapsed().as_secs_f64())
        }
        Ok(Ok(status)) => format!("{status}; see {}", instance.log.display()),
        Ok(Err(error)) => format!("cannot wait for it: {error}"),
        Err(_) => {
            let _ = instance.child.kill().await;
            format!(
                "still running after 20 s, killed; see {}",
                instance.log.display()
            )
        }
    }
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

fn is_invalid(n: u64) -> bool {
    n % INVALID_EVERY == INVALID_EVERY / 3
}

fn make_batch(run: u64, n: u64) -> Batch {
    let payload = if is_invalid(n) {
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

/// One BatchList of the plan: batches `first..first + size`, all of one service.
struct List {
    service: u32,
    first: u64,
    size: u64,
}

/// The whole load, decided up front: BatchLists of 1 to 5 batches, the services in turn.
fn plan(services: u32, total: u64) -> Vec<List> {
    let mut lists = Vec::new();
    let mut first = 0;
    while first < total {
        let number = lists.len() as u64;
        let size = (1 + number % 5).min(total - first);
        lists.push(List {
            service: (number % u64::from(services)) as u32,
            first,
            size,
        });
        first += size;
    }
    lists
}

/// POSTs of one BatchList before the generator gives up on answers other than 202.
const MAX_ATTEMPTS: u32 = 600;

/// What the generator's clients share.
struct Shared {
    run: u64,
    rate: u32,
    started: Instant,
    lists: Vec<List>,
    /// The next list to send.
    next_list: AtomicUsize,
    /// The instance the next POST goes to (round robin, like a load balancer).
    next_instance: AtomicUsize,
    urls: Vec<String>,
    alive: Arc<Vec<AtomicBool>>,
    accepted: Arc<AtomicU64>,
    posts: AtomicU64,
    retries: AtomicU64,
}

/// Offers `total` batches at about `rate` per second, in BatchLists of 1 to 5 batches of
/// one service, from `clients` concurrent clients, to the live instances in turn. A 429 or
/// 503 is retried after a pause, a refused connection on the next instance; nothing is
/// given up.
async fn generate(
    services: u32,
    total: u64,
    rate: u32,
    clients: u32,
    urls: Vec<String>,
    alive: Arc<Vec<AtomicBool>>,
    accepted: Arc<AtomicU64>,
) -> anyhow::Result<Generated> {
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let lists = plan(services, total);
    let invalid_ids = (0..total)
        .filter(|&n| is_invalid(n))
        .map(|n| batch_id(run, n))
        .collect();
    let shared = Arc::new(Shared {
        run,
        rate,
        started: Instant::now(),
        lists,
        next_list: AtomicUsize::new(0),
        next_instance: AtomicUsize::new(0),
        urls,
        alive,
        accepted,
        posts: AtomicU64::new(0),
        retries: AtomicU64::new(0),
    });
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        tasks.spawn(client(shared.clone(), http.clone()));
    }
    while let Some(outcome) = tasks.join_next().await {
        outcome.context("a generator client panicked")??;
    }
    Ok(Generated {
        offered: total,
        invalid_ids,
        posts: shared.posts.load(Ordering::Relaxed),
        retries: shared.retries.load(Ordering::Relaxed),
    })
}

/// One client of the generator: takes the next BatchList of the plan, waits until it is
/// due, and POSTs it until an instance accepts it.
async fn client(shared: Arc<Shared>, http: reqwest::Client) -> anyhow::Result<()> {
    loop {
        let index = shared.next_list.fetch_add(1, Ordering::Relaxed);
        let Some(list) = shared.lists.get(index) else {
            return Ok(());
        };
        // Paced to `rate` batches per second.
        let due = Duration::from_secs_f64(list.first as f64 / f64::from(shared.rate));
        if let Some(wait) = due.checked_sub(shared.started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let batches: Vec<Batch> = (list.first..list.first + list.size)
            .map(|n| make_batch(shared.run, n))
            .collect();
        let body = BatchList { batches }.encode_to_vec();
        let alive = &shared.alive;
        let mut attempts = 0;
        loop {
            if alive.iter().all(|a| !a.load(Ordering::Relaxed)) {
                // Every instance failed once: pause, then try them all again.
                tokio::time::sleep(Duration::from_millis(200)).await;
                alive.iter().for_each(|a| a.store(true, Ordering::Relaxed));
            }
            let instance = shared.next_instance.fetch_add(1, Ordering::Relaxed) % shared.urls.len();
            if !alive[instance].load(Ordering::Relaxed) {
                continue;
            }
            shared.posts.fetch_add(1, Ordering::Relaxed);
            let url = &shared.urls[instance];
            let answer = http
                .post(format!(
                    "{url}/scabbard/demo/svc{:02}/batches",
                    list.service
                ))
                .header("Content-Type", "application/octet-stream")
                .body(body.clone())
                .send()
                .await;
            attempts += 1;
            match answer {
                Ok(response) if response.status().as_u16() == 202 => break,
                // Back-pressure (429), draining (503) or a server error: the same bytes
                // again a little later, here or elsewhere (idempotent).
                Ok(response)
                    if (response.status().as_u16() == 429
                        || response.status().is_server_error())
                        && attempts < MAX_ATTEMPTS =>
                {
                    shared.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    bail!(
                        "instance {url} answered {status} to a BatchList of {} (attempt {attempts}): {body}",
                        list.size
                    )
                }
                // Refused (killed) or timed out: like a load balancer's passive health
                // check, stop sending to it, and offer the list to the next instance. A
                // list it did accept is accepted again idempotently (same bytes).
                Err(error) if attempts >= MAX_ATTEMPTS => {
                    bail!("no instance accepted a BatchList in {attempts} attempts: {error}")
                }
                Err(_) => {
                    shared.retries.fetch_add(1, Ordering::Relaxed);
                    alive[instance].store(false, Ordering::Relaxed);
                }
            }
        }
        shared.accepted.fetch_add(list.size, Ordering::Relaxed);
    }
}

fn status_counts(services: &[ServiceRecord]) -> BTreeMap<BatchStatus, i64> {
    let mut totals: BTreeMap<BatchStatus, i64> = BTreeMap::new();
    for service in services {
        for (status, count) in &service.counts {
            *totals.entry(*status).or_default() += count;
        }
    }
    totals
}

/// The SIGKILL half-way and how long its services took to move.
struct Kill {
    instance_id: String,
    at: Duration,
    killed_at: Instant,
    services: HashSet<String>,
    /// Batches of its services between mark SUBMITTING and a verdict when it was killed.
    in_flight: i64,
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

/// SIGKILLs the instance with the most work: the most batches in flight in the services
/// it holds, then the most unfinished ones, then the most services. `None` while no
/// instance holds a service.
async fn kill_busiest(
    store: &Store,
    services: &[ServiceRecord],
    instances: &mut [Instance],
    started: Instant,
) -> anyhow::Result<Option<Kill>> {
    let registered = store.instances().await?;
    let mut held: HashMap<&str, Work> = HashMap::new();
    for service in services {
        if let Some(holder) = &service.claimant {
            let work = held.entry(holder.as_str()).or_default();
            work.services.insert(service.service_id.clone());
            for (status, count) in &service.counts {
                if !status.is_terminal() {
                    work.unfinished += count;
                    if *status != BatchStatus::Queued {
                        work.in_flight += count;
                    }
                }
            }
        }
    }
    let busiest = instances
        .iter()
        .enumerate()
        .filter(|(_, instance)| instance.alive)
        .filter_map(|(index, instance)| {
            let pid = i64::from(instance.child.id()?);
            let record = registered.iter().find(|r| r.pid == pid)?;
            let work = held.remove(record.instance_id.as_str())?;
            Some((index, record.instance_id.clone(), work))
        })
        .max_by_key(|(_, _, work)| (work.in_flight, work.unfinished, work.services.len()));
    let Some((index, instance_id, work)) = busiest else {
        return Ok(None);
    };
    // The generator finds out by itself: its next POST there is refused.
    instances[index]
        .child
        .start_kill()
        .context("cannot kill an instance")?;
    instances[index].alive = false;
    Ok(Some(Kill {
        instance_id,
        at: started.elapsed(),
        killed_at: Instant::now(),
        services: work.services,
        in_flight: work.in_flight,
        moved_after: None,
    }))
}

/// What one instance holds.
#[derive(Default)]
struct Work {
    services: HashSet<String>,
    unfinished: i64,
    in_flight: i64,
}

/// The live progress on stderr: a status line, redrawn on a terminal (every 250 ms) and
/// printed every 2 s otherwise, and events (the kill, the takeover) on lines of their own.
struct Progress {
    terminal: bool,
    last_line: Option<Instant>,
    /// The status line on screen, to redraw after an event.
    line: Option<String>,
}

impl Progress {
    fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            last_line: None,
            line: None,
        }
    }

    fn show(
        &mut self,
        started: Instant,
        accepted: u64,
        total: u64,
        counts: &BTreeMap<BatchStatus, i64>,
        alive: usize,
    ) {
        let count = |status| counts.get(&status).copied().unwrap_or(0);
        let in_flight = count(BatchStatus::Submitting)
            + count(BatchStatus::Pending)
            + count(BatchStatus::Valid)
            + count(BatchStatus::InDoubt);
        let line = format!(
            "[{:5.1}s] accepted {accepted}/{total}  queued {}  in flight {in_flight}  committed {}  invalid {}  up {alive}/{INSTANCES}",
            started.elapsed().as_secs_f64(),
            count(BatchStatus::Queued),
            count(BatchStatus::Committed),
            count(BatchStatus::Invalid),
        );
        if !self.terminal
            && self
                .last_line
                .is_some_and(|at| at.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.last_line = Some(Instant::now());
        self.draw(&line);
        self.line = Some(line);
    }

    fn draw(&self, line: &str) {
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// A line that stays, above the status line.
    fn event(&mut self, text: &str) {
        if self.terminal {
            eprint!("\r\x1b[2K{text}\n");
            if let Some(line) = &self.line {
                self.draw(line);
            }
        } else {
            eprintln!("{text}");
        }
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
    stopped: &[String],
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
            format!(
                "{moved} ({} services, {} batches in flight)",
                kill.services.len(),
                kill.in_flight
            ),
        ),
        ("other instances (SIGTERM)", stopped.join("; ")),
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
