//! A PostgreSQL cluster with automatic failover, built in a temporary directory on local
//! ports: a pg_auto_failover monitor and two data nodes (a primary and a synchronous
//! standby), each node run by its own `pg_autoctl` keeper. Nothing of the machine's own
//! PostgreSQL is touched, and dropping the cluster kills every process it started and
//! removes the directory.
//!
//! PostgreSQL refuses to run as root; when the harness is root, every `pg_autoctl` runs as
//! the `postgres` user (which the Debian packages create) through `runuser`, with its
//! configuration and state in the cluster's directory, not in that user's home.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::cluster::free_port;

/// The installation pg_auto_failover's extension is built for (Debian's
/// `postgresql-N-auto-failover` puts it beside PostgreSQL N); the newest if several.
fn postgres_home() -> anyhow::Result<PathBuf> {
    let mut homes: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed under /usr/lib/postgresql")?
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let home = entry.path();
            home.join("lib/pgautofailover.so")
                .exists()
                .then_some((version, home))
        })
        .collect();
    homes.sort();
    homes
        .pop()
        .map(|(_, home)| home)
        .context("no PostgreSQL with pg_auto_failover (run scripts/setup-postgres)")
}
/// The database the data nodes create for dltsub.
pub const DATABASE: &str = "dltsub";

/// Monitor settings that make a failover take seconds, not the defaults' half minute: a
/// node is checked every second, and judged unhealthy after 2 s without an answer.
const MONITOR_TUNING: &[(&str, &str)] = &[
    ("pgautofailover.health_check_period", "1000"),
    ("pgautofailover.health_check_timeout", "1000"),
    ("pgautofailover.health_check_max_retries", "1"),
    ("pgautofailover.health_check_retry_delay", "500"),
    ("pgautofailover.node_considered_unhealthy_timeout", "2000"),
    ("pgautofailover.primary_demote_timeout", "3000"),
    ("pgautofailover.startup_grace_period", "2000"),
];

pub struct DataNode {
    pub name: String,
    pub port: u16,
    pub pgdata: PathBuf,
    keeper: Option<Child>,
    pub log: PathBuf,
}

pub struct AutoFailoverCluster {
    dir: tempfile::TempDir,
    /// PostgreSQL's `bin` directory (pg_ctl, psql) for the version pg_auto_failover serves.
    bindir: PathBuf,
    /// `Some("postgres")` when the harness is root.
    run_as: Option<String>,
    /// The database superuser: the OS user that ran initdb.
    superuser: String,
    monitor_port: u16,
    monitor_keeper: Option<Child>,
    pub nodes: Vec<DataNode>,
}

/// One node as the monitor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub port: u16,
    pub reported: String,
    pub assigned: String,
}

impl NodeState {
    /// Takes writes: a primary with its standby, or alone (`wait_primary`, `single`).
    pub fn is_primary(&self) -> bool {
        matches!(
            self.reported.as_str(),
            "primary" | "wait_primary" | "single"
        )
    }
}

/// Installs pg_auto_failover with apt-get if it is missing (the test command's promise:
/// it sets up what the tests need on a fresh machine). `scripts/setup-postgres` does the
/// same before the tests start; this covers running the harness on its own.
pub async fn ensure_installed() -> anyhow::Result<()> {
    if Path::new("/usr/bin/pg_autoctl").exists() && postgres_home().is_ok() {
        return Ok(());
    }
    let status = Command::new("bash")
        .arg("-c")
        .arg(
            "export DEBIAN_FRONTEND=noninteractive; \
             version=$(ls /usr/lib/postgresql | sort -V | tail -n 1); \
             (apt-get install -y postgresql-$version-auto-failover \
              || (apt-get update && apt-get install -y postgresql-$version-auto-failover)) >&2",
        )
        .status()
        .await
        .context("cannot run apt-get")?;
    if !status.success() || !Path::new("/usr/bin/pg_autoctl").exists() {
        bail!("pg_autoctl is missing and installing postgresql-N-auto-failover failed");
    }
    postgres_home().map(|_| ())
}

impl AutoFailoverCluster {
    /// Starts the monitor, the primary, then the standby, and waits until the standby is
    /// in sync (`secondary`), at most `timeout`.
    pub async fn start(timeout: Duration) -> anyhow::Result<Self> {
        ensure_installed().await?;
        let user = current_user().await?;
        let run_as = (user == "root").then(|| "postgres".to_string());
        let superuser = run_as.clone().unwrap_or(user);
        let dir = tempfile::Builder::new()
            .prefix("dltsub-pgfailover-")
            .tempdir()?;
        if let Some(user) = &run_as {
            let status = Command::new("chown")
                .args([user.as_str(), &dir.path().display().to_string()])
                .status()
                .await?;
            if !status.success() {
                bail!("cannot give {} to {user}", dir.path().display());
            }
        }
        let mut cluster = Self {
            dir,
            bindir: postgres_home()?.join("bin"),
            run_as,
            superuser,
            monitor_port: free_port()?,
            monitor_keeper: None,
            nodes: Vec::new(),
        };
        let deadline = Instant::now() + timeout;

        let monitor_pgdata = cluster.dir.path().join("monitor");
        let monitor_port = cluster.monitor_port.to_string();
        cluster.monitor_keeper = Some(cluster.spawn_autoctl(
            &[
                "create",
                "monitor",
                "--pgdata",
                &monitor_pgdata.display().to_string(),
                "--pgport",
                &monitor_port,
                "--auth",
                "trust",
                "--no-ssl",
                "--hostname",
                "127.0.0.1",
                "--run",
            ],
            "monitor.log",
        )?);
        cluster
            .wait_for("the monitor to answer", deadline, async |cluster| {
                Ok(cluster
                    .psql(cluster.monitor_port, "pg_auto_failover", "SELECT 1")
                    .await
                    .is_ok())
            })
            .await?;
        for (name, value) in MONITOR_TUNING {
            cluster
                .psql(
                    cluster.monitor_port,
                    "pg_auto_failover",
                    &format!("ALTER SYSTEM SET {name} = {value}"),
                )
                .await?;
        }
        cluster
            .psql(
                cluster.monitor_port,
                "pg_auto_failover",
                "SELECT pg_reload_conf()",
            )
            .await?;

        for index in 1..=2 {
            cluster.add_node(index)?;
            let name = format!("node_{index}");
            let wanted = if index == 1 { "single" } else { "secondary" };
            cluster
                .wait_for(
                    &format!("{name} to be {wanted}"),
                    deadline,
                    async |cluster| {
                        if index == 2 {
                            // pg_basebackup asks for a spread checkpoint, which takes minutes on
                            // an idle primary; an explicit CHECKPOINT finishes it at once.
                            let _ = cluster
                                .psql(cluster.nodes[0].port, DATABASE, "CHECKPOINT")
                                .await;
                        }
                        Ok(cluster
                            .states()
                            .await
                            .unwrap_or_default()
                            .iter()
                            .any(|node| node.name == name && node.reported == wanted))
                    },
                )
                .await?;
        }
        // The primary turns `primary` (synchronous replication on) once the standby is in.
        cluster
            .wait_for("node_1 to be primary", deadline, async |cluster| {
                Ok(cluster
                    .states()
                    .await
                    .unwrap_or_default()
                    .iter()
                    .any(|node| node.name == "node_1" && node.reported == "primary"))
            })
            .await?;
        Ok(cluster)
    }

    fn add_node(&mut self, index: usize) -> anyhow::Result<()> {
        let name = format!("node_{index}");
        let pgdata = self.dir.path().join(&name);
        let port = free_port()?;
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let log = format!("{name}.log");
        let keeper = self.spawn_autoctl(
            &[
                "create",
                "postgres",
                "--pgdata",
                &pgdata.display().to_string(),
                "--pgport",
                &port.to_string(),
                "--monitor",
                &monitor,
                "--auth",
                "trust",
                "--no-ssl",
                "--hostname",
                "127.0.0.1",
                "--name",
                &name,
                "--dbname",
                DATABASE,
                "--run",
            ],
            &log,
        )?;
        self.nodes.push(DataNode {
            name,
            port,
            pgdata,
            keeper: Some(keeper),
            log: self.dir.path().join(log),
        });
        Ok(())
    }

    /// `pg_autoctl ARGS`, as the `postgres` user when root, with its configuration and
    /// state kept in the cluster's directory (not in the user's home), output to `log`.
    fn spawn_autoctl(&self, args: &[&str], log: &str) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.dir.path().join(log))?;
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--", "pg_autoctl"]);
                command
            }
            None => Command::new("pg_autoctl"),
        };
        let root = self.dir.path();
        command
            .args(args)
            .env("XDG_CONFIG_HOME", root.join("config"))
            .env("XDG_DATA_HOME", root.join("data"))
            .env("XDG_RUNTIME_DIR", root.join("run"))
            .env("PG_CONFIG", self.bindir.join("pg_config"))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.bindir.display(),
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
                ),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        command.spawn().context("cannot start pg_autoctl")
    }

    /// Runs one SQL statement with psql on a local port; its output, trimmed.
    pub async fn psql(&self, port: u16, database: &str, sql: &str) -> anyhow::Result<String> {
        let output = Command::new(self.bindir.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", &self.superuser, "-d", database])
            .args(["-v", "ON_ERROR_STOP=1", "-X", "-A", "-t", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(Stdio::null())
            .output()
            .await?;
        if !output.status.success() {
            bail!(
                "psql on port {port}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// The data nodes as the monitor sees them.
    pub async fn states(&self) -> anyhow::Result<Vec<NodeState>> {
        let rows = self
            .psql(
                self.monitor_port,
                "pg_auto_failover",
                "SELECT nodename, nodeport, reportedstate, goalstate \
                 FROM pgautofailover.node ORDER BY nodeid",
            )
            .await?;
        Ok(rows
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('|');
                Some(NodeState {
                    name: fields.next()?.to_string(),
                    port: fields.next()?.parse().ok()?,
                    reported: fields.next()?.to_string(),
                    assigned: fields.next()?.to_string(),
                })
            })
            .collect())
    }

    /// The node that takes writes now, if the monitor knows one.
    pub async fn primary(&self) -> anyhow::Result<Option<NodeState>> {
        Ok(self.states().await?.into_iter().find(NodeState::is_primary))
    }

    /// `synchronous_standby_names` on a node: non-empty means a commit waits for the
    /// standby.
    pub async fn synchronous_standby_names(&self, port: u16) -> anyhow::Result<String> {
        self.psql(port, DATABASE, "SHOW synchronous_standby_names")
            .await
    }

    /// The URL dltsub is given: both data nodes, writes only on the primary.
    pub fn database_url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!(
            "postgres://{}@{}/{DATABASE}?target_session_attrs=read-write",
            self.superuser,
            hosts.join(",")
        )
    }

    /// Kills a data node the way a machine dies: its keeper, its postmaster and every
    /// backend, at once with SIGKILL. The keeper must go too, or it would restart
    /// PostgreSQL within a second and there would be nothing to fail over.
    pub async fn kill_node(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.name == name)
            .with_context(|| format!("no node {name}"))?;
        let mut roots = Vec::new();
        if let Some(keeper) = &node.keeper {
            roots.extend(keeper.id());
        }
        if let Some(postmaster) = postmaster_pid(&node.pgdata) {
            roots.push(postmaster);
        }
        kill_trees(&roots).await;
        if let Some(mut keeper) = node.keeper.take() {
            let _ = keeper.wait().await;
        }
        Ok(())
    }

    /// Whether any process of node `name` is still alive.
    pub fn node_alive(&self, name: &str) -> bool {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .and_then(|node| postmaster_pid(&node.pgdata))
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    async fn wait_for(
        &self,
        what: &str,
        deadline: Instant,
        condition: impl AsyncFn(&Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        while !condition(self).await? {
            if Instant::now() > deadline {
                bail!(
                    "timed out waiting for {what}; logs in {}",
                    self.dir.path().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}

impl Drop for AutoFailoverCluster {
    fn drop(&mut self) {
        // Every process of the cluster, keepers first (so none restarts a postmaster),
        // then anything left of the postmasters (started by keepers: their descendants).
        let mut roots: Vec<u32> = Vec::new();
        roots.extend(self.monitor_keeper.as_ref().and_then(Child::id));
        for node in &self.nodes {
            roots.extend(node.keeper.as_ref().and_then(Child::id));
        }
        roots.extend(postmaster_pid(&self.dir.path().join("monitor")));
        for node in &self.nodes {
            roots.extend(postmaster_pid(&node.pgdata));
        }
        kill_trees_blocking(&roots);
    }
}

async fn current_user() -> anyhow::Result<String> {
    let output = Command::new("id").arg("-un").output().await?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn postmaster_pid(pgdata: &Path) -> Option<u32> {
    std::fs::read_to_string(pgdata.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// (pid, parent pid, state) of every process, from /proc.
fn processes() -> Vec<(u32, u32, char)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name is in parentheses and may hold spaces: read after it.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let parent = fields.next()?.parse().ok()?;
            Some((pid, parent, state))
        })
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    processes()
        .iter()
        .any(|(each, _, state)| *each == pid && *state == 'Z')
}

/// `roots` and all their descendants.
fn trees(roots: &[u32]) -> Vec<u32> {
    let all = processes();
    let mut found: Vec<u32> = roots.to_vec();
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        for (pid, each_parent, _) in &all {
            if *each_parent == parent && !found.contains(pid) {
                found.push(*pid);
            }
        }
        index += 1;
    }
    found
}

/// Freezes the trees (SIGSTOP: nothing in them can start a replacement), then kills every
/// process in them, including any started in between.
async fn kill_trees(roots: &[u32]) {
    signal_all(&trees(roots), "-STOP").await;
    signal_all(&trees(roots), "-KILL").await;
}

async fn signal_all(pids: &[u32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    // kill(1): the workspace forbids unsafe code, so no libc::kill.
    let _ = Command::new("kill")
        .arg(signal)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .await;
}

fn kill_trees_blocking(roots: &[u32]) {
    for signal in ["-STOP", "-KILL"] {
        let pids = trees(roots);
        if pids.is_empty() {
            return;
        }
        let _ = std::process::Command::new("kill")
            .arg(signal)
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
    }
}
