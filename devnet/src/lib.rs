#![doc = include_str!("../README.md")]

mod bench;
mod chance;
mod config;
mod control;
mod inspect;
mod node;
mod routes;
mod server;

pub use bench::{BenchReport, DevnetBenchArgs, run_bench};
pub use config::{
    ConfigError, DevnetArgs, DevnetConfig, Dialect, Faults, FaultsPatch, Latency, SAWTOOTH_LEDGER,
};
pub use control::DevnetControl;
pub use inspect::{DevnetStats, LedgerSnapshot, LedgerStats, LedgerView, PostLog, PostRecord};
pub use node::{INVALID_FRACTION_MESSAGE, INVALID_PAYLOAD_MESSAGE, INVALID_PAYLOAD_PREFIX};
pub use routes::SCABBARD_UNAVAILABLE_MESSAGE;
pub use server::{Devnet, run_devnet, serve};
