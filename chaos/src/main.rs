//! `chaos`: runs dltsub under faults and checks the invariants.
//!
//! ```text
//! chaos matrix [--backend postgres|sqlite]      the single-fault matrix, a table, exit 1 on any broken invariant
//! chaos one --plan E5.after@3 --fault delay      one scenario (the replay command the table prints)
//! chaos soak --duration 30m [--seed X]           random multi-fault schedules until the time is up
//! chaos schedule --seed N                        one schedule (the replay command soak prints)
//! chaos db-failover [--batches-per-service N]    PostgreSQL primary killed under load (pg_auto_failover)
//! ```
//!
//! Instances are this binary's hidden `instance` subcommand: dltsub's own instance code,
//! compiled with the chaos event points.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chaos::{
    Fault, Outcome, Scenario, Schedule, matrix, run_scenario, run_scenario_with, run_schedule,
    seed_from,
};
use clap::{Parser, Subcommand, ValueEnum};
use dltsub::config::{Config, ConfigArgs};
use dltsub_store::testing::TestBackend;

#[derive(Debug, Parser)]
#[command(
    name = "chaos",
    about = "dltsub under faults, and the invariant checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    Postgres,
    Sqlite,
}

impl From<Backend> for TestBackend {
    fn from(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => TestBackend::Postgres,
            Backend::Sqlite => TestBackend::Sqlite,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FaultArg {
    Pass,
    Delay,
    Fail,
    Error,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The single-fault matrix: each event point × PASS, DELAY, FAIL.
    Matrix {
        #[arg(long, value_enum, default_value = "postgres")]
        backend: Backend,
        /// Only scenarios whose name contains this (e.g. E5, DELAY, NET, dlt).
        #[arg(long)]
        only: Option<String>,
    },
    /// One scenario, e.g. `--plan E5.after@3 --fault delay`.
    One {
        #[arg(long)]
        plan: String,
        #[arg(long, value_enum)]
        fault: FaultArg,
        #[arg(long, value_enum, default_value = "postgres")]
        backend: Backend,
        /// Run the faulted instance as a deliberately broken variant (e.g.
        /// resubmit-in-doubt), to see the checker catch it.
        #[arg(long)]
        broken: Option<String>,
    },
    /// Random multi-fault schedules (1-3 faults on 3 instances, each drawn from the
    /// seed) until the time is up; every schedule prints its replay command.
    Soak {
        #[arg(long, value_parser = humantime_duration)]
        duration: Duration,
        /// Seed of the schedules: a number, or any text such as a commit hash (default:
        /// the checkout's commit hash, `git rev-parse HEAD`).
        #[arg(long)]
        seed: Option<String>,
        #[arg(long, value_enum, default_value = "postgres")]
        backend: Backend,
    },
    /// One multi-fault schedule, from its seed (the replay command `soak` prints).
    Schedule {
        #[arg(long)]
        seed: u64,
        #[arg(long, value_enum, default_value = "postgres")]
        backend: Backend,
    },
    /// The database fails over under load: a pg_auto_failover cluster (monitor, primary,
    /// synchronous standby) in a temporary directory, dltsub instances and a client on it;
    /// the primary node is SIGKILLed mid-run. Prints the failover figures; exit 1 if an
    /// accepted batch was lost or any invariant broke.
    DbFailover {
        #[arg(long, default_value_t = 3)]
        instances: usize,
        #[arg(long, default_value_t = 6)]
        services: u64,
        #[arg(long, default_value_t = 30)]
        batches_per_service: u64,
        /// Pause between one service's submissions, in milliseconds.
        #[arg(long, default_value_t = 40)]
        pace_ms: u64,
    },
    /// One dltsub instance with the chaos event points (what the harness starts).
    #[command(hide = true)]
    Instance {
        #[command(flatten)]
        config: ConfigArgs,
    },
}

fn humantime_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    match unit {
        "s" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number * 60)),
        "h" => Ok(Duration::from_secs(number * 3600)),
        _ => Err(format!("{text:?}: use s, m or h")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Instance { config } => {
            tracing_init();
            dltsub_chaos_points::init();
            let config = Config::load(&config)?;
            // Served like `dltsub run` does, so the harness can read the fencing counters.
            let metrics = dltsub::metrics::install()?;
            let shutdown = tokio_util::sync::CancellationToken::new();
            let signal = shutdown.clone();
            tokio::spawn(async move {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                term.recv().await;
                signal.cancel();
            });
            dltsub::run::run(&config, shutdown, Some(metrics)).await?;
            Ok(true)
        }
        Command::Matrix { backend, only } => {
            let wanted = |name: &str| only.as_deref().is_none_or(|p| name.contains(p));
            let scenarios: Vec<Scenario> = matrix()
                .into_iter()
                .filter(|s| wanted(&s.to_string()))
                .collect();
            let mut network = Vec::new();
            if matches!(backend, Backend::Postgres) {
                network = chaos::network::net_matrix()
                    .into_iter()
                    .filter(|s| wanted(&s.to_string()))
                    .collect();
            }
            run_all(backend, scenarios, network).await
        }
        Command::DbFailover {
            instances,
            services,
            batches_per_service,
            pace_ms,
        } => {
            let report = chaos::run_db_failover(chaos::FailoverRun {
                instances,
                services,
                batches_per_service,
                pace: Duration::from_millis(pace_ms),
            })
            .await?;
            report.print();
            Ok(report.passed())
        }
        Command::One {
            plan,
            fault,
            backend,
            broken,
        } => {
            let scenario = parse_one(&plan, fault)?;
            let outcome = run_scenario_with(backend.into(), scenario, broken.as_deref()).await?;
            print_row(&outcome);
            print_table(std::slice::from_ref(&outcome));
            Ok(outcome.passed())
        }
        Command::Soak {
            duration,
            seed,
            backend,
        } => {
            let seed_text = seed.or_else(commit_hash).unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos().to_string())
                    .unwrap_or_default()
            });
            let mut seeds = chaos::schedule::Rng::new(seed_from(&seed_text));
            println!(
                "soak for {duration:?}, seed {seed_text} (replay the whole soak with --seed {seed_text})"
            );
            let deadline = Instant::now() + duration;
            let mut outcomes = Vec::new();
            let mut ok = true;
            while Instant::now() < deadline {
                let schedule = Schedule::from_seed(seeds.next_u64());
                eprintln!("schedule {}: {schedule}", schedule.seed);
                let outcome = run_schedule(backend.into(), &schedule).await?;
                print_row(&outcome);
                ok &= outcome.invariants_held();
                outcomes.push(outcome);
            }
            print_table(&outcomes);
            for outcome in outcomes.iter().filter(|o| !o.invariants_held()) {
                println!("FAILED {}: replay with {}", outcome.name, outcome.replay);
            }
            Ok(ok)
        }
        Command::Schedule { seed, backend } => {
            let schedule = Schedule::from_seed(seed);
            println!("schedule {seed}: {schedule}");
            let outcome = run_schedule(backend.into(), &schedule).await?;
            print_row(&outcome);
            print_table(std::slice::from_ref(&outcome));
            Ok(outcome.invariants_held())
        }
    }
}

/// The commit hash of the checkout this runs in, if it is one.
fn commit_hash() -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    let hash = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && !hash.is_empty()).then_some(hash)
}

fn parse_one(plan: &str, fault: FaultArg) -> anyhow::Result<Scenario> {
    let (point, hit) = plan.split_once('@').unwrap_or((plan, "1"));
    Ok(Scenario {
        point: point.parse().map_err(anyhow::Error::msg)?,
        hit: hit.parse()?,
        fault: match fault {
            FaultArg::Pass => Fault::Pass,
            FaultArg::Delay => Fault::Delay,
            FaultArg::Fail => Fault::Fail,
            FaultArg::Error => Fault::Error,
        },
    })
}

async fn run_all(
    backend: Backend,
    scenarios: Vec<Scenario>,
    network: Vec<chaos::network::NetScenario>,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for scenario in scenarios {
        let outcome = run_scenario(backend.into(), scenario).await?;
        print_row(&outcome);
        outcomes.push(outcome);
    }
    for scenario in network {
        let outcome = chaos::network::run_net_scenario(scenario).await?;
        print_row(&outcome);
        outcomes.push(outcome);
    }
    print_table(&outcomes);
    println!(
        "{} scenarios in {:.0}s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(outcomes.iter().all(Outcome::passed))
}

/// Logs of an instance go to its stderr (a file the harness keeps for failed scenarios);
/// `DLTSUB_LOG` takes a tracing filter.
fn tracing_init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DLTSUB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn print_row(outcome: &Outcome) {
    let verdict = if outcome.passed() {
        "ok"
    } else if outcome.invariants_held() {
        "n/r"
    } else {
        "FAILED"
    };
    eprintln!(
        "{verdict:6} {:<30} {:5.1}s",
        outcome.name,
        outcome.elapsed.as_secs_f64()
    );
    if !outcome.fired {
        eprintln!("         - the fault was never reached");
    }
    if !outcome.passed() {
        for problem in &outcome.problems {
            eprintln!("         - {problem}");
        }
        if let Some(kept) = &outcome.kept {
            eprintln!("         logs: {}", kept.display());
        }
        eprintln!("         replay: {}", outcome.replay);
    }
}

fn print_table(outcomes: &[Outcome]) {
    println!(
        "{:<30} {:>5} {:>7} {:>4} {:>8} {:>5} {:>13} {:>9} {:>9}  result",
        "scenario",
        "fired",
        "batches",
        "lost",
        "disagree",
        "order",
        "stale acc/rej",
        "dup POSTs",
        "failover"
    );
    for outcome in outcomes {
        let f = &outcome.findings;
        let failover = outcome
            .failover
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let dups = if f.duplicate_batches > 0 && outcome.duplicate_allowed {
            format!("{} (window)", f.duplicate_batches)
        } else {
            f.duplicate_batches.to_string()
        };
        println!(
            "{:<30} {:>5} {:>7} {:>4} {:>8} {:>5} {:>13} {:>9} {:>9}  {}",
            outcome.name,
            if outcome.fired { "yes" } else { "NO" },
            f.batches,
            f.lost,
            f.disagreements,
            f.order_violations,
            format!("{}/{}", f.stale_writes, outcome.stale_rejected),
            dups,
            failover,
            if outcome.passed() {
                "ok"
            } else if outcome.invariants_held() {
                "not reached"
            } else {
                "FAILED"
            }
        );
    }
}
