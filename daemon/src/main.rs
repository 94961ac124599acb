//! `dltsub`: the binary. Parses the command line, loads the configuration, and hands each
//! subcommand to its module. Errors are printed once, here, as one line, with an exit code
//! that says what kind of failure it was.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use dltsub::config::{Config, ConfigArgs, ConfigError};
use dltsub::{bench, migrate};
use tokio_util::sync::CancellationToken;

/// A high-availability batch submitter for a distributed ledger.
#[derive(Debug, Parser)]
#[command(name = "dltsub", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one instance: claim services, submit their batches, record the outcomes. SIGTERM
    /// or SIGINT hands everything over gracefully.
    Run {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Apply the database schema (idempotent; safe while other instances start).
    Migrate {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Print the effective configuration and where each value came from (secrets redacted).
    Config {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// A simulated ledger (Splinter scabbard or Sawtooth REST) for demos, tests and
    /// benchmarks, with fault knobs at start and at run time (`/_devnet/faults`).
    Devnet(dltsub_devnet::DevnetArgs),
    /// The first command to run: a simulated ledger, three instances as child processes,
    /// a load generator and a SIGKILL half-way; exits 0 only if nothing was lost.
    Demo(dltsub::demo::DemoArgs),
    #[command(flatten)]
    Ops(dltsub::ops::OpsCommand),
    /// Benchmarks that print figures (see Benchmarks in the README).
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
}

/// Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration.
const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code),
        Err(Failure::Config(error)) => {
            eprintln!("error: invalid configuration: {error}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Operation(error)) => {
            eprintln!("error: {error:#}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

enum Failure {
    Config(ConfigError),
    Operation(anyhow::Error),
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Failure::Config(error)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure::Operation(error)
    }
}

/// Runs the subcommand; `Ok` carries the exit code (client commands use several).
async fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Run { config } => {
            let config = Config::load(&config)?;
            // A chaos build validates DLTSUB_CHAOS now (exit 2 on a bad plan); otherwise
            // a no-op.
            dltsub_chaos_points::init();
            let metrics = dltsub::metrics::install()?;
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            dltsub::run::run(&config, shutdown, Some(metrics)).await?;
        }
        Command::Migrate { config } => {
            let config = Config::load(&config)?;
            migrate::run(&config).await?;
        }
        Command::Config { config } => {
            let config = Config::load(&config)?;
            print!("{}", config.render());
        }
        Command::Bench { what } => bench::run(what).await?,
        Command::Ops(command) => return Ok(dltsub::ops::run(command).await),
        Command::Demo(args) => {
            if !dltsub::demo::run(args).await? {
                return Ok(EXIT_FAILURE);
            }
        }
        Command::Devnet(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            dltsub_devnet::run_devnet(&args, async move { shutdown.cancelled().await }).await?;
        }
    }
    Ok(0)
}

/// Logs go to stderr; `DLTSUB_LOG` takes a tracing filter (default `info`, with the
/// PostgreSQL driver's notices at `warn`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DLTSUB_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = interrupt.recv() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}
