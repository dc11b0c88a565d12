//! Decoding stages shared by the streaming rebuild, the watcher's state,
//! the in-memory planner (`verify`, golden and property tests, benchmark)
//! and anything else that plans from raw BSON: pure, like the rest of
//! planning (no I/O; the rebuild and the watcher read, this decodes).

use super::index::{Resolved, VideoTable, resolve_refs};
use super::{Op, PlanCtx};
use crate::config::Collections;
use crate::model::catalog::Catalog;
use crate::model::decode::{self, Intake, doc_id};
use crate::model::report::{CollectionReport, RefReport, Rejection};
use crate::model::video::{VideoDoc, decode_video};
use crate::registry::FamilyId;
use mongodb::bson::{RawDocument, RawDocumentBuf};
use rayon::prelude::*;

/// Decodes the three catalogue collections (in cursor order).
pub fn decode_catalog<'a>(
    names: &Collections,
    channels: impl IntoIterator<Item = &'a RawDocumentBuf>,
    categories: impl IntoIterator<Item = &'a RawDocumentBuf>,
    tags: impl IntoIterator<Item = &'a RawDocumentBuf>,
) -> (Catalog, [(String, CollectionReport); 3], RefReport) {
    let mut refs = RefReport::default();
    let (mut ch_in, mut cat_in, mut tag_in) = (Intake::default(), Intake::default(), Intake::default());
    let catalog = Catalog::new(
        channels.into_iter().filter_map(|d| ch_in.accept(d, decode::decode_channel)).collect(),
        categories.into_iter().filter_map(|d| cat_in.accept(d, decode::decode_category)).collect(),
        tags.into_iter().filter_map(|d| tag_in.accept(d, decode::decode_tag)).collect(),
    );
    for intake in [&ch_in, &cat_in, &tag_in] {
        refs.merge(&intake.refs);
    }
    let reports = [
        (names.channel.clone(), ch_in.report),
        (names.category.clone(), cat_in.report),
        (names.tag.clone(), tag_in.report),
    ];
    (catalog, reports, refs)
}

/// One video decoded off the cursor's order: its id, the decoder's result
/// and what the decoder counted, with an active video's references
/// resolved against the catalogue (see [`resolve_refs`]). An active
/// video's `category_ids` and `tag_ids` are emptied once resolved:
/// `resolved` is what admitting reads.
pub struct DecodedVideo {
    id: Result<String, Rejection>,
    video: Result<VideoDoc, Rejection>,
    refs: RefReport,
    resolved: Option<Resolved>,
}

/// Decodes a batch of videos in parallel (rayon).
pub fn decode_videos<D>(batch: &[D], catalog: &Catalog, want_detail: bool) -> Vec<DecodedVideo>
where
    D: AsRef<RawDocument> + Sync,
{
    batch
        .par_iter()
        .map(|raw| {
            let raw = raw.as_ref();
            let id = doc_id(raw);
            let mut refs = RefReport::default();
            let mut video = id.clone().and_then(|id| decode_video(raw, id, &mut refs, want_detail));
            let resolved = match &mut video {
                Ok(video) if video.active => {
                    let resolved = resolve_refs(video, catalog, &mut refs);
                    // Resolved, the references are not needed again.
                    // Freed here, on the thread that allocated them: freed
                    // by the admitting thread, each list (and each text
                    // reference) was a cross-thread free (mimalloc's
                    // slower path, a sixth of admitting's samples when
                    // every reference was a string).
                    video.category_ids = Vec::new();
                    video.tag_ids = Vec::new();
                    Some(resolved)
                }
                _ => None,
            };
            DecodedVideo { id, video, refs, resolved }
        })
        .collect()
}

/// Admits decoded videos in cursor order (repeats are rejected here),
/// keeps them in the table and plans their per-video keys into `ops`.
pub fn admit_videos(
    decoded: Vec<DecodedVideo>,
    intake: &mut Intake,
    table: &mut VideoTable,
    catalog: &Catalog,
    ctx: &PlanCtx,
    ops: &mut Vec<Op>,
) {
    for DecodedVideo { id, video, refs, resolved } in decoded {
        let mut claimed = None;
        let claim = |id: &str| {
            claimed = table.claim(id);
            claimed.is_some()
        };
        if let Some(mut video) = intake.admit_by(id, video, refs, claim)
            && let Some(at) = claimed
        {
            table.admit(at, &mut video, resolved, catalog, ctx, ops);
        }
    }
}

/// A whole run planned in memory.
#[derive(Debug)]
pub struct PlannedRun {
    pub ops: Vec<Op>,
    pub collections: Vec<(String, CollectionReport)>,
    pub refs: RefReport,
}

/// Decodes and plans everything from documents held in memory. The
/// streaming rebuild produces the same ops, in another order.
pub fn plan_in_memory(
    ctx: &PlanCtx,
    names: &Collections,
    channels: &[RawDocumentBuf],
    categories: &[RawDocumentBuf],
    tags: &[RawDocumentBuf],
    videos: &[RawDocumentBuf],
) -> PlannedRun {
    let (catalog, reports, mut refs) = decode_catalog(names, channels, categories, tags);
    let (mut ops, plan_refs) = super::plan_catalog(&catalog, ctx);
    refs.merge(&plan_refs);
    let mut collections: Vec<_> = reports.into_iter().collect();
    if ctx.families.needs_videos() {
        let mut intake = Intake::default();
        let mut table = VideoTable::default();
        let decoded = decode_videos(videos, &catalog, ctx.families.contains(FamilyId::VideoDetail));
        admit_videos(decoded, &mut intake, &mut table, &catalog, ctx, &mut ops);
        table.plan_index_keys(&catalog, ctx, &mut |group| {
            ops.extend(group);
            true
        });
        refs.merge(&intake.refs);
        collections.push((names.video.clone(), intake.report));
    }
    PlannedRun { ops, collections, refs }
}
