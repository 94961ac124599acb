#![doc = include_str!("../README.md")]

pub mod bench;
mod fair_share;
mod held;
mod identity;
pub mod metrics;
mod queuer;

pub use dltsub_store::LEADER_LEASE;
pub use fair_share::{fair_share, plan};
pub use held::HeldClaims;
pub use identity::this_instance;
pub use queuer::{ClaimsHandle, Queuer, QueuerConfig, TickReport};
