//! The video stage: a reader task streams raw batches from the cursor while
//! the previous batch is decoded and planned with rayon on the blocking
//! pool; detail ops go straight to the writer, index tuples are kept.

use super::{Batcher, RunError};
use crate::config::Config;
use crate::model::decode::Intake;
use crate::plan::PlanCtx;
use crate::plan::decode::{admit_videos, decode_videos};
use crate::plan::video::VideoIndex;
use crate::progress::Progress;
use crate::registry::FamilyId;
use crate::source::Source;
use mongodb::bson::RawDocumentBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Documents handed to the planner at a time.
const DECODE_BATCH: usize = 2000;

pub async fn read_videos(
    source: &Source,
    cfg: &Config,
    ctx: Arc<PlanCtx>,
    mut batcher: Batcher,
    progress: &Progress,
) -> Result<(VideoIndex, Intake), RunError> {
    let collection = cfg.collections.video.clone();
    let stage = progress.stage("reading videos", source.estimated_count(&collection).await);
    let (raw_tx, mut raw_rx) = mpsc::channel::<Vec<RawDocumentBuf>>(4);
    let reader = {
        let (source, batch_size) = (source.clone(), cfg.read_batch_size);
        crate::tasks::spawn(async move { source.read_chunks(&collection, batch_size, DECODE_BATCH, raw_tx).await })
    };

    let want_detail = ctx.families.contains(FamilyId::VideoDetail);
    let mut intake = Intake::default();
    let mut index = VideoIndex::default();
    let mut writer_alive = true;
    while let Some(batch) = raw_rx.recv().await {
        let decoded = tokio::task::spawn_blocking(move || decode_videos(&batch, want_detail)).await?;
        stage.inc(decoded.len() as u64);
        let mut ops = Vec::with_capacity(decoded.len());
        admit_videos(decoded, &mut intake, &mut index, &ctx, &mut ops);
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
    Ok((index, intake))
}
