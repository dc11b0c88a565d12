//! The write stage: takes planned batches from a channel and writes them
//! through several concurrent pipelines, recording what was produced.

use crate::plan::Op;
use crate::registry::FamilyId;
use crate::sink::{Sink, SinkError};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

/// What the write stage did.
#[derive(Debug, Default)]
pub struct WriteOutcome {
    /// Digests of every key written (or planned, on a dry run), except
    /// the keys of per-video families: the rebuild's video table knows
    /// those (see [`crate::plan::index::VideoTable::planned`]).
    pub produced: crate::sink::Produced,
    pub written: BTreeMap<FamilyId, u64>,
    pub ops: u64,
    /// The names of the keys written of the families asked for.
    pub names: Vec<String>,
}

/// Drains `rx`, writing each batch unless `sink` is `None` (dry run).
/// `on_batch` is told how many ops each finished batch held.
pub async fn run_writer(
    sink: Option<Sink>,
    rx: mpsc::Receiver<Vec<Op>>,
    concurrency: usize,
    cancel: Option<Arc<AtomicBool>>,
    keep_names: crate::plan::FamilySet,
    on_batch: impl Fn(u64),
) -> Result<WriteOutcome, SinkError> {
    let batches = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut outcome = WriteOutcome::default();
    let mut results = batches
        .map(|batch| {
            let (sink, cancel) = (sink.clone(), cancel.clone());
            // Each batch is a task of its own, so that building and
            // encoding the batches in flight spreads over the runtime's
            // threads; owned, so that a dropped writer stops them.
            crate::tasks::spawn(async move {
                // A stopping process starts no new batch; what is written
                // stays whole (every batch is one transaction).
                if cancel.is_some_and(|stop| stop.load(Ordering::SeqCst)) {
                    return Err(SinkError::Stopped);
                }
                // A fenced sink checks its lease and epoch on every batch.
                if let Some(sink) = &sink {
                    sink.write(&batch).await?;
                }
                Ok::<_, SinkError>(batch)
            })
        })
        .buffer_unordered(concurrency.max(1))
        .boxed();
    while let Some(joined) = results.next().await {
        let batch = match joined {
            Ok(result) => result?,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => return Err(SinkError::Stopped),
        };
        outcome.ops += batch.len() as u64;
        on_batch(batch.len() as u64);
        for op in batch {
            *outcome.written.entry(op.key.family).or_default() += 1;
            if !per_video(op.key.family) {
                outcome.produced.insert(crate::sink::digest(&op.key.text));
            }
            if keep_names.contains(op.key.family) {
                outcome.names.push(op.key.text);
            }
        }
    }
    Ok(outcome)
}

/// Whether a family's keys are one per video (its scope is the video).
pub fn per_video(family: FamilyId) -> bool {
    crate::registry::Registry::get().family(family).scope.first() == Some(&crate::registry::Scope::Video)
}
