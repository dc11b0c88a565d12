//! Change streams on the four collections, merged into one channel. Each
//! stream starts from its saved resume token or from a cluster time, asks
//! for `fullDocument: updateLookup`, and reports idle resume tokens so a
//! quiet collection's token still moves.

use super::model::Coll;
use mongodb::bson::{RawDocumentBuf, Timestamp};
use mongodb::change_stream::event::{ChangeStreamEvent, ResumeToken};
use mongodb::options::FullDocumentType;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long opening a stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a stream starts.
#[derive(Debug, Clone)]
pub enum StartAt {
    Token(ResumeToken),
    Time(Timestamp),
    /// From the moment the stream opens.
    Now,
}

/// What a stream task reports.
pub enum Item {
    /// An event and when this process received it.
    Event(Coll, Box<ChangeStreamEvent<RawDocumentBuf>>, Instant),
    /// No events; the stream has moved to this token.
    Idle(Coll, ResumeToken),
    Failed(Coll, mongodb::error::Error),
    /// The stream neither opened nor failed in time; it cannot be trusted
    /// to resume, so the engine starts over with a rebuild.
    Unresumable(Coll, String),
}

/// Error codes meaning the stream cannot resume from where it was:
/// ChangeStreamHistoryLost, InvalidResumeToken, ChangeStreamFatalError and
/// an unusable resume token.
pub fn is_history_lost(err: &mongodb::error::Error) -> bool {
    let code = match err.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    };
    matches!(code, Some(286 | 260 | 280 | 40647 | 40649))
}

/// Opens one stream and forwards its items until it fails or `tx` closes.
/// `opened` is told once the stream is open (dropped unsent if it fails).
pub async fn follow(
    db: mongodb::Database,
    coll: Coll,
    name: String,
    start: StartAt,
    tx: mpsc::Sender<Item>,
    opened: tokio::sync::oneshot::Sender<()>,
) {
    let collection = db.collection::<RawDocumentBuf>(&name);
    let watch =
        collection.watch().full_document(FullDocumentType::UpdateLookup).max_await_time(Duration::from_millis(500));
    let resuming = matches!(start, StartAt::Token(_));
    let open = async {
        match start {
            StartAt::Token(token) => watch.resume_after(token).await,
            StartAt::Time(time) => watch.start_at_operation_time(time).await,
            StartAt::Now => watch.await,
        }
    };
    // A server that neither opens nor refuses a stream within the limit is
    // treated like one that refused the token: SecantusDB has been seen to
    // hang on an unusable resume token instead of answering 40647.
    let stream_opened = match tokio::time::timeout(OPEN_TIMEOUT, open).await {
        Ok(result) => result,
        Err(_) => {
            let what = if resuming { " from its resume token" } else { "" };
            let reason = format!("change stream on {name} did not open{what} within {}s", OPEN_TIMEOUT.as_secs());
            let _ = tx.send(Item::Unresumable(coll, reason)).await;
            return;
        }
    };
    let mut stream = match stream_opened {
        Ok(stream) => {
            let _ = opened.send(());
            stream
        }
        Err(err) => {
            let _ = tx.send(Item::Failed(coll, err)).await;
            return;
        }
    };
    let mut last_idle = Instant::now() - Duration::from_secs(10);
    loop {
        match stream.next_if_any().await {
            Ok(Some(event)) => {
                tracing::trace!(collection = %name, op = ?event.operation_type, "change event");
                if tx.send(Item::Event(coll, Box::new(event), Instant::now())).await.is_err() {
                    return;
                }
            }
            Ok(None) => {
                tracing::trace!(collection = %name, "change stream idle");
                if last_idle.elapsed() >= Duration::from_secs(1) {
                    last_idle = Instant::now();
                    let token = stream.resume_token();
                    if let Some(token) = token
                        && tx.send(Item::Idle(coll, token)).await.is_err()
                    {
                        return;
                    }
                }
                if !stream.is_alive() {
                    let err = mongodb::error::Error::custom(format!("change stream on {name} closed"));
                    let _ = tx.send(Item::Failed(coll, err)).await;
                    return;
                }
            }
            Err(err) => {
                tracing::debug!(collection = %name, error = %err, "change stream error");
                let _ = tx.send(Item::Failed(coll, err)).await;
                return;
            }
        }
    }
}
