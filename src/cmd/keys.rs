//! `cachewright keys`: the key registry.

use super::*;

pub fn run(args: &KeysArgs) -> anyhow::Result<ExitCode> {
    let reg = Registry::get();
    let rows: Vec<Vec<String>> = reg
        .families()
        .iter()
        .map(|f| {
            vec![
                f.name().to_string(),
                format!("{{prefix}}{}", f.pattern),
                f.redis_type.as_str().to_string(),
                format!("{} ({}s)", f.tier.as_str(), f.tier.default_seconds()),
                f.meaning.clone(),
            ]
        })
        .collect();
    let header = ["family", "pattern", "type", "ttl tier", "meaning"];
    match args.format {
        KeysFormat::Table => print!("{}", table::render(&header, &rows, &[])),
        KeysFormat::Markdown => print!("{}", cachewright::docs::markdown()),
        KeysFormat::Typescript => print!("{}", cachewright::docs::typescript()),
        KeysFormat::Json => {
            let items: Vec<serde_json::Value> = reg
                .families()
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "family": f.name(),
                        "collection": f.collection,
                        "pattern": f.pattern.to_string(),
                        "type": f.redis_type.as_str(),
                        "tier": f.tier.as_str(),
                        "ttl_seconds": f.tier.default_seconds(),
                        "meaning": f.meaning,
                        "payload": f.payload,
                        "invalidated_by": f.invalidated_by,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&items)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
