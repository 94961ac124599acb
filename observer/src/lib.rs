#![doc = include_str!("../README.md")]

mod decide;
pub mod metrics;
mod observer;

pub use decide::{Backoff, after_post, after_status};
pub use observer::{Observer, ObserverConfig};
