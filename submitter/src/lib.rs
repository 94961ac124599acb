#![doc = include_str!("../README.md")]

pub mod client;
pub mod metrics;
mod submitter;

pub use client::{ClientError, Dialect, DltClient, LedgerState, LedgerStatus, PostOutcome};
pub use submitter::{InFlight, Submission, Submitter, SubmitterConfig, Wakeup};
