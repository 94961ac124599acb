#![doc = include_str!("../README.md")]

pub mod api;
pub mod bench;
pub mod config;
pub mod console;
pub mod demo;
pub mod metrics;
pub mod migrate;
pub mod ops;
pub mod run;
