//! `cargo run --release -p dltsub-devnet --example bench -- [--dialect sawtooth] [--clients N] …`:
//! the devnet benchmark without the dltsub binary.

use clap::Parser;
use dltsub_devnet::{DevnetBenchArgs, run_bench};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: DevnetBenchArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let report = run_bench(&cli.bench).await?;
    println!("{report}");
    Ok(())
}
