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

/// How long a `ping` may take to show the server answers, after a stream
/// did not open in time.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one read of an open stream may take. The server answers each
/// `getMore` within the stream's await time (500 ms) even when nothing
/// changed, so silence this long means the connection or the server is
/// stalled (a paused process, a network that drops packets without a
/// reset): the stream is reopened from its token rather than waited on
/// forever.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

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
    /// A video's full document comes decoded too (see [`super::model::decode`]).
    Event(Coll, Box<ChangeStreamEvent<RawDocumentBuf>>, Instant, Option<Box<super::model::Decoded>>),
    /// No events; the stream has moved to this token.
    Idle(Coll, ResumeToken),
    Failed(Coll, mongodb::error::Error),
    /// The stream neither opened nor failed in time; it cannot be trusted
    /// to resume, so the engine starts over with a rebuild.
    Unresumable(Coll, String),
    /// An event the stream could not deliver whole (too large, not
    /// decodable): the document's `_id`, the event's token, and why. The
    /// engine reads the document again by its id.
    Poison(Coll, mongodb::bson::Bson, ResumeToken, String),
}

/// Whether a stream error comes from the connection or the server's state
/// (reopen from the token), rather than from the event itself.
fn is_transient(err: &mongodb::error::Error) -> bool {
    crate::source::is_retriable(err) || is_history_lost(err)
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

/// Why an event could not be used, as a fixed label: the driver's text
/// may quote the document, and every distinct text would become a new
/// metrics label. The text itself goes to the log.
pub fn poison_reason(err: &mongodb::error::Error) -> &'static str {
    use mongodb::error::ErrorKind;
    match err.kind.as_ref() {
        ErrorKind::Command(c) if c.code == 10334 || c.code_name.contains("TooLarge") => "event too large",
        ErrorKind::Command(_) => "event refused by the server",
        ErrorKind::BsonDeserialization(_) | ErrorKind::InvalidResponse { .. } => "event not decodable",
        _ => "event unusable",
    }
}

/// Opens one stream and forwards its items until it fails or `tx` closes.
/// `opened` is told once the stream is open (dropped unsent if it fails).
pub async fn follow(
    source: crate::source::Source,
    coll: Coll,
    name: String,
    start: StartAt,
    tx: mpsc::Sender<Item>,
    opened: tokio::sync::oneshot::Sender<()>,
) {
    let collection = source.database().collection::<RawDocumentBuf>(&name);
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
            // Only a server that answers can be said to refuse the token:
            // one that is down or stalled (a restart slower than the
            // limit) is reopened from the same token later, not rebuilt.
            let item = match tokio::time::timeout(PING_TIMEOUT, source.cluster_time()).await {
                Ok(Ok(_)) => Item::Unresumable(coll, reason),
                silent => {
                    let why = match silent {
                        Ok(Err(err)) => err.to_string(),
                        _ => format!("no answer to a ping within {}s", PING_TIMEOUT.as_secs()),
                    };
                    Item::Failed(coll, mongodb::error::Error::custom(format!("{reason}; then {why}")))
                }
            };
            let _ = tx.send(item).await;
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
    // No idle report right after opening: the first empty answer may be
    // the stream's initial batch, not a sign that it has caught up (the
    // watcher reads "idle" as "nothing older left to deliver").
    let mut last_idle = Instant::now();
    loop {
        let Ok(next) = tokio::time::timeout(READ_TIMEOUT, stream.next_if_any()).await else {
            let why = format!("change stream on {name} got no answer within {}s", READ_TIMEOUT.as_secs());
            let _ = tx.send(Item::Failed(coll, mongodb::error::Error::custom(why))).await;
            return;
        };
        match next {
            Ok(Some(event)) => {
                tracing::trace!(collection = %name, op = ?event.operation_type, "change event");
                let arrived = Instant::now();
                // Decoded here, beside the engine's writes, not in the
                // batch's serial path. Short: one document.
                let decoded = super::model::decode_on_arrival(coll, event.full_document.as_ref());
                if tx.send(Item::Event(coll, Box::new(event), arrived, decoded)).await.is_err() {
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
            Err(err) if is_transient(&err) => {
                tracing::debug!(collection = %name, error = %err, "change stream error");
                let _ = tx.send(Item::Failed(coll, err)).await;
                return;
            }
            Err(err) => {
                // The next event cannot be delivered: read it once more
                // without its document and its update description, pass
                // on its id and token, and go on after it. Never loop on
                // one token: if even that fails, the engine rebuilds.
                tracing::warn!(collection = %name, error = %err, "change event unusable");
                let reason = poison_reason(&err).to_string();
                let after = stream.resume_token();
                let item = match skip_one(&collection, after.clone(), &reason).await {
                    Ok((id, token)) => {
                        let next = StartAt::Token(token.clone());
                        let _ = tx.send(Item::Poison(coll, id, token, reason)).await;
                        next
                    }
                    Err(why) => {
                        let _ = tx.send(Item::Unresumable(coll, why)).await;
                        return;
                    }
                };
                // Follow on from the skipped event with full documents.
                let resumed = match item {
                    StartAt::Token(token) => {
                        collection
                            .watch()
                            .full_document(FullDocumentType::UpdateLookup)
                            .max_await_time(Duration::from_millis(500))
                            .resume_after(token)
                            .await
                    }
                    _ => unreachable!("skip_one gives a token"),
                };
                stream = match resumed {
                    Ok(stream) => stream,
                    Err(err) => {
                        let _ = tx.send(Item::Failed(coll, err)).await;
                        return;
                    }
                };
            }
        }
    }
}

/// Reads the one event after `after` with only its identity (no document,
/// no update description), so that an event too large or not decodable
/// whole still gives its document's `_id` and its resume token.
async fn skip_one(
    collection: &mongodb::Collection<RawDocumentBuf>,
    after: Option<ResumeToken>,
    reason: &str,
) -> Result<(mongodb::bson::Bson, ResumeToken), String> {
    use mongodb::bson::doc;
    let Some(after) = after else {
        return Err(format!("a change event could not be used ({reason}) before the stream had a resume token"));
    };
    let project = doc! { "$project": { "fullDocument": 0, "updateDescription": 0, "fullDocumentBeforeChange": 0 } };
    let opened = collection.watch().pipeline([project]).resume_after(after).await;
    let mut slim =
        opened.map_err(|e| format!("reopening to skip an unusable event failed: {e}"))?.with_type::<RawDocumentBuf>();
    let deadline = Instant::now() + OPEN_TIMEOUT;
    while Instant::now() < deadline {
        // Bounded like every read: a silent server ends the skip too.
        let Ok(read) =
            tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), slim.next_if_any()).await
        else {
            break;
        };
        let event =
            read.map_err(|e| format!("an unusable change event could not be skipped: {e} (first: {reason})"))?;
        let Some(event) = event else { continue };
        let token = event
            .get("_id")
            .ok()
            .flatten()
            .and_then(|t| t.to_raw_bson().try_into().ok())
            .and_then(|b: mongodb::bson::Bson| mongodb::bson::from_bson::<ResumeToken>(b).ok())
            .ok_or_else(|| "a skipped change event had no resume token".to_string())?;
        let id = event
            .get_document("documentKey")
            .ok()
            .and_then(|k| k.get("_id").ok().flatten())
            .and_then(|v| v.to_raw_bson().try_into().ok())
            .ok_or_else(|| format!("an unusable change event names no document ({reason})"))?;
        return Ok((id, token));
    }
    Err(format!("the unusable change event did not come back within {}s ({reason})", OPEN_TIMEOUT.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::error::{CommandError, Error, ErrorKind};

    fn command_error(code: i32) -> Error {
        let json = serde_json::json!({ "code": code, "codeName": "X", "errmsg": "m" });
        Error::from(ErrorKind::Command(serde_json::from_value::<CommandError>(json).expect("shape")))
    }

    #[test]
    fn connection_trouble_reopens_and_a_bad_event_is_skipped() {
        // Network and restarts: reopen from the token.
        assert!(is_transient(&Error::from(ErrorKind::Io(std::sync::Arc::new(
            std::io::ErrorKind::ConnectionReset.into()
        )))));
        assert!(is_transient(&command_error(11600)));
        // Lost history: rebuild (also not an event problem).
        assert!(is_transient(&command_error(286)));
        // The event itself: too large, or not decodable.
        assert!(!is_transient(&command_error(10334)));
        let undecodable: mongodb::bson::de::Error =
            mongodb::bson::from_slice::<mongodb::bson::Document>(&[5, 0, 0, 0, 1]).expect_err("bad bytes");
        assert!(!is_transient(&Error::from(undecodable)));
    }

    #[test]
    fn unusable_events_get_a_fixed_reason_never_the_driver_text() {
        assert_eq!(poison_reason(&command_error(10334)), "event too large");
        assert_eq!(poison_reason(&command_error(2)), "event refused by the server");
        let undecodable: mongodb::bson::de::Error =
            mongodb::bson::from_slice::<mongodb::bson::Document>(&[5, 0, 0, 0, 1]).expect_err("bad bytes");
        assert_eq!(poison_reason(&Error::from(undecodable)), "event not decodable");
    }
}
