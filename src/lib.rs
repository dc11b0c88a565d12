//! cachewright keeps a Redis cache true to a MongoDB video catalogue.
//!
//! # Layout
//!
//! - [`registry`]: the key families declared in `builders/*.toml`, with
//!   their patterns, Redis types and TTL tiers;
//! - [`keys`]: typed key constructors and segment rules (the only place
//!   keys are put together);
//! - [`config`]: raw settings from file, environment and flags, validated;
//! - [`model`]: decoding BSON into entities under the contract's rejection
//!   rules, and BSON → JavaScript-compatible JSON;
//! - [`plan`]: the pure planner, entities → Redis writes as data;
//! - [`source`]: the MongoDB edge; [`sink`]: the Redis edge (pipelines,
//!   retries, sweep);
//! - [`rebuild`]: the full-rebuild pipeline and its summary;
//! - `dev` (cargo feature `dev`, never in the release image): the
//!   deterministic data set, fixture loading and the benchmarks, driven by
//!   the `cachewright-dev` binary;
//! - [`cli`], [`progress`], [`table`], [`usage`]: operator-facing glue.

pub mod admin;
pub mod cli;
pub mod config;
#[cfg(feature = "dev")]
pub mod dev;
pub mod docs;
pub mod keys;
pub mod model;
pub mod plan;
pub mod progress;
pub mod rebuild;
pub mod registry;
pub mod retry;
pub mod sample;
pub mod serve;
pub mod sink;
pub mod source;
pub mod status;
pub mod table;
pub mod tasks;
pub mod usage;
pub mod watch;
