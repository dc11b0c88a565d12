//! `cachewright migrate`: the MongoDB side of migration day.
//!
//! 1. Every VideoMedia `categoryId` is folded into `categoryIds` (made an
//!    array, existing entries kept, nothing added twice) and removed.
//! 2. The legacy `channelId` is removed from Category and Tag.
//!
//! Each step only touches documents that still need it, in batches, with
//! a guarded update (the document must still hold the value that was
//! read), so a second run changes nothing and a killed run picks up where
//! it stopped.

use crate::config::Collections;
use crate::model::id::written_id;
use crate::progress::Progress;
use futures::{StreamExt, TryStreamExt};
use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub step: String,
    /// Documents that needed the step when it started.
    pub matched: u64,
    /// Documents changed (0 on a dry run).
    pub changed: u64,
    pub samples: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("migrating {collection} failed: {source}")]
    Mongo {
        collection: String,
        #[source]
        source: mongodb::error::Error,
    },
    #[error("migrating {collection} made no progress on a batch; another writer may be changing the same documents")]
    Stuck { collection: String },
}

/// The written form of an id-like value, for "add none twice".
fn written(value: &Bson) -> String {
    written_id(value).unwrap_or_else(|| format!("{value:?}"))
}

/// What folding does to a document: `None` when it needs nothing;
/// otherwise the new `categoryIds`, or `Some(None)` when a null
/// `categoryId` only needs removing (a video with neither keeps neither).
/// A `categoryIds` stored as one scalar becomes a one-element array, as a
/// lone `categoryId` does.
pub fn folded_category_ids(doc: &Document) -> Option<Option<Vec<Bson>>> {
    let legacy = doc.get("categoryId");
    let existing = doc.get("categoryIds").filter(|v| !matches!(v, Bson::Null));
    let scalar = existing.is_some_and(|v| !matches!(v, Bson::Array(_)));
    if legacy.is_none() && !scalar {
        return None;
    }
    let legacy = legacy.filter(|v| !matches!(v, Bson::Null));
    if legacy.is_none() && existing.is_none() {
        return Some(None);
    }
    let mut ids: Vec<Bson> = match existing {
        None => Vec::new(),
        Some(Bson::Array(items)) => items.clone(),
        Some(other) => vec![other.clone()],
    };
    if let Some(legacy) = legacy
        && !ids.iter().any(|id| written(id) == written(legacy))
    {
        ids.push(legacy.clone());
    }
    Some(Some(ids))
}

/// Videos that still need folding: a legacy `categoryId`, or a
/// `categoryIds` that is set but not an array.
fn needs_folding() -> Document {
    doc! { "$or": [
        { "categoryId": { "$exists": true } },
        { "categoryIds": { "$exists": true, "$ne": Bson::Null, "$not": { "$type": "array" } } },
    ] }
}

fn sample_id(doc: &Document) -> String {
    doc.get("_id").map(written).unwrap_or_else(|| "<none>".into())
}

async fn samples(db: &Database, collection: &str, filter: Document) -> Result<Vec<String>, MigrateError> {
    let err = |source| MigrateError::Mongo { collection: collection.to_string(), source };
    let docs: Vec<Document> = db
        .collection::<Document>(collection)
        .find(filter)
        .limit(5)
        .await
        .map_err(err)?
        .try_collect()
        .await
        .map_err(err)?;
    Ok(docs.iter().map(sample_id).collect())
}

/// Runs (or, with `dry_run`, counts) every step.
pub async fn migrate(
    db: &Database,
    names: &Collections,
    batch: usize,
    dry_run: bool,
    progress: &Progress,
) -> Result<Vec<StepReport>, MigrateError> {
    let mut reports = vec![fold_category_ids(db, &names.video, batch, dry_run, progress).await?];
    for collection in [&names.category, &names.tag] {
        reports.push(remove_channel_id(db, collection, dry_run).await?);
    }
    Ok(reports)
}

async fn fold_category_ids(
    db: &Database,
    collection: &str,
    batch: usize,
    dry_run: bool,
    progress: &Progress,
) -> Result<StepReport, MigrateError> {
    let err = |source| MigrateError::Mongo { collection: collection.to_string(), source };
    let coll = db.collection::<Document>(collection);
    let filter = needs_folding();
    let matched = coll.count_documents(filter.clone()).await.map_err(err)?;
    let mut report = StepReport {
        step: format!("{collection}: fold categoryId into categoryIds"),
        matched,
        changed: 0,
        samples: samples(db, collection, filter.clone()).await?,
    };
    if dry_run || matched == 0 {
        return Ok(report);
    }
    let stage = progress.stage("migrating videos", matched);
    loop {
        let docs: Vec<Document> = coll
            .find(filter.clone())
            .projection(doc! { "_id": 1, "categoryId": 1, "categoryIds": 1 })
            .limit(batch as i64)
            .await
            .map_err(err)?
            .try_collect()
            .await
            .map_err(err)?;
        if docs.is_empty() {
            break;
        }
        let changed: u64 = futures::stream::iter(docs)
            .map(|d| {
                let coll = coll.clone();
                async move {
                    let Some(ids) = folded_category_ids(&d) else { return Ok(0) };
                    // Guarded: only if the document still holds what we read.
                    let mut guard = doc! { "_id": d.get("_id").cloned().unwrap_or(Bson::Null) };
                    for field in ["categoryId", "categoryIds"] {
                        guard.insert(field, d.get(field).cloned().unwrap_or(Bson::Null));
                    }
                    let update = match ids {
                        Some(ids) => doc! { "$set": { "categoryIds": ids }, "$unset": { "categoryId": "" } },
                        None => doc! { "$unset": { "categoryId": "" } },
                    };
                    coll.update_one(guard, update).await.map(|r| r.modified_count)
                }
            })
            .buffer_unordered(16)
            .try_fold(0, |acc, n| async move { Ok(acc + n) })
            .await
            .map_err(err)?;
        if changed == 0 {
            return Err(MigrateError::Stuck { collection: collection.to_string() });
        }
        report.changed += changed;
        stage.inc(changed);
    }
    stage.finish();
    Ok(report)
}

async fn remove_channel_id(db: &Database, collection: &str, dry_run: bool) -> Result<StepReport, MigrateError> {
    let err = |source| MigrateError::Mongo { collection: collection.to_string(), source };
    let coll = db.collection::<Document>(collection);
    let filter = doc! { "channelId": { "$exists": true } };
    let matched = coll.count_documents(filter.clone()).await.map_err(err)?;
    let mut report = StepReport {
        step: format!("{collection}: remove legacy channelId"),
        matched,
        changed: 0,
        samples: samples(db, collection, filter.clone()).await?,
    };
    if !dry_run && matched > 0 {
        report.changed =
            coll.update_many(filter, doc! { "$unset": { "channelId": "" } }).await.map_err(err)?.modified_count;
    }
    Ok(report)
}

/// Renders the per-step table.
pub fn render(reports: &[StepReport], dry_run: bool) -> String {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| vec![r.step.clone(), r.matched.to_string(), r.changed.to_string(), r.samples.join(", ")])
        .collect();
    let header = ["step", if dry_run { "would change" } else { "needed" }, "changed", "samples"];
    crate::table::render(&header, &rows, &[1, 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::oid::ObjectId;

    #[test]
    fn folding_keeps_existing_entries_and_adds_none_twice() {
        let oid = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
        let cases = [
            (doc! { "categoryId": "c1" }, Some(Some(vec![Bson::from("c1")]))),
            (doc! { "categoryId": "c1", "categoryIds": ["c2"] }, Some(Some(vec![Bson::from("c2"), Bson::from("c1")]))),
            (
                doc! { "categoryId": "c1", "categoryIds": ["c1", "c2"] },
                Some(Some(vec![Bson::from("c1"), Bson::from("c2")])),
            ),
            (
                doc! { "categoryId": oid, "categoryIds": ["65a1b2c3d4e5f6a7b8c9d0e1"] },
                Some(Some(vec![Bson::from("65a1b2c3d4e5f6a7b8c9d0e1")])),
            ),
            (doc! { "categoryId": "c1", "categoryIds": "c2" }, Some(Some(vec![Bson::from("c2"), Bson::from("c1")]))),
            (doc! { "categoryId": Bson::Null, "categoryIds": Bson::Null }, Some(None)),
            (doc! { "categoryId": Bson::Null, "categoryIds": ["c3"] }, Some(Some(vec![Bson::from("c3")]))),
            (doc! { "categoryIds": ["c1"] }, None),
            (doc! { "categoryIds": "c1" }, Some(Some(vec![Bson::from("c1")]))),
            (doc! { "categoryIds": oid }, Some(Some(vec![Bson::from(oid)]))),
            (doc! { "categoryIds": Bson::Null }, None),
            (doc! {}, None),
        ];
        for (doc, expected) in cases {
            assert_eq!(folded_category_ids(&doc), expected, "{doc}");
        }
    }
}
