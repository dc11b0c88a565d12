//! Lua scripts called by hash: `EVALSHA` first, and the same call by
//! text (`EVAL`) where a server does not hold the script yet (new,
//! restarted, promoted, or its script cache flushed). The text then
//! stores it there, so the calls after it go by hash again.
//!
//! Never `SCRIPT LOAD`, as the driver's `invoke_async` does: on a
//! cluster that goes to every master, so one stalled master would hold
//! the first use of a script on all of them (a lease renewal among them)
//! for a whole response timeout.

use crate::sink::RedisConn;
use std::sync::OnceLock;

/// How a call names its script: by its SHA1, or by its text. By hash,
/// Redis neither reads nor hashes the text again: for the cluster's
/// group script, 2 KB a call and about 3.5 µs of a master's CPU
/// (docs/BENCHMARKS.md, "the group script by hash").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    ByHash,
    ByText,
}

/// A script's text with its SHA1 (hex, as `EVALSHA` takes it), hashed
/// once per process.
pub struct Script {
    text: &'static str,
    sha: OnceLock<String>,
}

impl Script {
    pub const fn new(text: &'static str) -> Script {
        Script { text, sha: OnceLock::new() }
    }

    /// `EVALSHA sha` or `EVAL text`, for the caller to add `numkeys`,
    /// the keys and the arguments.
    pub fn call(&self, named: Named) -> redis::Cmd {
        let (name, script): (_, &str) = match named {
            Named::ByHash => ("EVALSHA", self.sha.get_or_init(|| redis::Script::new(self.text).get_hash().to_string())),
            Named::ByText => ("EVAL", self.text),
        };
        let mut cmd = redis::cmd(name);
        cmd.arg(script);
        cmd
    }

    /// The call by hash with `keys` and `args`.
    pub fn with<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(&self, keys: &[K], args: &[A]) -> redis::Cmd {
        let mut cmd = self.call(Named::ByHash);
        cmd.arg(keys.len()).arg(keys).arg(args);
        cmd
    }

    /// Runs `by_hash` (a call of this script by hash, as [`Script::with`]
    /// makes); a server that does not hold the script gets the same call
    /// by text. `NOSCRIPT` means the call did not run, so it runs once.
    pub async fn run<T: redis::FromRedisValue>(
        &self,
        by_hash: &redis::Cmd,
        conn: &mut RedisConn,
    ) -> redis::RedisResult<T> {
        match by_hash.query_async(conn).await {
            Err(err) if err.code() == Some("NOSCRIPT") => {
                let mut by_text = self.call(Named::ByText);
                for arg in crate::sink::cluster::cmd_args(by_hash).into_iter().skip(2) {
                    by_text.arg(arg);
                }
                by_text.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Whether a reply (of a pipeline that keeps going past errors) says the
/// server does not hold the script called: that call did not run.
pub fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(err) if err.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_by_hash_is_the_call_by_text_with_the_sha1_in_place_of_the_text() {
        static S: Script = Script::new("return ARGV[1]");
        let args = |cmd: &redis::Cmd| -> Vec<Vec<u8>> {
            crate::sink::cluster::cmd_args(cmd).into_iter().map(<[u8]>::to_vec).collect()
        };
        let by_hash = args(&S.with(&["k"], &["a"]));
        let sha = redis::Script::new("return ARGV[1]").get_hash().to_string();
        assert_eq!(by_hash, [&b"EVALSHA"[..], sha.as_bytes(), b"1", b"k", b"a"]);
        let mut by_text = S.call(Named::ByText);
        by_text.arg(1).arg("k").arg("a");
        assert_eq!(args(&by_text), [&b"EVAL"[..], b"return ARGV[1]", b"1", b"k", b"a"]);
    }
}
