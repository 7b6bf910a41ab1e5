//! Scheduling in one runner process: which held work item runs next, the caps, the
//! heartbeat, cancel notices and shutdown.
//!
//! The runner holds at most `3 × SHEPHERD_AGENTS_MAX` entries of the dispatch stream
//! (running, and up to two waiting per slot; the reader takes no more), runs at most `SHEPHERD_AGENTS_MAX`
//! agents at once and at most `SHEPHERD_AGENTS_PER_REPO` of one repository, and when
//! a slot frees starts the waiting item of the highest `priority` (PR kinds before
//! `issue-impl`), the oldest first among equals, whose repository has room.
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
                self.waiting.push(Waiting {
                    entry: d.id,
                    seq: self.seq,
                    item: *item,
                    run,
                });
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
            self.ack(&w.entry).await;
        }
    }

    /// A job ended: act on its entry, free its slot.
    async fn on_job_end(&mut self, (id, disposition, _run): JobEnd) {
        let Some(r) = self.running.remove(&id) else {
            return;
        };
        match disposition {
            Disposition::Ack => self.ack(&r.entry).await,
            Disposition::GiveBack => {
                if let Err(e) = self.consumer.give_back(&[r.entry.as_str()]).await {
                    tracing::warn!(error = %e, "handing an entry back failed; it is reclaimed later");
                }
                self.room.add_permits(1);
            }
            Disposition::Leave => self.room.add_permits(1),
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
                self.room.add_permits(1);
            }
        }
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
                },
            );
            let shared = self.shared.clone();
            let work = id.clone();
            let handle = self.jobs.spawn(async move {
                let (d, run) = job::run(shared, w.item, w.run, stop_rx).await;
                (work, d, run)
            });
            if let Some(r) = self.running.get_mut(&id) {
                r.task = Some(handle.id());
            }
        }
    }

    /// The waiting item to start next: highest priority, then oldest, among those
    /// whose repository is below its cap.
    fn next_waiting(&self) -> Option<usize> {
        let per_repo = self.shared.agents.per_repo;
        let busy = |repo: &str| self.running.values().filter(|r| r.repo == repo).count();
        self.waiting
            .iter()
            .enumerate()
            .filter(|(_, w)| busy(w.item.repo.as_str()) < per_repo)
            // One run per work id at a time (two entries of one id wait in turn).
            .filter(|(_, w)| !self.running.contains_key(w.item.id.as_str()))
            .max_by_key(|(_, w)| (w.item.priority, std::cmp::Reverse(w.seq)))
            .map(|(i, _)| i)
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
