//! One file per command. Each parses its options, calls the library and
//! returns an exit code; [`exit_code`] maps the errors that escape to the
//! exit-code contract in one place.

mod acl;
mod keys;
mod memory;
mod migrate;
mod purge;
mod rebuild;
mod serve;
mod status;
mod verify;
mod watch;

pub(crate) use anyhow::Context;
pub(crate) use cachewright::admin;
pub(crate) use cachewright::cli::*;
pub(crate) use cachewright::config::{Config, ConfigError};
pub(crate) use cachewright::progress::Progress;
pub(crate) use cachewright::rebuild::RebuildOptions;
pub(crate) use cachewright::registry::Registry;
pub(crate) use cachewright::table;
pub(crate) use serve::shutdown_signal;
pub(crate) use std::process::ExitCode;

pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_REJECTED: u8 = 3;
pub const EXIT_REFUSED: u8 = 4;

/// Runs the chosen command.
pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let global = &cli.global;
    match &cli.command {
        Command::Keys(args) => keys::run(args),
        Command::Acl(args) => acl::run(global, args),
        Command::Rebuild(args) => rebuild::run(global, args).await,
        Command::Migrate(args) => migrate::run(global, args).await,
        Command::Verify(args) => verify::run(global, args).await,
        Command::Memory(args) => memory::run(global, args).await,
        Command::Purge(args) => purge::run(global, args).await,
        Command::Status(args) => status::run(global, args).await,
        Command::Watch(args) => watch::run(global, args).await,
        Command::Serve(args) => serve::run(global, args).await,
    }
}

/// The exit code of an error that escaped a command: 2 for configuration,
/// 4 for a safety refusal (the writer lease held elsewhere, the sweep
/// guard), 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    use cachewright::rebuild::RunError;
    if err.downcast_ref::<ConfigError>().is_some() {
        return EXIT_USAGE;
    }
    let refused = err.chain().any(|cause| {
        cause
            .downcast_ref::<cachewright::sink::LeaseError>()
            .is_some_and(|e| matches!(e, cachewright::sink::LeaseError::Held { .. }))
            || cause.downcast_ref::<RunError>().is_some_and(|e| matches!(e, RunError::Guard(_) | RunError::Lease(_)))
    });
    if refused { EXIT_REFUSED } else { EXIT_FAILED }
}

/// `--only` as families; prints the problem and gives `None` when a name
/// is unknown (exit code 2).
pub fn families_or_usage(only: &[String]) -> Option<cachewright::plan::FamilySet> {
    cachewright::cli::parse_only(only).map_err(|msg| eprintln!("error: {msg}")).ok()
}

pub fn load_config(global: &GlobalArgs) -> Result<Config, ConfigError> {
    global.load_config()
}
