//! The `cachewright` binary: a thin dispatcher over `src/cmd/`. Errors are
//! printed with their causes (`{:#}`) and mapped to exit codes in
//! [`cmd::exit_code`].

mod cmd;

use cachewright::cli::{Cli, GlobalArgs, LogFormat};
use clap::Parser;
use std::process::ExitCode;

// The planner allocates many small strings; mimalloc keeps that cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if std::env::var_os("CACHEWRIGHT_THP").is_none() {
        cachewright::usage::disable_transparent_huge_pages();
    }
    init_logging(&cli.global);
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

fn init_logging(global: &GlobalArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = global
        .log
        .clone()
        .map(EnvFilter::new)
        .unwrap_or_else(|| EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match global.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_target(false).init(),
    }
}
