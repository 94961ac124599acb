//! devnet over real HTTP on 127.0.0.1, both dialects. One test binary (one link on a
//! 2-core machine), a module per subject.

mod faults;
mod harness;
mod sawtooth;
mod scabbard;
