//! Scheduling in one runner process: which held work item runs next, the caps, the
//! heartbeat, cancel notices and shutdown.
//!
//! The runner holds at most `3 × SHEPHERD_AGENTS_MAX` entries of the dispatch stream
//! (running, and up to two waiting per slot; the reader takes no more), runs at most `SHEPHERD_AGENTS_MAX`
//! agents at once and at most `SHEPHERD_AGENTS_PER_REPO` of one repository, and when
//! a slot frees starts a waiting item whose repository has room, repositories taking
//! turns, and within one the highest `priority` (PR kinds before `issue-impl`), the
//! oldest first among equals ([`super::fair`]: fair share, the entries held past a
//! busy repository's share, and the volume caps `max_runs_per_hour` and
//! `max_open_agent_prs`, refreshed by the heartbeat).
//!
//! Every third of the reclaim idle time, the heartbeat renews the hold on every held
//! entry (so no other runner reclaims a running job) and refreshes the running table
//! of the status page; an entry another runner took over meanwhile (this runner was
//! cut off from Redis for longer than the reclaim idle time) is stopped at once
//! without a report, so the work item never runs twice at the same time for long.
//!
//! A cancel notice stops the item's agent (whole process group) or drops it from the
//! waiting list; no result is counted. On shutdown every agent is stopped and every
//! unfinished entry handed back to the group for another runner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::consume::{Consumer, Delivery, Message};
use super::fair;
use super::job::{self, Disposition, Shared, StopReason};
use crate::core::effect::WorkItem;
use crate::store::agent_runs::{self, AgentRun};
use crate::worker::dispatch::CancelNotice;

/// Entries that may wait per agent slot (besides the running one): enough to choose
/// by priority, few enough to leave the rest of the stream to other runners.
const WAITING_PER_SLOT: usize = 2;

/// A held entry that waits for a slot.
struct Waiting {
    /// Stream id.
    entry: String,
    /// Arrival order (ties between equal priorities go to the older).
    seq: u64,
    /// The work item.
    item: WorkItem,
    /// Its run record.
    run: AgentRun,
    /// It took room when it was read (else it is held past its repository's share,
    /// [`fair::counts_against_room`]).
    counted: bool,
}

/// A held entry whose job runs.
struct Running {
    /// Stream id.
    entry: String,
    /// Repository (for the per-repository cap).
    repo: String,
    /// The entry's work item (another entry of its id is a re-dispatch only when equal).
    item: Box<WorkItem>,
    /// Stops the job.
    stop: watch::Sender<Option<StopReason>>,
    /// Its run record as started (the heartbeat refreshes `seen_ms`).
    run: AgentRun,
    /// The job's task (to find it when it panics).
    task: Option<tokio::task::Id>,
    /// It took room when it was read.
    counted: bool,
}

/// A job's end, as the join set returns it.
type JobEnd = (String, Disposition, AgentRun);

/// The scheduler's state.
struct Runner {
    /// Shared by the jobs.
    shared: Arc<Shared>,
    /// The stream side.
    consumer: Arc<Consumer>,
    /// One permit per entry the runner may still take.
    room: Arc<Semaphore>,
    /// Waiting items.
    waiting: Vec<Waiting>,
    /// Running jobs by work id.
    running: HashMap<String, Running>,
    /// The jobs.
    jobs: JoinSet<JobEnd>,
    /// Arrival counter.
    seq: u64,
    /// Each repository's last start (fair share).
    turns: fair::Turns,
    /// What the heartbeat last read of each repository's volume (and when, unix ms).
    volume: HashMap<String, (fair::Volume, i64)>,
}

/// Runs the scheduler until `shutdown`, then stops every agent and hands the
/// unfinished entries back.
pub async fn run(
    shared: Arc<Shared>,
    consumer: Arc<Consumer>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let held = shared.agents.max * (1 + WAITING_PER_SLOT);
    let room = Arc::new(Semaphore::new(held));
    let (tx, mut deliveries) = mpsc::channel::<Delivery>(held.max(1));
    let (cancel_tx, mut cancels) = mpsc::channel::<CancelNotice>(64);
    let reader_stop = shutdown.child_token();
    let mut tasks = JoinSet::new();
    tasks.spawn(
        consumer
            .clone()
            .reader(room.clone(), tx, reader_stop.clone()),
    );
    tasks.spawn(super::consume::watch_cancels(
        shared.store.clone(),
        cancel_tx,
        reader_stop.clone(),
    ));
    let beat =
        (shared.config.reclaim_idle / 3).clamp(Duration::from_millis(500), Duration::from_secs(20));
    let mut heartbeat = tokio::time::interval(beat);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut r = Runner {
        shared,
        consumer,
        room,
        waiting: Vec::new(),
        running: HashMap::new(),
        jobs: JoinSet::new(),
        seq: 0,
        turns: fair::Turns::default(),
        volume: HashMap::new(),
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(d) = deliveries.recv() => r.on_delivery(d).await,
            Some(c) = cancels.recv() => r.on_cancel(&c).await,
            Some(done) = r.jobs.join_next_with_id(), if !r.jobs.is_empty() => match done {
                Ok((_, end)) => r.on_job_end(end).await,
                Err(e) => r.on_job_panic(e).await,
            },
            _ = heartbeat.tick() => r.on_heartbeat().await,
            Some(t) = tasks.join_next() => {
                // The reader and the cancel watch only end on shutdown or a fatal error.
                if let Ok(Err(e)) = t {
                    tracing::error!(error = format!("{e:#}"), "the dispatch reader failed; stopping");
                }
                shutdown.cancel();
            }
        }
        r.schedule();
    }
    reader_stop.cancel();
    r.stop_all().await;
    while tasks.join_next().await.is_some() {}
    r.consumer.leave().await;
    Ok(())
}

impl Runner {
    /// A new entry: a work item waits for a slot; a cancel notice's group copy is just
    /// acked (every runner sees the notice itself through the cancel watch).
    async fn on_delivery(&mut self, d: Delivery) {
        let max = u64::from(self.shared.config.max_deliveries);
        match d.message {
            _ if d.deliveries > max => {
                let reason = format!("delivered {} times", d.deliveries);
                self.dead_letter(&d.id, &reason, d.deliveries).await;
            }
            Message::Bad(reason) => self.dead_letter(&d.id, &reason, d.deliveries).await,
            Message::Cancel(_) => self.ack(&d.id).await,
            Message::Work(item) => {
                let id = item.id.to_string();
                // Only an identical entry is a re-dispatch: a different one of the same
                // id waits its turn (one run per id at a time) and is checked against
                // the record when it starts (`binding`), so a forged entry read first
                // never displaces the record's own.
                if self.running.get(&id).is_some_and(|r| r.item == item)
                    || self.waiting.iter().any(|w| w.item == *item)
                {
                    // The same work item twice (a re-dispatch of one effect): one run.
                    self.ack(&d.id).await;
                    return;
                }
                let run = job::new_run(&self.shared, &item, job::now_ms());
                self.save(&run).await;
                self.seq += 1;
                let counted = self.takes_room(item.repo.as_str());
                if !counted {
                    // Held past its repository's share: the reader reads on.
                    self.room.add_permits(1);
                }
                self.waiting.push(Waiting {
                    entry: d.id,
                    seq: self.seq,
                    item: *item,
                    run,
                    counted,
                });
                // A repository seen for the first time has its volume read before
                // any of its items can start.
                self.refresh_volume(job::now_ms()).await;
            }
        }
    }

    /// A cancel notice: stop the item's agent, or drop it from the waiting list.
    async fn on_cancel(&mut self, c: &CancelNotice) {
        let id = c.id.to_string();
        if let Some(r) = self.running.get(&id) {
            tracing::info!(work = %id, "cancel notice: stopping the agent");
            let _ = r.stop.send(Some(StopReason::Cancel));
            return;
        }
        if let Some(i) = self.waiting.iter().position(|w| w.item.id == c.id) {
            let mut w = self.waiting.remove(i);
            tracing::info!(work = %id, "cancel notice: dropped before it started");
            w.run.state = agent_runs::RunState::Cancelled;
            w.run.ended_ms = Some(job::now_ms());
            w.run.note = Some("cancelled before it started".into());
            self.save(&w.run).await;
            self.ack_held(&w.entry, w.counted).await;
        }
    }

    /// A job ended: act on its entry, free its slot.
    async fn on_job_end(&mut self, (id, disposition, _run): JobEnd) {
        let Some(r) = self.running.remove(&id) else {
            return;
        };
        match disposition {
            Disposition::Ack => self.ack_held(&r.entry, r.counted).await,
            Disposition::GiveBack => {
                if let Err(e) = self.consumer.give_back(&[r.entry.as_str()]).await {
                    tracing::warn!(error = %e, "handing an entry back failed; it is reclaimed later");
                }
                self.release(r.counted);
            }
            Disposition::Leave => self.release(r.counted),
        }
    }

    /// A job panicked: free its slot and hand its entry back (a bug, logged loudly; the
    /// delivery count bounds how often one work item can cause it).
    async fn on_job_panic(&mut self, e: tokio::task::JoinError) {
        tracing::error!(error = %e, "an agent job panicked; its entry is handed back");
        let id = e.id();
        let Some(work) = self
            .running
            .iter()
            .find(|(_, r)| r.task == Some(id))
            .map(|(w, _)| w.clone())
        else {
            return;
        };
        let run = self.running.get(&work).map(|r| r.run.clone());
        if let Some(run) = run {
            self.on_job_end((work, Disposition::GiveBack, run)).await;
        }
    }

    /// Renews the hold on every held entry; stops what another runner took over.
    async fn on_heartbeat(&mut self) {
        let now = job::now_ms();
        let mut ids: Vec<String> = self.running.values().map(|r| r.entry.clone()).collect();
        ids.extend(self.waiting.iter().map(|w| w.entry.clone()));
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let ours = match self.consumer.renew(&refs).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "renewing the held entries failed");
                return;
            }
        };
        let lost: Vec<&String> = ids
            .iter()
            .zip(&ours)
            .filter(|(_, ok)| !**ok)
            .map(|(id, _)| id)
            .collect();
        for entry in lost {
            if let Some(r) = self.running.values().find(|r| &r.entry == entry) {
                tracing::warn!(work = %r.run.work_id, "another runner holds this work item now; stopping the agent");
                let _ = r.stop.send(Some(StopReason::Lost));
            }
            if let Some(i) = self.waiting.iter().position(|w| &w.entry == entry) {
                let w = self.waiting.remove(i);
                tracing::warn!(work = %w.run.work_id, "another runner holds this waiting work item now");
                self.release(w.counted);
            }
        }
        self.refresh_volume(now).await;
        let mut runs: Vec<AgentRun> = Vec::new();
        for r in self.running.values_mut() {
            r.run.seen_ms = now;
            runs.push(r.run.clone());
        }
        for w in &mut self.waiting {
            w.run.seen_ms = now;
            runs.push(w.run.clone());
        }
        if let Err(e) = agent_runs::heartbeat(
            &mut self.shared.store.conn(),
            self.shared.store.keys(),
            &runs,
        )
        .await
        {
            tracing::debug!(error = %e, "refreshing the running table failed");
        }
        if !self.shared.sandbox.is_on()
            && let Err(e) = agent_runs::announce_unsandboxed(
                &mut self.shared.store.conn(),
                self.shared.store.keys(),
                &self.shared.runner,
                now,
            )
            .await
        {
            tracing::debug!(error = %e, "announcing the unsandboxed runner failed");
        }
    }

    /// Starts waiting items while there are free slots.
    fn schedule(&mut self) {
        while self.running.len() < self.shared.agents.max {
            let Some(i) = self.next_waiting() else { return };
            let w = self.waiting.remove(i);
            self.turns.started(w.item.repo.as_str());
            if let Some((v, _)) = self.volume.get_mut(w.item.repo.as_str()) {
                // Counted at once, so the cap holds before the next refresh.
                v.runs_last_hour += 1;
            }
            let (stop, stop_rx) = watch::channel(None);
            let id = w.run.work_id.clone();
            let mut run = w.run.clone();
            run.state = agent_runs::RunState::Running;
            self.running.insert(
                id.clone(),
                Running {
                    entry: w.entry,
                    repo: w.item.repo.to_string(),
                    item: Box::new(w.item.clone()),
                    stop,
                    run: run.clone(),
                    task: None,
                    counted: w.counted,
                },
            );
            let shared = self.shared.clone();
            let work = id.clone();
            let handle = self.jobs.spawn(async move {
                note_start(&shared, &w.item).await;
                let (d, run) = job::run(shared, w.item, w.run, stop_rx).await;
                (work, d, run)
            });
            if let Some(r) = self.running.get_mut(&id) {
                r.task = Some(handle.id());
            }
        }
    }

    /// The waiting item to start next ([`fair::pick`]) among those whose repository
    /// is below its cap, with no run of the same work id, and not held back by a
    /// volume cap.
    fn next_waiting(&self) -> Option<usize> {
        let per_repo = self.shared.agents.per_repo;
        let busy = |repo: &str| self.running.values().filter(|r| r.repo == repo).count();
        let candidates: Vec<fair::Candidate<'_>> = self
            .waiting
            .iter()
            .map(|w| fair::Candidate {
                repo: w.item.repo.as_str(),
                priority: w.item.priority,
                seq: w.seq,
                eligible: busy(w.item.repo.as_str()) < per_repo
                    // One run per work id at a time (two entries of one id wait in turn).
                    && !self.running.contains_key(w.item.id.as_str())
                    && self.held_back(w).is_none(),
            })
            .collect();
        fair::pick(&candidates, &self.turns)
    }

    /// Whether a new entry of `repo` takes room ([`fair::counts_against_room`]), or is
    /// held as an extra (while there are fewer than [`fair::EXTRA_HELD`]).
    fn takes_room(&self, repo: &str) -> bool {
        let held = self.shared.agents.max * (1 + WAITING_PER_SLOT);
        let counted = self
            .waiting
            .iter()
            .filter(|w| w.counted && w.item.repo.as_str() == repo)
            .count()
            + self
                .running
                .values()
                .filter(|r| r.counted && r.repo == repo)
                .count();
        let extras = self.waiting.iter().filter(|w| !w.counted).count()
            + self.running.values().filter(|r| !r.counted).count();
        fair::counts_against_room(counted, held) || extras >= fair::EXTRA_HELD
    }

    /// Re-reads the volume of the repositories with waiting items whose policy caps
    /// it (at most every [`VOLUME_REFRESH_MS`] each), and notes on each waiting item
    /// the cap that holds it back.
    async fn refresh_volume(&mut self, now: i64) {
        let mut repos: Vec<crate::core::ids::RepoName> =
            self.waiting.iter().map(|w| w.item.repo.clone()).collect();
        repos.sort();
        repos.dedup();
        for repo in &repos {
            let policy = self.shared.policy.for_repo(repo);
            let fresh = self
                .volume
                .get(repo.as_str())
                .is_some_and(|(_, at)| now.saturating_sub(*at) < VOLUME_REFRESH_MS);
            if fresh || (policy.max_runs_per_hour == 0 && policy.max_open_agent_prs == 0) {
                continue;
            }
            let v = read_volume(&self.shared, repo, &policy, now).await;
            self.volume.insert(repo.to_string(), (v, now));
        }
        self.volume
            .retain(|repo, _| repos.iter().any(|r| r.as_str() == repo));
        let (waiting, running) = (&self.waiting, &self.running);
        self.turns.retain(|repo| {
            waiting.iter().any(|w| w.item.repo.as_str() == repo)
                || running.values().any(|r| r.repo == repo)
        });
        let notes: Vec<Option<String>> = self.waiting.iter().map(|w| self.held_back(w)).collect();
        for (w, note) in self.waiting.iter_mut().zip(notes) {
            w.run.note = note;
        }
    }

    /// The volume cap that holds `w` back now, from the last read volume and the
    /// starts since ([`fair::held_back`]).
    fn held_back(&self, w: &Waiting) -> Option<String> {
        let (v, _) = self.volume.get(w.item.repo.as_str())?;
        let policy = self.shared.policy.for_repo(&w.item.repo);
        fair::held_back(&policy, w.item.kind, v)
    }

    /// Shutdown: stops every agent, waits for the jobs, hands back what is unfinished.
    async fn stop_all(&mut self) {
        for r in self.running.values() {
            let _ = r.stop.send(Some(StopReason::Shutdown));
        }
        while let Some(done) = self.jobs.join_next_with_id().await {
            match done {
                Ok((_, end)) => self.on_job_end(end).await,
                Err(e) => self.on_job_panic(e).await,
            }
        }
        let entries: Vec<String> = self.waiting.iter().map(|w| w.entry.clone()).collect();
        for w in std::mem::take(&mut self.waiting) {
            let mut run = w.run;
            run.state = agent_runs::RunState::Released;
            run.note = Some("the runner stopped before it started".into());
            self.save(&run).await;
        }
        let refs: Vec<&str> = entries.iter().map(String::as_str).collect();
        if let Err(e) = self.consumer.give_back(&refs).await {
            tracing::warn!(error = %e, "handing entries back failed; they are reclaimed later");
        }
    }

    /// Acks a held entry and frees its room if it took some.
    async fn ack_held(&self, entry: &str, counted: bool) {
        if let Err(e) = self.consumer.ack(entry).await {
            tracing::warn!(entry, error = %e, "acknowledging a dispatch entry failed; it is redelivered later");
        }
        self.release(counted);
    }

    /// Frees the room a held entry took (an extra took none).
    fn release(&self, counted: bool) {
        if counted {
            self.room.add_permits(1);
        }
    }

    /// Acks an entry and frees its room.
    async fn ack(&self, entry: &str) {
        if let Err(e) = self.consumer.ack(entry).await {
            tracing::warn!(entry, error = %e, "acknowledging a dispatch entry failed; it is redelivered later");
        }
        self.room.add_permits(1);
    }

    /// Dead-letters an entry and frees its room.
    async fn dead_letter(&self, entry: &str, reason: &str, deliveries: u64) {
        tracing::warn!(entry, reason, "dispatch entry dead-lettered");
        if let Err(e) = self.consumer.dead_letter(entry, reason, deliveries).await {
            tracing::warn!(entry, error = %e, "dead-lettering failed; it stays pending");
        }
        self.room.add_permits(1);
    }

    /// Stores a run record (a failure only costs visibility).
    async fn save(&self, run: &AgentRun) {
        let r = agent_runs::save(
            &mut self.shared.store.conn(),
            self.shared.store.keys(),
            run,
            self.shared.config.retention,
        )
        .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "storing a run's state failed");
        }
    }
}

/// How often a repository's volume is read again while it has waiting items.
const VOLUME_REFRESH_MS: i64 = 30_000;

/// A repository's volume: runs started in the last hour (the ledger), and the bot's
/// open PRs when `max_open_agent_prs` is set (one Forgejo read). A failed read
/// counts as nothing, logged: the caps hold back work, they never block it for good.
async fn read_volume(
    shared: &Shared,
    repo: &crate::core::ids::RepoName,
    policy: &crate::core::policy::Policy,
    now: i64,
) -> fair::Volume {
    let store = &shared.store;
    let runs = crate::store::ledger::runs_last_hour(&mut store.conn(), store.keys(), repo, now)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(repo = %repo, error = %e, "reading the runs of the last hour failed");
            0
        });
    let open = match policy.max_open_agent_prs {
        0 => None,
        _ => match shared.forgejo.list_open_pulls(repo.as_str()).await {
            Ok(prs) => Some(
                prs.iter()
                    .filter(|p| {
                        p.user
                            .login
                            .parse::<crate::core::ids::Login>()
                            .is_ok_and(|l| policy.is_bot_author(&l))
                    })
                    .count() as u64,
            ),
            Err(e) => {
                tracing::warn!(repo = %repo, error = %e, "listing the open PRs failed");
                None
            }
        },
    };
    fair::Volume {
        runs_last_hour: runs,
        open_agent_prs: open,
    }
}

/// Notes a run's start in the ledger (`max_runs_per_hour`); a failure is logged.
async fn note_start(shared: &Shared, item: &WorkItem) {
    let store = &shared.store;
    let id = item.id.to_string();
    let r = crate::store::ledger::note_start(
        &mut store.conn(),
        store.keys(),
        &item.repo,
        &id,
        job::now_ms(),
    )
    .await;
    if let Err(e) = r {
        tracing::warn!(work = %id, error = %e, "noting the run's start failed");
    }
}
