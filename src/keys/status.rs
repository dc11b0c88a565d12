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

    pub fn cdc_resume(&self, collection: &str) -> String {
        format!("{}cdc:resume:{collection}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
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
}
