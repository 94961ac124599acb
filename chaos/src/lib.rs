#![doc = include_str!("../README.md")]

pub mod check;
pub mod cluster;
pub mod db_failover;
pub mod network;
pub mod pg_cluster;
pub mod proxy;
pub mod scenario;
pub mod schedule;

pub use check::{Findings, check};
pub use db_failover::{FailoverReport, FailoverRun, run_db_failover};
pub use scenario::{Fault, Outcome, Scenario, matrix, run_scenario, run_scenario_with};
pub use schedule::{Schedule, run_schedule, seed_from};
