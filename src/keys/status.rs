//! Job status keys (contract §3), under the status prefix, never under the
//! data prefix. Like data keys, they are only put together here.

/// Renders status keys under one status prefix.
#[derive(Debug, Clone)]
pub struct StatusKeys {
    prefix: String,
}

impl StatusKeys {
    pub fn new(prefix: impl Into<String>) -> StatusKeys {
        StatusKeys { prefix: prefix.into() }
    }

    pub fn job(&self, run_id: &str) -> String {
        format!("{}job:{run_id}", self.prefix)
    }

    pub fn builder(&self, run_id: &str, name: &str) -> String {
        format!("{}job:{run_id}:builder:{name}", self.prefix)
    }

    /// The glob matching every builder hash of a run.
    pub fn builders_glob(&self, run_id: &str) -> String {
        format!("{}job:{run_id}:builder:*", self.prefix)
    }

    /// `jobs:active`, `jobs:completed` or `jobs:failed`.
    pub fn jobs(&self, state: &str) -> String {
        format!("{}jobs:{state}", self.prefix)
    }

    pub fn progress(&self, run_id: &str) -> String {
        format!("{}progress:{run_id}", self.prefix)
    }

    pub fn progress_pattern(&self) -> String {
        format!("{}progress:*", self.prefix)
    }

    pub fn health(&self) -> String {
        format!("{}health:current", self.prefix)
    }

    pub fn total_jobs(&self) -> String {
        format!("{}stats:total_jobs", self.prefix)
    }

    pub fn rebuild_lock(&self) -> String {
        format!("{}lock:rebuild:full", self.prefix)
    }

    /// The fencing epoch: raised on every take-over of the writer lease;
    /// writes are applied only while it still holds the writer's epoch.
    /// Its hash tag is the lease key, so on a Redis Cluster both live in
    /// one slot and the take-over script may touch both.
    pub fn epoch(&self) -> String {
        format!("{}lock:epoch:{{{}}}", self.prefix, self.rebuild_lock())
    }

    /// The watcher's pending scopes: written before a batch's index keys,
    /// cleared with its tokens (a set of `c:`/`t:`/`ch:`/`v:` + id).
    pub fn cdc_pending(&self) -> String {
        format!("{}cdc:pending", self.prefix)
    }

    /// Keys the watcher could not write because no live master covered
    /// their slot (a set of key names): rewritten, and removed, once
    /// their slot is covered again.
    pub fn cdc_deferred(&self) -> String {
        format!("{}cdc:deferred", self.prefix)
    }

    pub fn cdc_resume(&self, collection: &str) -> String {
        format!("{}cdc:resume:{collection}", self.prefix)
    }
}

/// `<status_prefix><name>{<tag>}`, a key of slot `slot` (built without
/// `format!`: one probe per slot of every write).
fn slot_key(status_prefix: &str, name: &str, slot: u16) -> String {
    let tag = &super::slot::tags()[usize::from(slot)];
    let mut key = String::with_capacity(status_prefix.len() + name.len() + tag.len() + 2);
    key.push_str(status_prefix);
    key.push_str(name);
    key.push('{');
    key.push_str(tag);
    key.push('}');
    key
}

/// The name of slot `slot`'s epoch copy under `status_prefix`.
pub fn epoch_copy_key(status_prefix: &str, slot: u16) -> String {
    slot_key(status_prefix, "lock:epoch:slot:", slot)
}

/// The name of slot `slot`'s probe under `status_prefix`: a key that is
/// never written. Naming it in a script makes the script run only while
/// the slot is stable on that master: a master that is migrating the
/// slot out answers a missing key with `ASK` (or `TRYAGAIN`), one that
/// does not own it with `MOVED`. Without it, a script whose keys all
/// still exist on a migrating master could `DEL` a key and then be
/// refused its re-add, leaving the key missing.
pub fn probe_key(status_prefix: &str, slot: u16) -> String {
    slot_key(status_prefix, "lock:probe:", slot)
}

/// The name of a stage key under `status_prefix` for a key of slot
/// `slot`: tagged into that slot, so the key and its stage share a slot
/// (a cluster renames only within one), and named by `nonce`, so no two
/// staged writes ever share one.
pub fn stage_key(status_prefix: &str, slot: u16, nonce: u64) -> String {
    slot_key(status_prefix, &format!("stage:{nonce:016x}:"), slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::slot::{slot, tags};

    #[test]
    fn keys_follow_the_contract() {
        let k = super::StatusKeys::new("cachewright:");
        assert_eq!(k.job("0123456789abcdef"), "cachewright:job:0123456789abcdef");
        assert_eq!(k.builder("r", "videos"), "cachewright:job:r:builder:videos");
        assert_eq!(k.jobs("active"), "cachewright:jobs:active");
        assert_eq!(k.progress("r"), "cachewright:progress:r");
        assert_eq!(k.health(), "cachewright:health:current");
        assert_eq!(k.total_jobs(), "cachewright:stats:total_jobs");
        assert_eq!(k.rebuild_lock(), "cachewright:lock:rebuild:full");
        assert_eq!(k.epoch(), "cachewright:lock:epoch:{cachewright:lock:rebuild:full}");
        let slot = |key: String| crate::sink::cluster::slot(key.as_bytes());
        assert_eq!(slot(k.epoch()), slot(k.rebuild_lock()));
        assert_eq!(k.cdc_resume("VideoMedia"), "cachewright:cdc:resume:VideoMedia");
    }

    #[test]
    fn every_slot_has_an_epoch_copy() {
        for s in [0u16, 1, 5061, 12182, 16383] {
            let key = epoch_copy_key("cachewright:", s);
            assert_eq!(slot(key.as_bytes()), s, "{key}");
            let probe = probe_key("cachewright:", s);
            assert_eq!(slot(probe.as_bytes()), s, "{probe}");
        }
        assert_eq!(epoch_copy_key("cw:", 0), format!("cw:lock:epoch:slot:{{{}}}", tags()[0]));
        // A stage shares its key's slot, even a key with a hash tag of its
        // own (hostile ids may hold braces).
        for key in ["app:video:category:list:c1", "app:video:tag:list:{x}:t", "app:video:list:home:c:{}"] {
            let s = slot(key.as_bytes());
            let stage = stage_key("cachewright:", s, 0xbeef);
            assert_eq!(slot(stage.as_bytes()), s, "{stage}");
            assert!(stage.starts_with("cachewright:stage:000000000000beef:{"), "{stage}");
        }
        assert!(tags().iter().all(|t| !t.is_empty() && t.len() <= 6));
    }
}
