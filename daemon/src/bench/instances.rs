//! Real `dltsub run` processes for the benchmarks: started from this executable with the
//! benchmark's settings only, on free ports, with their logs in the benchmark's directory;
//! signalled (SIGKILL, SIGSTOP, SIGCONT, SIGTERM) like an operator or a crash would;
//! measured from outside (`/metrics`, `/proc/PID/status`). Killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dltsub_store::DatabaseUrl;
use tokio::process::{Child, Command};

/// How one instance is configured: the database, the ledger, and extra `--key value` flags.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub database_url: String,
    pub dlt_url: String,
    pub flags: Vec<(String, String)>,
}

impl InstanceSpec {
    pub fn new(database: &DatabaseUrl, dlt_url: &str) -> Self {
        Self {
            database_url: url_string(database),
            dlt_url: dlt_url.to_string(),
            flags: Vec::new(),
        }
    }

    pub fn flag(mut self, key: &str, value: impl Into<String>) -> Self {
        self.flags.push((key.to_string(), value.into()));
        self
    }
}

/// The URL a child process is given for `database`.
pub fn url_string(database: &DatabaseUrl) -> String {
    match database {
        DatabaseUrl::Postgres(raw) => raw.clone(),
        DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
    }
}

/// A running `dltsub run`.
pub struct Instance {
    child: Child,
    pub pid: u32,
    pub url: String,
    metrics_url: String,
    pub log: PathBuf,
}

impl Instance {
    /// Starts an instance and waits until `/readyz` answers 200 (30 s at most). A port
    /// taken between finding it free and binding it makes the child exit: start again.
    pub async fn start(spec: &InstanceSpec, dir: &Path, name: &str) -> anyhow::Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut instance = Self::spawn(spec, dir, name)?;
            match instance.wait_ready().await {
                Ok(()) => return Ok(instance),
                Err(error) if attempt < 3 && instance.child.try_wait()?.is_some() => {
                    tracing::debug!("instance {name} exited early ({error:#}); starting it again");
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Starts an instance without waiting for it (see [`Instance::wait_ready`]).
    pub fn spawn(spec: &InstanceSpec, dir: &Path, name: &str) -> anyhow::Result<Self> {
        let port = free_port()?;
        let metrics_port = free_port()?;
        let log = dir.join(format!("{name}.log"));
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let exe = std::env::current_exe().context("cannot find the dltsub executable")?;
        let mut command = Command::new(&exe);
        // The benchmark's settings only: no DLTSUB_* configuration from the environment.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("DLTSUB_") {
                command.env_remove(key);
            }
        }
        command
            .arg("run")
            .args(["--database-url", &spec.database_url])
            .args(["--dlt-url", &spec.dlt_url])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--migrate-on-start", "false"]);
        for (key, value) in &spec.flags {
            command
                .arg(format!("--{}", key.replace('_', "-")))
                .arg(value);
        }
        let child = command
            .env("DLTSUB_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        Ok(Self {
            pid: child.id().context("the instance exited at once")?,
            child,
            url: format!("http://127.0.0.1:{port}"),
            metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics"),
            log,
        })
    }

    /// Waits until `/readyz` answers 200 (30 s at most).
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = http.get(format!("{}/readyz", self.url)).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "instance {} exited with {status} before it was ready; see {}",
                    self.url,
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "instance {} not ready after 30 s; see {}",
                    self.url,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Statements (with BEGIN and COMMIT) the instance has sent to the database so far,
    /// from its `/metrics`.
    pub async fn round_trips(&self) -> anyhow::Result<u64> {
        let text = self.metrics().await?;
        let name = crate::metrics::DATABASE_ROUND_TRIPS;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
            .map(|value| value as u64)
            .with_context(|| format!("no {name} in {}", self.metrics_url))
    }

    /// The instance's `/metrics` text; also saved beside its log (`NAME.metrics`), for
    /// looking at where the time went after a run with `--keep`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let text = reqwest::get(&self.metrics_url)
            .await
            .and_then(|response| response.error_for_status())
            .with_context(|| format!("scraping {}", self.metrics_url))?
            .text()
            .await?;
        let _ = std::fs::write(self.log.with_extension("metrics"), &text);
        Ok(text)
    }

    /// Peak resident memory of the process so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        status
            .lines()
            .find_map(|line| {
                let kib = line.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?;
                kib.trim().parse::<u64>().ok()
            })
            .map(|kib| kib * 1024)
            .context("no VmHWM in /proc/PID/status")
    }

    /// CPU time (user + system) the process has used so far, in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // Fields after the command name (which may contain spaces) start at the last ')'.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("malformed /proc/PID/stat")?
            .1
            .split_whitespace()
            .collect();
        let ticks = |index: usize| -> anyhow::Result<f64> {
            Ok(fields
                .get(index)
                .context("short /proc/PID/stat")?
                .parse::<f64>()?)
        };
        // utime and stime are fields 14 and 15 of stat(5): 11 and 12 after the name.
        // Linux reports them in USER_HZ, which is 100 on every architecture it runs on.
        Ok((ticks(11)? + ticks(12)?) / 100.0)
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`).
    pub async fn signal(&self, name: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .stdin(Stdio::null())
            .status()
            .await
            .context("cannot run kill")?;
        anyhow::ensure!(status.success(), "kill -{name} {} failed", self.pid);
        Ok(())
    }

    /// SIGCONT (in case it was stopped) and SIGTERM, then waits for the exit (SIGKILL
    /// after 20 s).
    pub async fn stop(mut self) {
        let _ = self.signal("CONT").await;
        let _ = self.signal("TERM").await;
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// Waits for the process to end after a SIGKILL.
    pub async fn reap(mut self) {
        let _ = self.child.kill().await;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Stops every instance (SIGTERM, in parallel).
pub async fn stop_all(instances: Vec<Instance>) {
    let tasks: Vec<_> = instances
        .into_iter()
        .map(|instance| tokio::spawn(instance.stop()))
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}
