//! Loading hand-written Extended JSON fixtures: `<dir>/<Collection>.json`
//! holds a JSON array of documents, inserted in file order.

use mongodb::bson::{Bson, Document};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

/// Parses one fixture file into documents, keeping field order.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Document>, FixtureError> {
    let shown = path.display().to_string();
    let err = |message: String| FixtureError::Parse { path: shown.clone(), message };
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
    let serde_json::Value::Array(items) = value else {
        return Err(err("expected a JSON array of documents".into()));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match Bson::try_from(item) {
            Ok(Bson::Document(d)) => Ok(d),
            Ok(_) => Err(err(format!("element {i} is not a document"))),
            Err(e) => Err(err(format!("element {i}: {e}"))),
        })
        .collect()
}

/// Reads `<dir>/<name>.json` for each collection name; a missing file is
/// an empty collection.
pub fn read_dir(dir: &Path, names: &[&str]) -> Result<Vec<(String, Vec<Document>)>, FixtureError> {
    let mut out = Vec::new();
    for name in names {
        let path = dir.join(format!("{name}.json"));
        let docs = if path.exists() {
            let text = std::fs::read_to_string(&path)
                .map_err(|source| FixtureError::Read { path: path.display().to_string(), source })?;
            parse(&path, &text)?
        } else {
            Vec::new()
        };
        out.push((name.to_string(), docs));
    }
    Ok(out)
}

/// Replaces each collection with its fixture documents.
pub async fn load(db: &mongodb::Database, sets: &[(String, Vec<Document>)]) -> mongodb::error::Result<()> {
    for (name, docs) in sets {
        let coll = db.collection::<Document>(name);
        coll.drop().await?;
        if !docs.is_empty() {
            coll.insert_many(docs).ordered(true).await?;
        }
    }
    Ok(())
}
