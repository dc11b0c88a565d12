//! `cachewright acl`: the Redis ACL rule a cachewright user needs.

use super::*;

pub fn run(global: &GlobalArgs, args: &AclArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let password = match &args.password_env {
        Some(var) => std::env::var(var).with_context(|| format!("the environment variable {var} is not set"))?,
        None => "<password>".to_string(),
    };
    println!("{}", cachewright::sink::acl::rule(&args.user, &password, &cfg.prefix, &cfg.status_prefix));
    Ok(ExitCode::SUCCESS)
}
