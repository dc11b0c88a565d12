//! Control records under the status prefix: resume tokens, the pending
//! scopes, the heartbeat, job status and progress.

pub mod jobs;
pub mod reporter;
pub mod state;
