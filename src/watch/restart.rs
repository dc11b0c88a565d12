//! What the watcher does after its engine stopped: a pure decision from
//! how it stopped and where its streams stand, so every path is tested
//! without servers. The leader loop (`watch::run_fenced`) carries it out.

use super::WatchError;
use super::stream::StartAt;

/// Why the engine stopped streaming, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub enum Restart {
    /// Streams failed; reopen them from the saved tokens.
    Reopen,
    /// The streams cannot resume: rebuild and start from a cluster time.
    Rebuild(String),
}

/// What to do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Shutdown: keep the state for the next start, and return.
    Stop,
    /// Reopen the streams from the saved tokens after the backoff. `failed`
    /// says why a batch was taken back (the replay applies it again).
    Reopen { failed: Option<String> },
    /// Rebuild, then stream from a cluster time.
    Rebuild(String),
}

/// Decides from the engine's outcome (or the load's, or the rebuild's
/// before it) and the streams' start points.
/// Redis and MongoDB trouble mid-batch reopens from the saved tokens (the
/// batch was taken back, and nothing was saved for it), as does a key
/// that drifted from what the watcher knew (its replay writes the key
/// whole). A stream that never reached a token cannot be reopened
/// without a gap, so that reopen becomes a rebuild. Other errors end the
/// watcher.
pub fn decide(outcome: Result<Option<Restart>, WatchError>, starts: &[StartAt]) -> Result<Next, WatchError> {
    let failed = match outcome {
        Ok(None) => return Ok(Next::Stop),
        Ok(Some(Restart::Rebuild(reason))) => return Ok(Next::Rebuild(reason)),
        Ok(Some(Restart::Reopen)) => None,
        Err(WatchError::Sink(err)) if err.is_drift() => {
            Some(format!("a key drifted from what the watcher knew (it is rewritten whole): {err}"))
        }
        Err(WatchError::Sink(err)) if err.is_retriable() => Some(format!("redis failed while applying changes: {err}")),
        Err(WatchError::Source(err)) if err.is_retriable() => {
            Some(format!("mongodb failed while applying changes: {err}"))
        }
        // The rebuild ran out of its own attempts on trouble that passes
        // (a server restarting): the watcher goes on trying, paced by the
        // streams' reopening, rather than ending.
        Err(WatchError::Rebuild(err)) if err.is_retriable() => Some(format!("the rebuild failed: {err}")),
        Err(err) => return Err(err),
    };
    if starts.iter().any(|s| matches!(s, StartAt::Now)) {
        return Ok(Next::Rebuild("a change stream failed before its first resume token".into()));
    }
    Ok(Next::Reopen { failed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rebuild::RunError;
    use crate::sink::SinkError;

    fn token() -> StartAt {
        StartAt::Time(mongodb::bson::Timestamp { time: 1, increment: 1 })
    }

    fn redis_error(kind: redis::ErrorKind, text: &'static str) -> WatchError {
        WatchError::Sink(SinkError::Write { attempts: 1, source: redis::RedisError::from((kind, text)) })
    }

    #[test]
    fn a_shutdown_stops_and_a_lost_history_rebuilds() {
        let starts = [token()];
        assert_eq!(decide(Ok(None), &starts).unwrap(), Next::Stop);
        let rebuild = decide(Ok(Some(Restart::Rebuild("history lost".into()))), &starts).unwrap();
        assert_eq!(rebuild, Next::Rebuild("history lost".into()));
    }

    #[test]
    fn passing_trouble_reopens_from_the_tokens_and_says_which_batch_failed() {
        let starts = [token(), token()];
        assert_eq!(decide(Ok(Some(Restart::Reopen)), &starts).unwrap(), Next::Reopen { failed: None });
        let dropped = redis_error(redis::ErrorKind::Io, "connection reset");
        assert!(
            matches!(decide(Err(dropped), &starts).unwrap(), Next::Reopen { failed: Some(why) } if why.contains("redis"))
        );
        let drifted = WatchError::Sink(SinkError::Write {
            attempts: 1,
            source: redis::RedisError::from((redis::ErrorKind::Extension, "DRIFTED", "app:k holds 3".to_string())),
        });
        assert!(
            matches!(decide(Err(drifted), &starts).unwrap(), Next::Reopen { failed: Some(why) } if why.contains("drifted"))
        );
    }

    #[test]
    fn a_stream_without_a_token_rebuilds_instead_of_reopening_with_a_gap() {
        let starts = [token(), StartAt::Now];
        assert!(
            matches!(decide(Ok(Some(Restart::Reopen)), &starts).unwrap(), Next::Rebuild(why) if why.contains("first resume token"))
        );
    }

    #[test]
    fn a_rebuild_that_failed_on_passing_trouble_is_tried_again() {
        let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let passing = WatchError::Rebuild(RunError::Sink(SinkError::Write { attempts: 3, source: refused }));
        assert!(
            matches!(decide(Err(passing), &[StartAt::Now]).unwrap(), Next::Rebuild(r) if r.contains("before its first"))
        );
        let refused = WatchError::Rebuild(RunError::Internal("a planning task panicked".into()));
        assert!(decide(Err(refused), &[StartAt::Now]).is_err(), "a rebuild that cannot pass ends the watcher");
    }

    #[test]
    fn other_errors_end_the_watcher() {
        let refused = WatchError::Sink(SinkError::LeaseLost);
        assert!(matches!(decide(Err(refused), &[token()]), Err(WatchError::Sink(SinkError::LeaseLost))));
        let script = redis_error(redis::ErrorKind::Client, "bad script");
        assert!(decide(Err(script), &[token()]).is_err());
    }
}
