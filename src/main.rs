//! The `cachewright` binary: a thin dispatcher over `src/cmd/`. Errors are
//! printed with their causes (`{:#}`) and mapped to exit codes in
//! [`cmd::exit_code`].

mod cmd;

use cachewright::cli::Cli;
use clap::Parser;
use std::process::ExitCode;

// The planner allocates many small strings; mimalloc keeps that cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    cachewright::usage::configure_process(matches!(
        cli.command,
        cachewright::cli::Command::Watch(_) | cachewright::cli::Command::Serve(_)
    ));
    cli.global.init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(cmd::EXIT_FAILED);
        }
    };
    match runtime.block_on(cmd::dispatch(cli)) {
        Ok(code) => code,
        Err(err) => {
            let code = cmd::exit_code(&err);
            if code == cmd::EXIT_USAGE {
                eprintln!("error: {err}")
            } else {
                eprintln!("error: {err:#}")
            }
            ExitCode::from(code)
        }
    }
}
