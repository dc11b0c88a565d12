//! The MongoDB edge: connects, streams raw documents with tuned batch
//! sizes, and says what went wrong in operator terms.

mod chunk;
pub mod ranges;

pub use chunk::RawChunk;

use crate::config::{MongoSettings, redact_url, scrub};
use futures::TryStreamExt;
use mongodb::bson::{Document, RawDocumentBuf, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Cursor, Database};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot connect to MongoDB at {uri}: {reason} (check MONGODB_URI and that the server is running)")]
    Connect {
        /// The URI, redacted.
        uri: String,
        /// The driver's message, with the URI's secrets hidden (the error
        /// itself is kept for retry decisions but never printed).
        reason: String,
        cause: Box<mongodb::error::Error>,
    },
    #[error("reading MongoDB collection {collection} failed: {source}")]
    Read {
        collection: String,
        #[source]
        source: mongodb::error::Error,
    },
    #[error("reading MongoDB collection {collection} failed: the server's reply is malformed ({reason})")]
    Reply { collection: String, reason: &'static str },
    #[error(
        "reading MongoDB collection {collection} failed: no answer within {seconds}s (a stalled server or network; \
         check that MongoDB answers, or raise CACHEWRIGHT_MONGODB_TIMEOUT_SECONDS for a slow one)"
    )]
    Stalled { collection: String, seconds: u64 },
}

/// Server error codes a restart, a fail-over or a network cut produces:
/// the operation may succeed when the whole run is done again.
///
/// HostUnreachable (6), HostNotFound (7), CursorNotFound (43: the server
/// that held the cursor restarted), NetworkTimeout (89), ShutdownInProgress
/// (91), PrimarySteppedDown (189), NotWritablePrimary (10107),
/// InterruptedAtShutdown (11600), InterruptedDueToReplStateChange (11602),
/// NotPrimaryNoSecondaryOk (13435), NotPrimaryOrSecondary (13436),
/// SocketException (9001).
pub const RESTART_CODES: [i32; 12] = [6, 7, 43, 89, 91, 189, 9001, 10107, 11600, 11602, 13435, 13436];

/// Whether a MongoDB error may pass by itself (network trouble, restarts,
/// elections).
pub fn is_retriable(err: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    let code = match err.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    };
    matches!(
        err.kind.as_ref(),
        ErrorKind::Io(_) | ErrorKind::ServerSelection { .. } | ErrorKind::ConnectionPoolCleared { .. }
    ) || code.is_some_and(|c| RESTART_CODES.contains(&c))
        || err.contains_label(mongodb::error::RETRYABLE_ERROR)
        || err.contains_label("RetryableWriteError")
        || err.contains_label("ResumableChangeStreamError")
}

impl SourceError {
    /// Whether trying again may help (network trouble, restarts, elections).
    pub fn is_retriable(&self) -> bool {
        let source = match self {
            SourceError::Connect { cause, .. } => cause,
            SourceError::Read { source, .. } => source,
            // What the server sent would be sent again.
            SourceError::Reply { .. } => return false,
            // The next try gets a new connection.
            SourceError::Stalled { .. } => return true,
        };
        is_retriable(source)
    }
}

/// A connected MongoDB database.
#[derive(Clone)]
pub struct Source {
    db: Database,
    /// How long one read may go unanswered. The driver has no socket
    /// timeout, and a server that stops answering without closing the
    /// connection (a paused process, a network dropping packets) would
    /// otherwise hold a run, and the lease it keeps renewing, forever.
    read_timeout: Duration,
}

fn connect_error(settings: &MongoSettings, cause: mongodb::error::Error) -> SourceError {
    SourceError::Connect {
        uri: redact_url(&settings.uri),
        reason: scrub(&cause.to_string(), &settings.uri),
        cause: Box::new(cause),
    }
}

/// Parses `MONGODB_URI` into driver options (no IO but SRV lookups).
pub async fn client_options(settings: &MongoSettings) -> Result<ClientOptions, SourceError> {
    ClientOptions::parse(&settings.uri).await.map_err(|cause| connect_error(settings, cause))
}

impl Source {
    /// Connects and pings, so a wrong address fails here, clearly.
    pub async fn connect(settings: &MongoSettings) -> Result<Source, SourceError> {
        let connect_err = |cause| connect_error(settings, cause);
        let mut options = client_options(settings).await?;
        options.app_name = Some("cachewright".into());
        options.server_selection_timeout.get_or_insert(Duration::from_secs(10));
        options.connect_timeout.get_or_insert(Duration::from_secs(5));
        let client = Client::with_options(options).map_err(connect_err)?;
        let db = client.database(&settings.db);
        db.run_command(doc! { "ping": 1 }).await.map_err(connect_err)?;
        Ok(Source { db, read_timeout: settings.read_timeout })
    }

    /// Runs one read of `collection` within the read timeout.
    pub async fn bounded<T>(
        &self,
        collection: &str,
        read: impl std::future::IntoFuture<Output = Result<T, mongodb::error::Error>>,
    ) -> Result<T, SourceError> {
        match tokio::time::timeout(self.read_timeout, read.into_future()).await {
            Ok(result) => result.map_err(|source| read_error(collection, source)),
            Err(_) => {
                Err(SourceError::Stalled { collection: collection.to_string(), seconds: self.read_timeout.as_secs() })
            }
        }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Opens a cursor over the documents `filter` matches, in natural
    /// order, as raw BSON (decoding happens in the planner's threads, not
    /// the driver's).
    pub async fn scan(
        &self,
        collection: &str,
        filter: Document,
        batch_size: u32,
    ) -> Result<Cursor<RawDocumentBuf>, SourceError> {
        self.bounded(collection, self.db.collection::<RawDocumentBuf>(collection).find(filter).batch_size(batch_size))
            .await
    }

    /// Reads a whole (small) collection.
    pub async fn read_all(&self, collection: &str, batch_size: u32) -> Result<Vec<RawDocumentBuf>, SourceError> {
        let mut cursor = self.scan(collection, doc! {}, batch_size).await?;
        let mut all = Vec::new();
        while let Some(doc) = self.bounded(collection, cursor.try_next()).await? {
            all.push(doc);
        }
        Ok(all)
    }

    /// Decides how to read the video collection with `cursors` cursors
    /// (see [`ranges`]): one in natural order when asked for one, when
    /// the collection holds no ObjectId to cut, or when a string `_id`
    /// could write the same id as an ObjectId; else ranges of ObjectIds
    /// cut evenly between the smallest and the largest.
    pub async fn plan_video_read(&self, collection: &str, cursors: usize) -> Result<ranges::VideoRead, SourceError> {
        use ranges::VideoRead;
        if cursors < 2 {
            return Ok(VideoRead::Natural("one cursor configured"));
        }
        let coll = self.db.collection::<Document>(collection);
        let lookalike = coll.find_one(ranges::lookalike_filter()).projection(doc! { "_id": 1 });
        let end = |direction: i32| {
            coll.find_one(doc! { "_id": { "$type": "objectId" } })
                .sort(doc! { "_id": direction })
                .projection(doc! { "_id": 1 })
        };
        let (lookalike, lo, hi) = self
            .bounded(collection, async {
                tokio::try_join!(lookalike.into_future(), end(1).into_future(), end(-1).into_future())
            })
            .await?;
        if lookalike.is_some() {
            return Ok(VideoRead::Natural("a string _id looks like an ObjectId, so natural order decides repeats"));
        }
        let oid = |d: Option<Document>| d.and_then(|d| d.get_object_id("_id").ok());
        let (Some(lo), Some(hi)) = (oid(lo), oid(hi)) else {
            return Ok(VideoRead::Natural("no ObjectId _id to cut into ranges"));
        };
        Ok(VideoRead::Ranges(ranges::range_filters(&ranges::cut_points(&lo, &hi, cursors))))
    }

    /// Reads the video collection as `plan` says into one stream of
    /// chunks (see [`Source::read_chunks`]): the ObjectId ranges each in
    /// its own task, side by side, then every other `_id`.
    pub async fn read_video_chunks(
        &self,
        collection: &str,
        plan: &ranges::VideoRead,
        batch_size: u32,
        chunk: usize,
        tx: tokio::sync::mpsc::Sender<RawChunk>,
    ) -> Result<(), SourceError> {
        let ranges::VideoRead::Ranges(ranges) = plan else {
            return self.read_chunks(collection, doc! {}, batch_size, chunk, tx).await;
        };
        let readers = ranges.iter().map(|filter| {
            let (source, collection, filter, tx) = (self.clone(), collection.to_string(), filter.clone(), tx.clone());
            let reader =
                crate::tasks::spawn(
                    async move { source.read_chunks(&collection, filter, batch_size, chunk, tx).await },
                );
            async move { reader.await.unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic())) }
        });
        // The first error ends the read: the readers still going are
        // aborted as their handles drop.
        futures::future::try_join_all(readers).await?;
        self.read_chunks(collection, ranges::others_filter(), batch_size, chunk, tx).await
    }

    /// Reads the documents `filter` matches in chunks of at least `chunk`
    /// (whole cursor replies), handed to `tx` as they fill, so the reader
    /// never holds the whole collection. Stops early, without error, when
    /// `tx` is closed.
    pub async fn read_chunks(
        &self,
        collection: &str,
        filter: Document,
        batch_size: u32,
        chunk: usize,
        tx: tokio::sync::mpsc::Sender<RawChunk>,
    ) -> Result<(), SourceError> {
        let coll = self.db.collection::<RawDocumentBuf>(collection);
        let mut cursor = self.bounded(collection, coll.find(filter).batch_size(batch_size).batch()).await?;
        let mut filling = RawChunk::default();
        while let Some(reply) = self.bounded(collection, cursor.try_next()).await? {
            filling.push(reply, collection)?;
            if filling.len() >= chunk && tx.send(std::mem::take(&mut filling)).await.is_err() {
                return Ok(());
            }
        }
        if !filling.is_empty() {
            let _ = tx.send(filling).await;
        }
        Ok(())
    }

    /// Reads the four collections whole and concurrently: channels,
    /// categories, tags, videos (with the configured cursors, so not
    /// always in natural order; see [`ranges`]).
    pub async fn read_four(&self, settings: &MongoSettings) -> Result<[Vec<RawDocumentBuf>; 4], SourceError> {
        let (c, batch) = (&settings.collections, settings.read_batch_size);
        let videos = async {
            let plan = self.plan_video_read(&c.video, settings.read_cursors).await?;
            let (tx, mut rx) = tokio::sync::mpsc::channel::<RawChunk>(plan.cursors());
            let gather = async {
                let mut all = Vec::new();
                while let Some(chunk) = rx.recv().await {
                    all.extend(chunk.docs().into_iter().map(ToOwned::to_owned));
                }
                all
            };
            let (read, all) = tokio::join!(self.read_video_chunks(&c.video, &plan, batch, 4096, tx), gather);
            read.map(|()| all)
        };
        let (channels, categories, tags, videos) = tokio::try_join!(
            self.read_all(&c.channel, batch),
            self.read_all(&c.category, batch),
            self.read_all(&c.tag, batch),
            videos,
        )?;
        Ok([channels, categories, tags, videos])
    }

    /// The collection's size from its metadata, for progress bars.
    pub async fn estimated_count(&self, collection: &str) -> u64 {
        let coll = self.db.collection::<RawDocumentBuf>(collection);
        self.bounded(collection, coll.estimated_document_count()).await.unwrap_or(0)
    }

    /// MongoDB's current cluster time (the `operationTime` of a ping): a
    /// change stream started at it misses nothing read after it.
    pub async fn cluster_time(&self) -> Result<mongodb::bson::Timestamp, SourceError> {
        let reply = self.bounded("(ping)", self.db.run_command(doc! { "ping": 1 })).await?;
        Ok(reply.get_timestamp("operationTime").unwrap_or(mongodb::bson::Timestamp { time: 0, increment: 0 }))
    }
}

fn read_error(collection: &str, source: mongodb::error::Error) -> SourceError {
    SourceError::Read { collection: collection.to_string(), source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::error::{CommandError, Error, ErrorKind};

    fn command_error(code: i32) -> Error {
        let json = serde_json::json!({ "code": code, "codeName": "X", "errmsg": "m" });
        let command: CommandError = serde_json::from_value(json).expect("command error shape");
        Error::from(ErrorKind::Command(command))
    }

    #[test]
    fn restart_and_failover_codes_are_retriable() {
        for code in RESTART_CODES {
            assert!(is_retriable(&command_error(code)), "code {code}");
        }
        assert!(!is_retriable(&command_error(2)), "BadValue is not retriable");
        assert!(!is_retriable(&command_error(13)), "Unauthorized is not retriable");
        let io = Error::from(ErrorKind::Io(std::sync::Arc::new(std::io::ErrorKind::ConnectionReset.into())));
        assert!(is_retriable(&io));
    }
}
