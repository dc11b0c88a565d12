//! Tasks owned by the future that spawned them.
//!
//! A spawned tokio task outlives the future that spawned it unless
//! someone aborts it. A rebuild dropped mid-run (a job cut short, a
//! watcher aborted by `serve`) would otherwise leave its writer and scan
//! running, still writing under the writer's epoch. [`Owned`] aborts its
//! task when dropped; awaiting it gives the task's result as a
//! `JoinHandle` does.
//!
//! Shutdown has one idiom beside it: a `tokio_util` `CancellationToken`
//! asks a task to stop (serve's side tasks, the supervised watcher, the
//! lease's "lost" signal), a `TaskTracker` waits until serve's side tasks
//! have, and every long-running entry point (`watch::run`, `serve::run`)
//! takes its shutdown as a future, which a token's `cancelled()` is.
//! `Owned` is the other half: what a task spawned stops with it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A spawned task that is aborted when this handle is dropped.
#[must_use = "dropping an Owned task aborts it"]
pub struct Owned<T>(tokio::task::JoinHandle<T>);

/// Spawns `future` as a task owned by the returned handle.
pub fn spawn<F>(future: F) -> Owned<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Owned(tokio::spawn(future))
}

impl<T> Owned<T> {
    /// Whether the task has ended: awaiting it then returns at once.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> Future for Owned<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs CPU-bound work (decoding a batch, planning it, classifying a
/// page of scanned keys) without holding up the runtime's other tasks
/// (the HTTP probes, the lease renewal): on a multi-threaded runtime the
/// worker hands its queue to another thread first. A current-thread
/// runtime (some tests) runs it in place.
pub fn off_runtime<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn awaiting_gives_the_result() {
        assert_eq!(spawn(async { 7 }).await.unwrap(), 7);
    }

    /// Dropping the handle (its owner's future was dropped) stops the
    /// task: it never gets past its next await.
    #[tokio::test(start_paused = true)]
    async fn dropping_the_handle_aborts_the_task() {
        let reached = Arc::new(AtomicBool::new(false));
        let task = {
            let reached = reached.clone();
            spawn(async move {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                reached.store(true, Ordering::SeqCst);
            })
        };
        tokio::task::yield_now().await;
        drop(task);
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(!reached.load(Ordering::SeqCst), "the task ran on after its owner was dropped");
    }
}
