//! A cluster under test: a database of its own, the simulated ledger, and dltsub instances
//! as real processes (this binary's `instance` subcommand, which runs dltsub's own
//! instance code compiled with the chaos event points).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dltsub_devnet::{Devnet, DevnetConfig, Dialect, Latency};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{DatabaseUrl, Store};
use tokio::process::{Child, Command};

/// Claim timings short enough for a matrix of scenarios, long enough for a loaded
/// 2-core machine. A DELAY stalls an instance past `SLOW_EXPIRY`.
pub const FAST_EXPIRY: Duration = Duration::from_secs(2);
pub const SLOW_EXPIRY: Duration = Duration::from_secs(5);
pub const RENEW_INTERVAL: Duration = Duration::from_millis(500);

pub struct Instance {
    pub child: Child,
    pub pid: u32,
    /// Its API port on 127.0.0.1.
    pub api_port: u16,
    /// Its `/metrics` port on 127.0.0.1.
    pub metrics_port: u16,
    pub report: PathBuf,
    pub log: PathBuf,
}

pub struct Cluster {
    /// The test schema or file this cluster made (dropped with it); `None` when it runs
    /// on a database of the caller's ([`Cluster::start_on`]).
    pub database: Option<TestDatabase>,
    /// The URL the instances are given.
    pub database_url: String,
    pub store: Store,
    pub ledger: Devnet,
    pub dir: tempfile::TempDir,
    pub instances: Vec<Instance>,
    /// The deliberately broken variant the next instance runs (`DLTSUB_CHAOS_BROKEN`).
    pub broken: Option<String>,
    exe: PathBuf,
}

impl Cluster {
    pub async fn start(backend: TestBackend) -> anyhow::Result<Self> {
        let database = TestDatabase::migrated(backend).await;
        let store = database.store().await;
        let database_url = match &database.options.url {
            DatabaseUrl::Postgres(url) => url.clone(),
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        };
        let mut cluster = Self::start_on(database_url, store).await?;
        cluster.database = Some(database);
        Ok(cluster)
    }

    /// A cluster on a database the caller made and migrated, reached at `database_url`
    /// (the instances' URL) and through `store` (the harness's).
    pub async fn start_on(database_url: String, store: Store) -> anyhow::Result<Self> {
        let mut config = DevnetConfig::new(Dialect::Scabbard);
        // Slow enough that the work spans several claim ticks (E1 and E9 are reached per tick).
        config.faults.commit_latency = Latency::fixed(Duration::from_millis(100));
        let ledger = Devnet::spawn(config).await?;
        Ok(Self {
            database: None,
            database_url,
            store,
            ledger,
            dir: tempfile::tempdir()?,
            instances: Vec::new(),
            broken: None,
            exe: std::env::current_exe().context("cannot find the chaos executable")?,
        })
    }

    /// Starts one instance with the chaos `plan` (empty: no faults).
    pub fn add_instance(&mut self, plan: &str) -> anyhow::Result<usize> {
        self.add_instance_via(plan, None, None)
    }

    /// Like [`Cluster::add_instance`], reaching the database and the ledger at other URLs
    /// (through fault proxies) when given.
    pub fn add_instance_via(
        &mut self,
        plan: &str,
        database_url: Option<String>,
        ledger_url: Option<String>,
    ) -> anyhow::Result<usize> {
        let database_url = database_url.unwrap_or_else(|| self.database_url.clone());
        let ledger_url = ledger_url.unwrap_or_else(|| self.ledger.base_url().to_string());
        let index = self.instances.len();
        let report = self.dir.path().join(format!("chaos-{index}.jsonl"));
        let log = self.dir.path().join(format!("instance-{index}.log"));
        let metrics_port = free_port()?;
        let api_port = free_port()?;
        let child = Command::new(&self.exe)
            .args(["instance", "--database-url", &database_url])
            .args(["--dlt-url", &ledger_url])
            .args(["--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--migrate-on-start", "false"])
            .args(["--fast-expiry", &format!("{}ms", FAST_EXPIRY.as_millis())])
            .args(["--slow-expiry", &format!("{}ms", SLOW_EXPIRY.as_millis())])
            .args([
                "--renew-interval",
                &format!("{}ms", RENEW_INTERVAL.as_millis()),
            ])
            .args(["--dlt-request-timeout", "2s", "--status-wait", "1s"])
            .args(["--status-poll-interval", "100ms", "--unknown-grace", "2s"])
            .args(["--shutdown-timeout", "3s"])
            // A stopped process's open transaction holds claim rows until PostgreSQL ends
            // it; keep that shorter than the fast expiry.
            .args([
                "--idle-in-transaction-timeout",
                "1s",
                "--lock-timeout",
                "1s",
            ])
            .env("DLTSUB_CHAOS", plan)
            .env("DLTSUB_CHAOS_REPORT", &report)
            .env("DLTSUB_CHAOS_BROKEN", self.broken.as_deref().unwrap_or(""))
            .env("DLTSUB_LOG", "warn")
            .env_remove("DLTSUB_CONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start an instance")?;
        let pid = child.id().context("instance exited at once")?;
        self.instances.push(Instance {
            child,
            pid,
            api_port,
            metrics_port,
            report,
            log,
        });
        Ok(index)
    }

    /// The instance id (`host:pid:suffix`) of instance `index`, once it has registered.
    pub async fn instance_id(&self, index: usize) -> anyhow::Result<Option<String>> {
        let pid = i64::from(self.instances[index].pid);
        Ok(self
            .store
            .instances()
            .await?
            .into_iter()
            .find(|record| record.pid == pid)
            .map(|record| record.instance_id))
    }

    /// Waits (up to 30 s) until instance `index` has registered; returns its instance id.
    pub async fn wait_registered(&self, index: usize) -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(id) = self.instance_id(index).await? {
                return Ok(id);
            }
            if Instant::now() > deadline {
                bail!(
                    "instance {index} did not register in 30 s; see {}",
                    self.instances[index].log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Services held by `instance_id` now.
    pub async fn held_by(&self, instance_id: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .store
            .claims()
            .await?
            .into_iter()
            .filter(|claim| claim.claimant.as_deref() == Some(instance_id))
            .map(|claim| claim.service_id)
            .collect())
    }

    /// Waits until `condition` holds, checking every 50 ms, for at most `timeout`.
    pub async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut condition: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let deadline = Instant::now() + timeout;
        while !condition().await? {
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The sum over the instances still answering of their
    /// `dltsub_fenced_writes_rejected_total`: writes refused because the claim's epoch was
    /// no longer theirs (stale writes that fencing stopped). A killed instance's count is
    /// lost with it.
    pub async fn fenced_writes_rejected(&self) -> u64 {
        let client = reqwest::Client::new();
        let mut total = 0;
        for instance in &self.instances {
            let url = format!("http://127.0.0.1:{}/metrics", instance.metrics_port);
            let Ok(response) = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
            else {
                continue;
            };
            let text = response.text().await.unwrap_or_default();
            total += text
                .lines()
                .filter(|line| line.starts_with("dltsub_fenced_writes_rejected_total"))
                .filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        total
    }

    /// Sends a signal through kill(1) (the workspace forbids unsafe code).
    pub async fn signal(&self, index: usize, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.instances[index].pid.to_string()])
            .status()
            .await;
    }

    /// SIGCONT then SIGTERM to every instance still running, and waits for each (SIGKILL
    /// after 15 s).
    pub async fn stop_all(&mut self) {
        for index in 0..self.instances.len() {
            self.signal(index, "-CONT").await;
            self.signal(index, "-TERM").await;
        }
        for instance in &mut self.instances {
            if tokio::time::timeout(Duration::from_secs(15), instance.child.wait())
                .await
                .is_err()
            {
                let _ = instance.child.kill().await;
            }
        }
    }

    /// Keeps the directory (logs, reports) for a failed scenario and returns its path.
    pub fn keep(self) -> PathBuf {
        let Cluster { dir, .. } = self;
        dir.keep()
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; the instance binds it soon after).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The rules that fired in one instance, from its report file.
pub fn fired(report: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|value| {
            (
                value["rule"].as_str().unwrap_or("?").to_string(),
                value["at_us"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}
