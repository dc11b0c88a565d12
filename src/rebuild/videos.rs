//! The video stage: a reader task streams raw batches from the cursors
//! (one, or several over `_id` ranges: [`crate::source::ranges`]) while
//! earlier batches are decoded (and their references resolved against the
//! catalogue) with rayon on the blocking pool, one batch ahead of the one
//! being admitted; per-video ops go straight to the writer and the compact
//! [`VideoTable`] is kept for the index keys.

use super::{Batcher, RunError};
use crate::config::MongoSettings;
use crate::model::catalog::Catalog;
use crate::model::decode::Intake;
use crate::plan::decode::{admit_videos, decode_videos};
use crate::plan::index::VideoTable;
use crate::plan::{Op, PlanCtx};
use crate::progress::Progress;
use crate::registry::FamilyId;
use crate::source::{RawChunk, Source};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Documents handed to the planner at a time.
const DECODE_BATCH: usize = 2000;

pub async fn read_videos(
    source: &Source,
    mongo: &MongoSettings,
    ctx: Arc<PlanCtx>,
    catalog: Arc<Catalog>,
    mut batcher: Batcher,
    progress: &Progress,
) -> Result<(VideoTable, Intake), RunError> {
    let collection = mongo.collections.video.clone();
    // The estimate sizes the video table and the progress bar. It is
    // counted beside the read rather than before it, and only once the
    // first chunk has come: a server without a count kept in its metadata
    // (SecantusDB) scans the whole collection for it, 0.24 s at 500K
    // videos on the benchmark machine, and a count beside the cursor's
    // first reply delayed the first videos by about 0.2 s
    // (docs/BENCHMARKS.md, "eighth session"). Later, the server is
    // mostly idle. No chunk, no count: the total stays 0, as it is.
    let count = {
        let (source, collection) = (source.clone(), collection.clone());
        move || crate::tasks::spawn(async move { source.estimated_count(&collection).await })
    };
    let stage = progress.stage("reading videos", 0);
    let plan = source.plan_video_read(&collection, mongo.read_cursors).await?;
    plan.log(&collection);
    // Room for a chunk from every cursor, so none waits on another.
    let (raw_tx, mut raw_rx) = mpsc::channel::<RawChunk>(4.max(plan.cursors()));
    let reader = {
        let (source, batch_size) = (source.clone(), mongo.read_batch_size);
        crate::tasks::spawn(async move {
            source.read_video_chunks(&collection, &plan, batch_size, DECODE_BATCH, raw_tx).await
        })
    };

    let want_detail = ctx.families.contains(FamilyId::VideoDetail);
    let mut intake = Intake::default();
    // Sized once from the estimate when it comes: growing the table
    // doubles it at the worst moment (it is the run's largest structure).
    let mut table = VideoTable::default();
    let decode = |batch: RawChunk| {
        let catalog = catalog.clone();
        tokio::task::spawn_blocking(move || decode_videos(&batch.docs(), &catalog, want_detail))
    };
    // The next chunk, when the reader already has it, is decoded on the
    // blocking pool while this one is admitted here: admitting keeps the
    // cursor's order (the first of repeated ids wins), decoding needs no
    // order, so the two overlap instead of taking turns.
    let first = raw_rx.recv().await;
    let mut counting = first.is_some().then(count);
    let mut ahead = first.map(decode);
    let mut writer_alive = true;
    loop {
        let decoding = match ahead.take() {
            Some(decoding) => decoding,
            None => match raw_rx.recv().await {
                Some(batch) => decode(batch),
                None => break,
            },
        };
        let decoded = decoding.await?;
        ahead = raw_rx.try_recv().ok().map(decode);
        if let Some(count) = counting.take_if(|count| count.is_finished()) {
            let estimate = count.await.unwrap_or(0);
            table.reserve(estimate as usize);
            stage.set_total(estimate);
        }
        stage.inc(decoded.len() as u64);
        let mut ops = Vec::with_capacity(decoded.len() * 2);
        admit_videos(decoded, &mut intake, &mut table, &catalog, &ctx, &mut ops);
        if writer_alive {
            writer_alive = batcher.send(ops).await;
        }
        if !writer_alive {
            // The writer failed; its error ends the run. Stop reading.
            break;
        }
    }
    drop(raw_rx);
    reader.await??;
    batcher.flush().await;
    stage.finish();
    Ok((table, intake))
}

/// Plans the index keys off the table on the blocking pool, a group at a
/// time, and hands each group to the writer: at most a few groups are
/// ever planned ahead of what is written.
pub async fn plan_index_keys(
    table: Arc<VideoTable>,
    catalog: Arc<Catalog>,
    ctx: Arc<PlanCtx>,
    mut batcher: Batcher,
) -> Result<(), RunError> {
    let (tx, mut rx) = mpsc::channel::<Vec<Op>>(1);
    let planning = tokio::task::spawn_blocking(move || {
        table.plan_index_keys(&catalog, &ctx, &mut |ops| tx.blocking_send(ops).is_ok());
    });
    while let Some(ops) = rx.recv().await {
        if !batcher.send(ops).await {
            break;
        }
    }
    // Dropping the receiver stops the planner at its next group.
    drop(rx);
    planning.await?;
    batcher.flush().await;
    Ok(())
}
