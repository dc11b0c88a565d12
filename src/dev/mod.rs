//! Development tools: the deterministic production-shaped data set,
//! Extended JSON fixture loading and the benchmarks. Built only with the
//! cargo feature `dev` and driven by the `cachewright-dev` binary, so the
//! release binary and image cannot drop or rewrite a catalogue.
//!
//! Each tool that writes refuses a target that already holds data unless
//! the operator passes `--yes` (see [`guard`]).

pub mod bench;
pub mod bench_watch;
pub mod change_mix;
pub mod fixtures;
pub mod generate;
pub mod hold;
pub mod reader;

use crate::config::Config;

/// The development tools' error: whatever failed, with its message.
pub type DevError = Box<dyn std::error::Error + Send + Sync>;
pub type DevResult<T> = Result<T, DevError>;

/// A development tool would overwrite data it did not create.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} refused: {reason}. Point MONGODB_DB and CACHEWRIGHT_PREFIX at a scratch database and prefix, \
     or pass --yes if this data may go"
)]
pub struct Refused {
    pub what: &'static str,
    pub reason: String,
}

/// Refuses unless `yes` or the four source collections are empty.
pub async fn guard(cfg: &Config, db: &mongodb::Database, what: &'static str, yes: bool) -> DevResult<()> {
    if yes {
        return Ok(());
    }
    let c = &cfg.collections;
    let mut documents = 0;
    let mut holding = Vec::new();
    for name in [&c.channel, &c.category, &c.tag, &c.video] {
        let n = db.collection::<mongodb::bson::Document>(name).estimated_document_count().await?;
        if n > 0 {
            documents += n;
            holding.push(format!("{name} ({n})"));
        }
    }
    if documents == 0 {
        return Ok(());
    }
    let reason = format!(
        "database {:?} already holds {documents} documents ({}), which it would replace",
        cfg.mongodb_db,
        holding.join(", ")
    );
    Err(Box::new(Refused { what, reason }))
}
