//! The peers of `dltsub bench all` on the same PostgreSQL database: PgQueuer (Python) and
//! graphile-worker (Node) draining no-op jobs, each installed into a temporary directory by
//! `scripts/bench-peers/install` and driven by the scripts beside it, and `pgbench` as the
//! physical reference. Each runs in a scratch schema of its own, dropped afterwards.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use dltsub_store::testing::{TestBackend, TestDatabase};
use tokio::process::Command;

use super::report::{Report, millis, thousands};

/// The peer scripts: `scripts/bench-peers/` of the source tree this binary was built from,
/// or of the current directory.
pub fn scripts_dir() -> anyhow::Result<PathBuf> {
    let candidates = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench-peers"),
        PathBuf::from("scripts/bench-peers"),
    ];
    candidates
        .into_iter()
        .find(|dir| dir.join("install").is_file())
        .context("cannot find scripts/bench-peers (run from the dltsub source tree)")
}

/// A peer the installer made available, or why not.
#[derive(Debug, Clone)]
pub enum Installed {
    Ok,
    Unavailable(String),
}

#[derive(Debug)]
pub struct Peers {
    pub dir: PathBuf,
    pub pgqueuer: Installed,
    pub graphile_worker: Installed,
}

/// Runs the installer into `dir` (reused if it already holds an installation).
pub async fn install(dir: &Path) -> anyhow::Result<Peers> {
    let scripts = scripts_dir()?;
    eprintln!("installing the peers into {} (PyPI, npm)", dir.display());
    let output = tokio::time::timeout(
        Duration::from_secs(900),
        Command::new(scripts.join("install"))
            .arg(dir)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output(),
    )
    .await
    .context("installing the peers took more than 15 minutes")?
    .context("cannot run scripts/bench-peers/install")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let find = |name: &str| {
        stdout
            .lines()
            .find_map(|line| {
                let (state, rest) = line.split_once(' ')?;
                let (peer, detail) = rest.split_once(' ')?;
                (peer == name).then(|| match state {
                    "ok" => Installed::Ok,
                    _ => Installed::Unavailable(detail.to_string()),
                })
            })
            .unwrap_or_else(|| {
                Installed::Unavailable(format!("the installer said nothing about {name}"))
            })
    };
    Ok(Peers {
        dir: dir.to_path_buf(),
        pgqueuer: find("pgqueuer"),
        graphile_worker: find("graphile-worker"),
    })
}

/// What a peer's drain printed (one JSON line).
#[derive(Debug, serde::Deserialize)]
struct PeerDrain {
    version: String,
    settings: String,
    jobs: u64,
    seconds: f64,
    jobs_per_sec: f64,
    left: u64,
}

async fn run_driver(mut command: Command, what: &str) -> anyhow::Result<PeerDrain> {
    let output = tokio::time::timeout(
        Duration::from_secs(1_800),
        command.stdin(Stdio::null()).output(),
    )
    .await
    .with_context(|| format!("{what} took more than 30 minutes"))?
    .with_context(|| format!("cannot run {what}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{what} exited with {}: {}",
            output.status,
            last_stderr_line(&output)
        );
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("{what} printed no result"))?;
    let drain: PeerDrain =
        serde_json::from_str(line).with_context(|| format!("{what} printed {line}"))?;
    if drain.left != 0 {
        bail!("{what} left {} of {} jobs", drain.left, drain.jobs);
    }
    Ok(drain)
}

/// Drains `jobs` no-op jobs with each installed peer; adds a row each and returns the
/// rates (`None` for a peer that could not run).
pub async fn drains(
    peers: &Peers,
    jobs: u64,
    dltsub_rate: Option<f64>,
    report: &mut Report,
) -> Vec<(String, f64)> {
    let scripts = match scripts_dir() {
        Ok(dir) => dir,
        Err(error) => {
            report.unavailable(
                "peers",
                "pgqueuer, graphile-worker".into(),
                format!("{error:#}"),
            );
            return Vec::new();
        }
    };
    let mut rates = Vec::new();
    for peer in ["pgqueuer", "graphile-worker"] {
        let installed = if peer == "pgqueuer" {
            &peers.pgqueuer
        } else {
            &peers.graphile_worker
        };
        let case = format!("{peer}, drain of {} no-op jobs", thousands(jobs as f64));
        if let Installed::Unavailable(reason) = installed {
            report.unavailable("peers", case, reason.clone());
            continue;
        }
        let database = TestDatabase::empty(TestBackend::Postgres).await;
        let (url, schema) = database.postgres_schema().expect("a PostgreSQL database");
        let command = if peer == "pgqueuer" {
            let mut command = Command::new(peers.dir.join("venv/bin/python"));
            command
                .arg(scripts.join("pgqueuer_drain.py"))
                .args([url, schema, &jobs.to_string()]);
            command
        } else {
            let mut command = Command::new("node");
            command
                .env("NODE_PATH", peers.dir.join("node_modules"))
                .arg(scripts.join("graphile_drain.js"))
                .args([url, schema, &jobs.to_string()]);
            command
        };
        match run_driver(command, peer).await {
            Ok(drain) => {
                let ratio = dltsub_rate
                    .map(|rate| {
                        format!(
                            "; dltsub (postgres, 1 instance) / {peer} = {:.2}",
                            rate / drain.jobs_per_sec
                        )
                    })
                    .unwrap_or_default();
                report.add(
                    "peers",
                    case,
                    format!("{} jobs/s", thousands(drain.jobs_per_sec)),
                    format!(
                        "{peer} {}: {}; {} jobs in {}{ratio}",
                        drain.version,
                        drain.settings,
                        thousands(drain.jobs as f64),
                        millis(drain.seconds),
                    ),
                    drain.jobs_per_sec,
                );
                rates.push((peer.to_string(), drain.jobs_per_sec));
            }
            Err(error) => report.unavailable("peers", case, format!("{error:#}")),
        }
    }
    rates
}

fn pgbench_path() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| {
        std::env::split_paths(&p)
            .map(|dir| dir.join("pgbench"))
            .collect::<Vec<_>>()
    });
    let packaged = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin/pgbench"));
    on_path.chain(packaged).find(|path| path.is_file())
}

/// `pgbench` on the same database: single-row UPDATE transactions and the TPC-B-like
/// `-N` mix, 8 clients, for `duration` each.
pub async fn pgbench(duration: Duration, report: &mut Report) {
    let Some(pgbench) = pgbench_path() else {
        report.unavailable(
            "peers",
            "pgbench".into(),
            "pgbench not found (package postgresql-contrib or postgresql-client)".into(),
        );
        return;
    };
    let database = TestDatabase::empty(TestBackend::Postgres).await;
    let (url, schema) = database.postgres_schema().expect("a PostgreSQL database");
    let script = std::env::temp_dir().join(format!("dltsub-pgbench-{schema}.sql"));
    let cases = [
        (
            "pgbench single-row UPDATE, 8 clients",
            Some(
                "\\set aid random(1, 100000 * :scale)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n",
            ),
        ),
        ("pgbench -N (simple update), 8 clients", None),
    ];
    let run = |args: Vec<String>| {
        let mut command = Command::new(&pgbench);
        command
            .env("PGOPTIONS", format!("-c search_path={schema}"))
            .args(args)
            .arg(url)
            .stdin(Stdio::null());
        command.output()
    };
    match run(vec!["-i".into(), "-q".into(), "-s".into(), "1".into()]).await {
        Ok(output) if output.status.success() => {}
        Ok(output) => {
            let reason = last_stderr_line(&output);
            report.unavailable(
                "peers",
                "pgbench".into(),
                format!("pgbench -i failed: {reason}"),
            );
            return;
        }
        Err(error) => {
            report.unavailable(
                "peers",
                "pgbench".into(),
                format!("cannot run pgbench: {error}"),
            );
            return;
        }
    }
    for (case, custom) in cases {
        let mut args: Vec<String> = vec![
            "-n".into(),
            "-c".into(),
            "8".into(),
            "-j".into(),
            "2".into(),
            "-T".into(),
            duration.as_secs().max(1).to_string(),
        ];
        match custom {
            Some(text) => {
                if let Err(error) = std::fs::write(&script, text) {
                    report.unavailable(
                        "peers",
                        case.into(),
                        format!("cannot write the script: {error}"),
                    );
                    continue;
                }
                args.push("-f".into());
                args.push(script.display().to_string());
            }
            None => args.push("-N".into()),
        }
        match run(args).await {
            Ok(output) if output.status.success() => {
                let stdout = String::from_utf8_lossy(&output.stdout);
                let tps = stdout.lines().find_map(|line| {
                    line.strip_prefix("tps = ")?
                        .split_whitespace()
                        .next()?
                        .parse::<f64>()
                        .ok()
                });
                match tps {
                    Some(tps) => report.add(
                        "peers",
                        case.into(),
                        format!("{} TPS", thousands(tps)),
                        format!(
                            "fsynced write transactions/s on the same database, {} s",
                            duration.as_secs().max(1)
                        ),
                        tps,
                    ),
                    None => report.unavailable(
                        "peers",
                        case.into(),
                        "no tps in pgbench's output".into(),
                    ),
                }
            }
            Ok(output) => {
                let reason = last_stderr_line(&output);
                report.unavailable("peers", case.into(), format!("pgbench failed: {reason}"));
            }
            Err(error) => {
                report.unavailable("peers", case.into(), format!("cannot run pgbench: {error}"))
            }
        }
    }
    let _ = std::fs::remove_file(&script);
}

/// The last non-blank line a failed command wrote to stderr: usually its error message.
fn last_stderr_line(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("")
        .to_string()
}
