//! Restoring the watcher: its state from MongoDB (streamed), what the
//! cache holds of the tracked keys, and the saved resume tokens.

use super::WatchError;
use super::batch::CatchUp;
use super::model::Coll;
use super::state::{self, State};
use crate::config::{Collections, MongoSettings};
use crate::keys::status::StatusKeys;
use crate::plan::PlanCtx;
use crate::sink::Sink;
use crate::source::Source;
use mongodb::change_stream::event::ResumeToken;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Takes up a state kept across a pause (serve's scheduled jobs): no
/// collection is read again. A job may have written newer values
/// meanwhile (serve recorded which keys it left), so until the streams
/// pass now, what the watcher writes stays pending, as after a load; and
/// the job may have rewritten catalogue keys this state knows, so the
/// next catalogue change checks all of them. Gives the catch-up to reach.
pub(super) async fn resume_kept(
    kept: &mut State,
    sink: &Sink,
    status: &StatusKeys,
    source: &Source,
) -> Result<CatchUp, WatchError> {
    take_left_over(kept, sink, status).await?;
    kept.catching_up = true;
    kept.catalog_unsure = true;
    let catch_up = CatchUp::until(source.cluster_time().await?);
    tracing::info!(videos = kept.video_count(), "watcher state kept; streaming from its tokens");
    Ok(catch_up)
}

/// Loads the state and, meanwhile, what the cache holds of the scoped
/// and catalogue keys (catalogue contents unknown): the state may already
/// be newer than what was written (changes after the rebuild read, or
/// while this process was down), and a delete replayed from the tokens
/// must find the keys to remove. Gives the state, Redis's run id, and the
/// cluster time up to which the loaded documents may reach.
pub(super) async fn load_beside_cache(
    sink: &Sink,
    source: &Source,
    status: &StatusKeys,
    mongo: &MongoSettings,
    ctx: &PlanCtx,
) -> Result<(State, String, mongodb::bson::Timestamp), WatchError> {
    let loading = std::time::Instant::now();
    let (loaded, existing) = tokio::join!(load_state(source, mongo), existing_keys(sink, ctx));
    let mut loaded = loaded?;
    let loaded_at = source.cluster_time().await?;
    loaded.existing = existing?;
    take_left_over(&mut loaded, sink, status).await?;
    let run_id = sink.run_id().await?;
    tracing::info!(
        videos = loaded.video_count(),
        tracked_keys = loaded.existing.len(),
        scope_members = loaded.member_entries(),
        video_state_mib = loaded.video_footprint() as f64 / 1048576.0,
        load_ms = loading.elapsed().as_millis() as u64,
        db = %mongo.db,
        "watcher state loaded; streaming"
    );
    Ok((loaded, run_id, loaded_at))
}

/// Adds what an earlier batch or job left unfinished: the scopes pending
/// in `cdc:pending` and the keys deferred in `cdc:deferred`.
async fn take_left_over(state: &mut State, sink: &Sink, status: &StatusKeys) -> Result<(), WatchError> {
    state.dirty.extend(&state::Scopes::from_members(sink.members(&status.cdc_pending()).await?));
    state.deferred.extend(sink.members(&status.cdc_deferred()).await?);
    Ok(())
}

/// Loads the state: the catalogue whole, then the videos streamed in
/// chunks. The cursor fills the next chunk while the previous ones are
/// decoded and filed, so the raw documents in memory are a few chunks,
/// never the collection.
async fn load_state(source: &Source, mongo: &MongoSettings) -> Result<State, WatchError> {
    const CHUNK: usize = 2048;
    let (c, batch) = (&mongo.collections, mongo.read_batch_size);
    let (channels, categories, tags) = tokio::try_join!(
        source.read_all(&c.channel, batch),
        source.read_all(&c.category, batch),
        source.read_all(&c.tag, batch)
    )?;
    let names = c.clone();
    let internal = |e: tokio::task::JoinError| WatchError::Internal(e.to_string());
    // The key table sized once for the collection (plus headroom for
    // what arrives meanwhile): grown by doubling during the load, it and
    // the record slab (paged since) left their old copies to the
    // allocator, a fifth of the watcher's peak.
    let expected = source.estimated_count(&c.video).await as usize;
    let mut state = tokio::task::spawn_blocking(move || {
        let mut state = State::new(&names, channels, categories, tags);
        state.videos.reserve(expected + expected / 64);
        state
    })
    .await
    .map_err(internal)?;
    // Read over `_id` ranges when the data allows (the same rule as the
    // rebuild's: no two videos write one id, so order does not matter).
    let plan = source.plan_video_read(&c.video, mongo.read_cursors).await?;
    plan.log(&c.video);
    // Three stages overlap: the cursor reads chunk n+2 while the rayon
    // workers decode chunk n+1 and a blocking thread files chunk n. The
    // decoders look references up in a copy of the catalogue's symbols
    // (filing interns the rest), so they need no access to the state.
    let syms = Arc::new(state.syms.clone());
    let (tx, mut rx) = mpsc::channel::<crate::source::RawChunk>(plan.cursors());
    let (decoded_tx, mut decoded_rx) = mpsc::channel(1);
    let decoding = async move {
        while let Some(chunk) = rx.recv().await {
            let syms = Arc::clone(&syms);
            let decoded = tokio::task::spawn_blocking(move || State::decode_videos(&syms, &chunk.docs()))
                .await
                .map_err(internal)?;
            if decoded_tx.send(decoded).await.is_err() {
                break;
            }
        }
        Ok::<(), WatchError>(())
    };
    let filing = async {
        while let Some(decoded) = decoded_rx.recv().await {
            state = tokio::task::spawn_blocking(move || {
                state.file_videos(decoded);
                state
            })
            .await
            .map_err(internal)?;
        }
        Ok::<State, WatchError>(state)
    };
    let (read, decoded, filed) =
        tokio::join!(source.read_video_chunks(&c.video, &plan, batch, CHUNK, tx), decoding, filing);
    decoded?;
    read?;
    let mut state = filed?;
    tokio::task::spawn_blocking(move || {
        state.finish_load();
        // The decoding ran on rayon workers that now go idle with the
        // pages it freed: hand those back before the watcher settles.
        crate::usage::collect_freed_memory();
        state
    })
    .await
    .map_err(internal)
}

/// The scoped and catalogue keys the cache holds (not the per-video
/// ones): one SCAN, memory bounded by the catalogue.
async fn existing_keys(sink: &Sink, ctx: &PlanCtx) -> Result<state::Existing, WatchError> {
    let found = sink.scan_existing(&ctx.keys, state::tracked_families()).await?;
    let mut existing = state::Existing::default();
    for (_, key) in found.keys {
        existing.insert(&ctx.keys, &key, None);
    }
    Ok(existing)
}

pub(super) fn collection_names(names: &Collections) -> [&str; 4] {
    Coll::ALL.map(|c| c.name(names))
}

pub(super) async fn load_tokens(
    sink: &Sink,
    status: &StatusKeys,
    names: &Collections,
) -> Result<Option<Vec<ResumeToken>>, WatchError> {
    let Some(texts) = sink.load_tokens(status, &collection_names(names)).await? else { return Ok(None) };
    Ok(texts.iter().map(|text| serde_json::from_str(text).ok()).collect())
}

pub(super) async fn clear_tokens(sink: &Sink, status: &StatusKeys, names: &Collections) -> Result<(), WatchError> {
    sink.clear_tokens(status, &collection_names(names)).await?;
    // A full rebuild follows, which writes every key.
    Ok(sink.unlink(&[status.cdc_deferred()]).await?)
}
