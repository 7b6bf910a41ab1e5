//! Every Redis key Shepherd uses, in one place.
//!
//! Layout: everything one Lua call touches must live in one Redis Cluster slot, so each
//! *shard* is a hash tag `{<prefix>:<shard>}` and a repository's events, records,
//! history, effects, timers and dedup markers all carry its shard's tag. Repositories
//! are hashed onto shards ([`Keys::shard_of`]); with the default of one shard every key
//! but the contract streams lives in one slot, which is also what a single Redis wants.
//!
//! The contract streams `<prefix>:dispatch` and `<prefix>:results` (DESIGN §4) and a few
//! process-wide keys (repo set, the merge and resync locks) carry no shard tag.

/// Consumer group reading the events streams.
pub const WORKERS_GROUP: &str = "workers";
/// Consumer group reading the effects streams.
pub const EXECUTORS_GROUP: &str = "executors";
/// Consumer group reading the results stream.
pub const RESULTS_GROUP: &str = "results";
/// Consumer group of the agent runners (`shepherd agents`) on the dispatch stream
/// (contract, DESIGN §4).
pub const AGENTS_GROUP: &str = "agents";

/// Key builder for one key prefix and shard count.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The configured prefix (`SHEPHERD_KEY_PREFIX`).
    prefix: String,
    /// Number of shards (≥ 1).
    shards: u16,
}

impl Keys {
    /// Keys for `prefix` with `shards` shards (0 is treated as 1).
    pub fn new(prefix: impl Into<String>, shards: u16) -> Self {
        Self {
            prefix: prefix.into(),
            shards: shards.max(1),
        }
    }

    /// The configured prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Number of shards.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The shard a repository (`owner/name`, any case) belongs to: FNV-1a of the
    /// lower-cased name, stable across processes and versions. Events with no
    /// repository go to shard 0.
    pub fn shard_of(&self, repo: &str) -> u16 {
        if self.shards == 1 || repo.is_empty() {
            return 0;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in repo.bytes() {
            h ^= u64::from(b.to_ascii_lowercase());
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % u64::from(self.shards)) as u16
    }

    /// The hash tag of a shard, `{<prefix>:<shard>}`.
    fn tag(&self, shard: u16) -> String {
        format!("{{{}:{}}}", self.prefix, shard)
    }

    /// Events stream of a shard: webhook deliveries and internal events, retained for
    /// the replay window (it is also the archive).
    pub fn events(&self, shard: u16) -> String {
        format!("{}:events", self.tag(shard))
    }

    /// Dedup marker of a delivery id (value: the stream id it was queued as).
    pub fn seen(&self, shard: u16, delivery: &str) -> String {
        format!("{}:seen:{}", self.tag(shard), delivery)
    }

    /// Per-PR record (a hash with `v` = version and `data` = JSON).
    pub fn pr_record(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:pr:{}#{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase(),
            number
        )
    }

    /// Per-issue record for `issue-impl` (same shape as a PR record).
    pub fn issue_record(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:issue:{}#{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase(),
            number
        )
    }

    /// History stream of one PR or issue: one entry per committed transition, naming
    /// the events-stream id that caused it.
    pub fn history(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:hist:{}#{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase(),
            number
        )
    }

    /// History stream of one issue record (same entries as [`Keys::history`]).
    pub fn issue_history(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:ihist:{}#{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase(),
            number
        )
    }

    /// Set of the record keys of a repository's PRs and issues (for inspect/resync).
    pub fn repo_index(&self, repo: &str) -> String {
        format!(
            "{}:index:{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase()
        )
    }

    /// Effects stream of a shard (consumer group `executors`).
    pub fn effects(&self, shard: u16) -> String {
        format!("{}:effects", self.tag(shard))
    }

    /// Done marker of an effect id (so a redelivered effect does nothing twice).
    pub fn effect_done(&self, shard: u16, effect_id: &str) -> String {
        format!("{}:done:{}", self.tag(shard), effect_id)
    }

    /// Sorted set of effects waiting for another try after a transient failure
    /// (score: when, in unix milliseconds; member: the entry's fields as JSON).
    pub fn effect_retries(&self, shard: u16) -> String {
        format!("{}:effect-retries", self.tag(shard))
    }

    /// Marker of a Dispatch or CancelWork effect already appended to the dispatch
    /// stream. Its hash tag is the dispatch stream's own name, so the marker and the
    /// stream share a Redis Cluster slot and one script can write both.
    pub fn dispatch_sent(&self, effect_id: &str) -> String {
        format!("{{{}}}:sent:{}", self.dispatch(), effect_id)
    }

    /// Sorted set of due timers of a shard (score: due time in unix milliseconds).
    pub fn timers(&self, shard: u16) -> String {
        format!("{}:timers", self.tag(shard))
    }

    /// Hash of a shard's timer payloads: timer member → `repo TAB event TAB body`
    /// (the sorted set holds only members and due times, so rescheduling a timer id
    /// replaces it).
    pub fn timer_data(&self, shard: u16) -> String {
        format!("{}:timer-data", self.tag(shard))
    }

    /// Dead-letter stream of a shard (entries of its events and effects streams).
    pub fn dead_letters(&self, shard: u16) -> String {
        format!("{}:dead", self.tag(shard))
    }

    /// Work items for agents (contract: `<prefix>:dispatch`, field `work`).
    pub fn dispatch(&self) -> String {
        format!("{}:dispatch", self.prefix)
    }

    /// Work results from agents (contract: `<prefix>:results`, field `result`).
    pub fn results(&self) -> String {
        format!("{}:results", self.prefix)
    }

    /// Set of every repository Shepherd has seen (`resync --all`).
    pub fn repos(&self) -> String {
        format!("{}:repos", self.prefix)
    }

    /// Index of a shard's active work ids → owner (`pr|issue TAB repo TAB number`),
    /// maintained by the commit script (results API lookups). Per shard so that the
    /// commit that dispatches or ends work touches one slot.
    pub fn work_index(&self, shard: u16) -> String {
        format!("{}:work", self.tag(shard))
    }

    /// Marker (with a TTL) of a work id that has ended: a late result gets 409, not 404.
    pub fn work_ended(&self, shard: u16, work_id: &str) -> String {
        format!("{}:work-ended:{}", self.tag(shard), work_id)
    }

    /// Marker (with a TTL) of a work id whose result was queued: a second report gets 409.
    pub fn work_reported(&self, shard: u16, work_id: &str) -> String {
        format!("{}:work-reported:{}", self.tag(shard), work_id)
    }

    /// Merge lock of a target branch.
    pub fn merge_lock(&self, repo: &str, branch: &str) -> String {
        format!(
            "{}:lock:merge:{}:{}",
            self.prefix,
            repo.to_lowercase(),
            branch
        )
    }

    /// The merge queue of a target branch (a hash: `v` = version, the compare-and-set
    /// guard, and `data` = the `core::queue::BranchQueue` JSON). Tagged with the
    /// repository's shard like its PR records.
    pub fn merge_queue(&self, repo: &str, branch: &str) -> String {
        format!(
            "{}:queue:{}:{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase(),
            branch
        )
    }

    /// The set of branches of a repository that have a merge queue (status page,
    /// `inspect`, metrics), tagged like the queues.
    pub fn merge_queues(&self, repo: &str) -> String {
        format!(
            "{}:queues:{}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase()
        )
    }

    /// Sorted set of the records waiting for a branch's merge lease (member: the
    /// record's timer member `<record key>/merge-retry`, score: when it began to wait);
    /// the lease's releaser wakes the oldest (`store::lock::wake_next_waiter`).
    pub fn merge_waiters(&self, repo: &str, branch: &str) -> String {
        format!("{}:waiters", self.merge_lock(repo, branch))
    }

    /// Lock of a PR's sticky status comment: one executor at a time looks it up and
    /// creates or edits it. Its own key, not the merge lock: a merge and a status
    /// update never wait for each other. Carries the PR's shard tag, like its record.
    pub fn status_lock(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:lock:status:{}#{number}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase()
        )
    }

    /// Where a PR's sticky status comment is (its id, and the effect and body digest
    /// of the last write), so the executor edits it without listing the PR's comments
    /// first (issue 17). Carries the PR's shard tag, like its record.
    pub fn status_comment(&self, repo: &str, number: u64) -> String {
        format!(
            "{}:status-comment:{}#{number}",
            self.tag(self.shard_of(repo)),
            repo.to_lowercase()
        )
    }

    /// Lock held by the worker doing the periodic resync.
    pub fn resync_lock(&self) -> String {
        format!("{}:lock:resync", self.prefix)
    }

    /// Set by an executor while its Forgejo circuit breaker is open (value: the Forgejo
    /// base URL; expires when the breaker lets its next probe through), so the status
    /// page of any process can show it.
    pub fn forgejo_circuit(&self) -> String {
        format!("{}:forgejo-circuit", self.prefix)
    }

    /// Time of the last completed resync (unix ms).
    pub fn last_resync(&self) -> String {
        format!("{}:last-resync", self.prefix)
    }

    /// Hash of the agents running now: work id → the [`agent_run`](Self::agent_run)
    /// JSON, refreshed by each runner's heartbeat (the status page's table).
    pub fn agents_running(&self) -> String {
        format!("{}:agents:running", self.prefix)
    }

    /// Sorted set of the agent runners that run agents unsandboxed
    /// (`SHEPHERD_AGENT_SANDBOX=off`): runner → its last heartbeat (unix ms), for the
    /// status page's "agents unsandboxed" whether or not they hold work.
    pub fn agents_unsandboxed(&self) -> String {
        format!("{}:agents:unsandboxed", self.prefix)
    }

    /// State of one work item in an agent runner (JSON, TTL = the retention window):
    /// waiting, running, or how it finished (`inspect`).
    pub fn agent_run(&self, work_id: &str) -> String {
        format!("{}:agent-run:{}", self.prefix, work_id)
    }

    /// The captured output of one work item's agent (size-capped, secrets masked; TTL =
    /// the retention window).
    pub fn agent_log(&self, work_id: &str) -> String {
        format!("{}:agent-log:{}", self.prefix, work_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_puts_everything_in_one_slot() {
        let k = Keys::new("t1", 1);
        for key in [
            k.events(0),
            k.seen(0, "d"),
            k.pr_record("Org/Repo", 3),
            k.history("org/repo", 3),
            k.effects(0),
            k.timers(0),
        ] {
            assert!(key.starts_with("{t1:0}:"), "{key}");
        }
        assert_eq!(k.dispatch(), "t1:dispatch");
        assert_eq!(k.results(), "t1:results");
    }

    #[test]
    fn shards_are_stable_and_case_insensitive() {
        let k = Keys::new("p", 8);
        assert_eq!(k.shard_of("Org/Repo"), k.shard_of("org/repo"));
        let spread: std::collections::HashSet<u16> =
            (0..100).map(|i| k.shard_of(&format!("o/r{i}"))).collect();
        assert!(spread.len() > 4, "hash spreads repositories: {spread:?}");
        assert!(
            k.pr_record("o/r1", 1)
                .starts_with(&format!("{{p:{}}}", k.shard_of("o/r1")))
        );
        let tag = |key: String| key[..key.find('}').unwrap() + 1].to_owned();
        assert_eq!(
            tag(k.status_lock("O/R1", 1)),
            tag(k.pr_record("o/r1", 1)),
            "the status lock lives with the PR's record"
        );
        assert_ne!(k.status_lock("o/r1", 1), k.merge_lock("o/r1", "main"));
    }
}
