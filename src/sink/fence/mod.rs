//! Fencing and the writer lease: who may write, under which epoch.

pub mod lease;
pub mod wire;
