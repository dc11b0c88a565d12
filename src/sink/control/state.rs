//! Service state kept in Redis beside the data: change-stream resume
//! tokens and the heartbeat. Writes go through [`Sink::send`], so a
//! fenced sink writes them only while it holds the writer lease.

use crate::keys::status::StatusKeys;
use crate::sink::{Sink, SinkError, Unit};

impl Sink {
    /// The saved resume tokens (JSON text) of `collections`, in order;
    /// `None` unless every one is saved.
    pub async fn load_tokens(&self, keys: &StatusKeys, collections: &[&str]) -> Result<Option<Vec<String>>, SinkError> {
        let mut pipe = redis::pipe();
        for name in collections {
            pipe.cmd("GET").arg(keys.cdc_resume(name));
        }
        let mut conn = self.connection();
        let values: Vec<Option<String>> =
            pipe.query_async(&mut conn).await.map_err(|source| SinkError::Scan { attempts: 1, source })?;
        Ok(values.into_iter().collect())
    }

    /// Applies the watcher's last run of changes of a batch and saves its
    /// resume tokens in one transaction: the tokens move exactly when
    /// those writes land (the batch's other runs landed before). With
    /// `clear_pending`, the pending scopes are cleared in the same
    /// transaction. A cluster cannot hold these keys in one
    /// transaction: there the writes land first, then the tokens, then the
    /// pending scopes are cleared; a crash in between replays events or
    /// redoes scopes, both idempotent.
    pub async fn apply_changes_and_save_tokens(
        &self,
        changes: &[crate::plan::Change],
        keys: &StatusKeys,
        tokens: &[(&str, String)],
        clear_pending: bool,
    ) -> Result<(), SinkError> {
        if changes.is_empty() && tokens.is_empty() && !clear_pending {
            return Ok(());
        }
        let saves = |unit: &mut Unit| {
            for (name, text) in tokens {
                unit.cmd("SET", keys.cdc_resume(name)).arg(text);
            }
        };
        let clear = |unit: &mut Unit| {
            if clear_pending {
                unit.cmd("DEL", keys.cdc_pending());
            }
        };
        if !self.topology().spans_slots() {
            self.apply_changes(changes).await?;
            self.send_with(saves).await?;
            return self.send_with(clear).await;
        }
        // Keys written in steps land before the tokens move, like the
        // batch's other runs.
        let rest = self.write_staged_changes(changes).await?;
        self.send_with(|unit| {
            self.add_changes(unit, rest);
            saves(unit);
            clear(unit);
        })
        .await
    }

    /// Records scopes a batch is about to write (see `cdc:pending`). The
    /// members go as `SADD`s that each fit the transaction budget (a
    /// script's arguments stay far below what Lua can unpack), one atomic
    /// step each; all of them land before any of the batch's writes.
    pub async fn add_pending(&self, keys: &StatusKeys, members: &[String]) -> Result<(), SinkError> {
        self.edit_set("SADD", &keys.cdc_pending(), members).await
    }

    /// Records keys the watcher could not write because no master covers
    /// their slot (`cdc:deferred`), before the writes that skip them.
    pub async fn add_deferred(&self, keys: &StatusKeys, members: &[String]) -> Result<(), SinkError> {
        self.edit_set("SADD", &keys.cdc_deferred(), members).await
    }

    /// Forgets deferred keys once they are written.
    pub async fn remove_deferred(&self, keys: &StatusKeys, members: &[String]) -> Result<(), SinkError> {
        self.edit_set("SREM", &keys.cdc_deferred(), members).await
    }

    /// `SADD` or `SREM` of many members of one control set, as commands
    /// that each fit the transaction budget (one key: one unit's share,
    /// on a cluster too, where a script's arguments then stay far below
    /// what Lua can unpack).
    async fn edit_set(&self, command: &str, set: &str, members: &[String]) -> Result<(), SinkError> {
        for chunk in pending_chunks(members, self.unit_cost) {
            self.send_with(|unit| {
                unit.cmd(command, set).arg(chunk);
            })
            .await?;
        }
        Ok(())
    }

    /// Forgets the resume tokens of `collections`.
    pub async fn clear_tokens(&self, keys: &StatusKeys, collections: &[&str]) -> Result<(), SinkError> {
        let names: Vec<String> = collections.iter().map(|c| keys.cdc_resume(c)).collect();
        self.unlink(&names).await
    }

    /// Writes the heartbeat `health:current` (60 s TTL).
    pub async fn heartbeat(&self, keys: &StatusKeys, body: &serde_json::Value) -> Result<(), SinkError> {
        // Not while its slot has no master: the writer would wait out the
        // retries of a beat that cannot land.
        if !self.covers(keys.health().as_bytes()) {
            return Ok(());
        }
        self.send_with(|unit| {
            unit.cmd("SET", keys.health()).arg(body.to_string()).arg("EX").arg(60);
        })
        .await
    }

    /// `INFO` of its default sections (`memory` and `stats` among them)
    /// in one reply; on a cluster, every master's numeric fields summed
    /// (memory, hits and misses of the whole cluster). Not a list of
    /// sections: Redis before 7.0 refuses more than one.
    pub async fn info(&self) -> Result<String, SinkError> {
        let infos = self.topology().infos(self, &[]).await?;
        Ok(merged(infos))
    }

    /// A field of `INFO section` (e.g. `used_memory` of `memory`).
    pub async fn info_field(&self, section: &str, field: &str) -> Result<Option<String>, SinkError> {
        let info = merged(self.topology().infos(self, &[section]).await?);
        Ok(info_value(&info, field).map(str::to_string))
    }
}

/// One master's INFO as it is; several masters' summed.
fn merged(mut infos: Vec<(String, String)>) -> String {
    if infos.len() == 1 {
        return infos.pop().map(|(_, info)| info).unwrap_or_default();
    }
    crate::sink::cluster_io::sum_info(&infos.into_iter().map(|(_, info)| info).collect::<Vec<_>>())
}

/// `members` cut, in order, into chunks whose `SADD` costs at most
/// `max_cost` (see [`crate::plan::Value::cost`]); each holds at least one.
fn pending_chunks(members: &[String], max_cost: usize) -> Vec<&[String]> {
    crate::plan::TxBudget { max_keys: usize::MAX, max_cost }.cut_by(members, |m| crate::plan::set_member_cost(m))
}

/// The value of `field` in an INFO reply.
pub fn info_value<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

/// What Redis holds of some videos: their `video:categories` members and
/// their `video:detail` payloads, by written id.
pub type VideoMemberships =
    (std::collections::HashMap<String, std::collections::BTreeSet<String>>, std::collections::HashMap<String, String>);

impl Sink {
    /// The sizes of collection keys, each read with its command (`LLEN`,
    /// `ZCARD`, …): a missing key reads 0.
    pub async fn sizes(&self, keys: &[(String, &'static str)]) -> Result<Vec<usize>, SinkError> {
        let mut sizes = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(1000) {
            let mut pipe = redis::pipe();
            for (key, command) in chunk {
                pipe.cmd(command).arg(key);
            }
            let mut conn = self.connection();
            let found: Vec<usize> =
                pipe.query_async(&mut conn).await.map_err(|source| SinkError::Scan { attempts: 1, source })?;
            sizes.extend(found);
        }
        Ok(sizes)
    }

    /// Reads the `video:categories` and `video:detail` keys of `ids` in
    /// one round trip.
    pub async fn video_memberships<'a>(
        &self,
        keys: &crate::keys::Keys,
        ids: impl Iterator<Item = &'a String>,
    ) -> Result<VideoMemberships, SinkError> {
        use crate::registry::FamilyId;
        let ids: Vec<&String> = ids.collect();
        let (mut categories, mut details) = (std::collections::HashMap::new(), std::collections::HashMap::new());
        if ids.is_empty() {
            return Ok((categories, details));
        }
        // A key in a slot no master covers reads as absent: the watcher
        // then goes by its own state, and the key is deferred anyway.
        let mut pipe = redis::pipe();
        for w in &ids {
            for (family, command) in [(FamilyId::VideoCategories, "SMEMBERS"), (FamilyId::VideoDetail, "GET")] {
                let key = keys.key(family, &[w]).text;
                match self.covers(key.as_bytes()) {
                    true => pipe.cmd(command).arg(key),
                    false => pipe.cmd("ECHO").arg(""),
                };
            }
        }
        let mut conn = self.connection();
        let replies: Vec<redis::Value> =
            pipe.query_async(&mut conn).await.map_err(|source| SinkError::Scan { attempts: 1, source })?;
        // Taken whole, not cloned: a batch reads thousands of details.
        let mut replies = replies.into_iter();
        for w in &ids {
            let (Some(set), Some(detail)) = (replies.next(), replies.next()) else { break };
            let members: Vec<String> = redis::from_redis_value(set).unwrap_or_default();
            let members: std::collections::BTreeSet<String> =
                members.into_iter().filter(|c| crate::model::id::is_usable_id(c)).collect();
            if !members.is_empty() {
                categories.insert((*w).clone(), members);
            }
            if let Ok(Some(detail)) = redis::from_redis_value::<Option<String>>(detail) {
                details.insert((*w).clone(), detail);
            }
        }
        Ok((categories, details))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pending_members_are_cut_within_the_budget() {
        let members: Vec<String> = (0..2_000).map(|i| format!("c:{i:024}")).collect();
        let chunks = super::pending_chunks(&members, 30_000);
        assert!(chunks.len() > 1);
        assert_eq!(chunks.concat(), members, "every member once, in order");
        for chunk in &chunks {
            let cost: usize = chunk.iter().map(|m| crate::plan::set_member_cost(m)).sum();
            assert!(cost <= 30_000 && chunk.len() < 8_000, "{} members cost {cost}", chunk.len());
        }
        assert!(super::pending_chunks(&[], 30_000).is_empty());
    }

    #[test]
    fn info_fields_are_read_whole() {
        let info = "# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\nrun_id:abc\r\n";
        assert_eq!(super::info_value(info, "used_memory"), Some("1024"));
        assert_eq!(super::info_value(info, "used_memory_human"), Some("1K"));
        assert_eq!(super::info_value(info, "run_id"), Some("abc"));
        assert_eq!(super::info_value(info, "maxmemory"), None);
    }
}
