//! The migration-day toolkit: `migrate`, `verify`, `memory`, `purge`.

pub mod memory;
pub mod migrate;
pub mod purge;
pub mod verify;
