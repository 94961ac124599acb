//! The observer's two loops: recording POST outcomes (in sets), and asking the ledger about
//! batches that wait for its verdict (one long-poll per service, several services at once).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use dltsub_queuer::ClaimsHandle;
use dltsub_store::{BatchStatus, HeldClaim, PollableBatch, Transition};
use dltsub_submitter::{DltClient, InFlight, LedgerStatus, Submission, Wakeup};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::decide::{Backoff, after_post, after_status};
use crate::metrics as m;

#[derive(Debug, Clone)]
pub struct ObserverConfig {
    /// Poll for waiting batches this often even when nothing new was accepted.
    pub poll_interval: Duration,
    /// The `wait` of a status request: the ledger answers as soon as every asked id is
    /// final, or after this long.
    pub status_wait: Duration,
    /// Unknown must last this long before a batch is resubmitted.
    pub unknown_grace: Duration,
    pub backoff: Backoff,
    /// Most batches asked about in one status request.
    pub ids_per_request: usize,
    /// Most status requests in flight at once (one per service).
    pub concurrent_polls: usize,
    /// Most POST outcomes recorded in one transaction.
    pub record_batch: usize,
    /// An own SUBMITTING batch with no POST or unrecorded outcome in this process for this
    /// long is stranded: it is turned IN_DOUBT and the ledger asked (checked as often).
    pub stranded_after: Duration,
}

pub struct Observer {
    claims: ClaimsHandle,
    client: DltClient,
    config: ObserverConfig,
    submitter_wakeup: Wakeup,
    in_flight: InFlight,
}

impl Observer {
    pub fn new(
        claims: ClaimsHandle,
        client: DltClient,
        config: ObserverConfig,
        submitter_wakeup: Wakeup,
        in_flight: InFlight,
    ) -> Self {
        Self {
            claims,
            client,
            config,
            submitter_wakeup,
            in_flight,
        }
    }

    /// Runs both loops. Recording stops when the submitter has dropped its sender (after
    /// its own drain), so every outcome of a POST that was sent is written; polling stops
    /// at `shutdown`.
    pub async fn run(self, results: mpsc::Receiver<Submission>, shutdown: CancellationToken) {
        let poll_wakeup = std::sync::Arc::new(Notify::new());
        let recorder = Recorder {
            claims: self.claims.clone(),
            shutdown: shutdown.clone(),
            in_flight: self.in_flight.clone(),
            config: self.config.clone(),
            submitter_wakeup: self.submitter_wakeup.clone(),
            poll_wakeup: poll_wakeup.clone(),
        };
        let poller = Poller {
            in_flight: self.in_flight,
            claims: self.claims,
            client: self.client,
            config: self.config,
            submitter_wakeup: self.submitter_wakeup,
            poll_wakeup,
        };
        tokio::join!(recorder.run(results), poller.run(shutdown));
    }
}

struct Recorder {
    claims: ClaimsHandle,
    shutdown: CancellationToken,
    in_flight: InFlight,
    config: ObserverConfig,
    submitter_wakeup: Wakeup,
    poll_wakeup: std::sync::Arc<Notify>,
}

impl Recorder {
    async fn run(self, mut results: mpsc::Receiver<Submission>) {
        let mut buffer = Vec::with_capacity(self.config.record_batch);
        while results
            .recv_many(&mut buffer, self.config.record_batch)
            .await
            > 0
        {
            let submissions: Vec<Submission> = std::mem::take(&mut buffer);
            let mut grouped: BTreeMap<HeldClaim, Vec<Transition>> = BTreeMap::new();
            for submission in &submissions {
                let attempts = submission
                    .batches
                    .iter()
                    .map(|(_, _, a)| *a)
                    .max()
                    .unwrap_or(1);
                let retry_after = self.config.backoff.delay(attempts);
                for (seq, _, _) in &submission.batches {
                    grouped
                        .entry(submission.claim.clone())
                        .or_default()
                        .push(after_post(
                            *seq,
                            &submission.outcome,
                            retry_after,
                            submission.batches.len(),
                        ));
                }
            }
            let work: Vec<(HeldClaim, Vec<Transition>)> = grouped.into_iter().collect();
            // A database error must not lose the outcome: retry with backoff for as long as
            // the instance runs (the batches stay SUBMITTING meanwhile, which also blocks a
            // fast takeover). Only at shutdown is it given up: the claims of services with
            // SUBMITTING batches are not released, and whoever takes them after expiry
            // turns those batches IN_DOUBT and asks the ledger — nothing is lost.
            let mut delay = Duration::from_millis(50);
            loop {
                match self.claims.apply_transitions(&work).await {
                    Ok(outcome) => {
                        count_transitions(&work, &outcome.applied);
                        break;
                    }
                    Err(error) if self.shutdown.is_cancelled() => {
                        tracing::error!(%error, "recording POST outcomes failed at shutdown; left to in-doubt resolution");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "recording POST outcomes failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = self.shutdown.cancelled() => {}
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
            // Recorded, or left to the sweep at shutdown: no longer this process's business.
            self.in_flight.remove(
                submissions
                    .iter()
                    .flat_map(|submission| submission.batches.iter().map(|(seq, _, _)| *seq)),
            );
            if work
                .iter()
                .flat_map(|(_, t)| t)
                .any(|t| t.to.is_terminal() || t.to == BatchStatus::Queued)
            {
                self.submitter_wakeup.wake();
            }
            self.poll_wakeup.notify_one();
        }
    }
}

fn count_transitions(work: &[(HeldClaim, Vec<Transition>)], applied: &[i64]) {
    let applied: HashSet<i64> = applied.iter().copied().collect();
    for transition in work.iter().flat_map(|(_, t)| t) {
        if applied.contains(&transition.seq) && transition.from != transition.to {
            metrics::counter!(m::TRANSITIONS, "status" => transition.to.as_str()).increment(1);
        }
    }
}

struct Poller {
    in_flight: InFlight,
    claims: ClaimsHandle,
    client: DltClient,
    config: ObserverConfig,
    submitter_wakeup: Wakeup,
    poll_wakeup: std::sync::Arc<Notify>,
}

/// Which services have a status request in flight (by task, so a panicked task can be
/// mapped back), and which wait before the next one after a failure.
#[derive(Default)]
struct Polling {
    services: HashSet<String>,
    by_task: HashMap<tokio::task::Id, String>,
    retry_at: HashMap<String, tokio::time::Instant>,
}

/// The batches a status request asked about and the ledger's answer.
type PollAnswer = (Vec<PollableBatch>, Result<Vec<LedgerStatus>, String>);

/// One finished status request: its service, the batches asked about and the answer.
type PollResult = (
    String,
    Vec<PollableBatch>,
    Result<Vec<LedgerStatus>, String>,
);

impl Poller {
    async fn run(self, shutdown: CancellationToken) {
        let mut in_flight: JoinSet<PollResult> = JoinSet::new();
        let mut polling = Polling::default();
        let mut next_sweep = tokio::time::Instant::now() + self.config.stranded_after;
        loop {
            if tokio::time::Instant::now() >= next_sweep {
                next_sweep = tokio::time::Instant::now() + self.config.stranded_after;
                self.sweep_stranded().await;
            }
            if let Err(error) = self.start_polls(&mut in_flight, &mut polling).await {
                tracing::warn!(%error, "reading batches to poll failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(first) = in_flight.join_next_with_id() => {
                    // Every poll that has finished by now is recorded in one transaction,
                    // and the batches to poll are read once for all of them: one round
                    // per wake-up, not one per service.
                    let mut answers = Vec::new();
                    let mut done = Some(first);
                    while let Some(result) = done {
                        if let Some(answer) = self.finish_poll(result, &mut polling) {
                            answers.push(answer);
                        }
                        done = in_flight.try_join_next_with_id();
                    }
                    self.record(answers).await;
                }
                _ = self.poll_wakeup.notified() => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
        in_flight.abort_all();
    }

    /// Updates `polling` for a finished poll task; returns what it asked and the answer.
    fn finish_poll(
        &self,
        result: Result<(tokio::task::Id, PollResult), tokio::task::JoinError>,
        polling: &mut Polling,
    ) -> Option<PollAnswer> {
        match result {
            Ok((task, (service_id, batches, answer))) => {
                polling.by_task.remove(&task);
                polling.services.remove(&service_id);
                if answer.is_err() {
                    // Don't hammer a failing ledger: this service waits a poll interval;
                    // the others go on.
                    polling.retry_at.insert(
                        service_id,
                        tokio::time::Instant::now() + self.config.poll_interval,
                    );
                }
                Some((batches, answer))
            }
            Err(error) => {
                // A poll task that panicked must not leave its service unpolled.
                if let Some(service_id) = polling.by_task.remove(&error.id()) {
                    polling.services.remove(&service_id);
                }
                tracing::error!(%error, "a status poll task failed");
                None
            }
        }
    }

    /// Turns own SUBMITTING batches this process lost track of IN_DOUBT, so they are
    /// resolved by asking the ledger instead of blocking their service.
    async fn sweep_stranded(&self) {
        let local = self.in_flight.snapshot();
        match self
            .claims
            .sweep_stranded_submitting(self.config.stranded_after, &local)
            .await
        {
            Ok(swept) if !swept.is_empty() => {
                tracing::warn!(
                    count = swept.len(),
                    "stranded SUBMITTING batches turned IN_DOUBT: {swept:?}"
                );
                self.poll_wakeup.notify_one();
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "sweeping stranded SUBMITTING batches failed"),
        }
    }

    /// Starts a status request for every service with waiting batches that has none in
    /// flight (and is not waiting after a failure), up to the concurrency limit.
    async fn start_polls(
        &self,
        in_flight: &mut JoinSet<PollResult>,
        polling: &mut Polling,
    ) -> Result<(), dltsub_store::StoreError> {
        if in_flight.len() >= self.config.concurrent_polls {
            return Ok(());
        }
        let limit = self.config.ids_per_request * self.config.concurrent_polls;
        let batches = self.claims.pollable_batches(limit).await?;
        let now = tokio::time::Instant::now();
        polling.retry_at.retain(|_, at| *at > now);
        let mut by_service: BTreeMap<String, Vec<PollableBatch>> = BTreeMap::new();
        for batch in batches {
            if !polling.services.contains(&batch.service_id)
                && !polling.retry_at.contains_key(&batch.service_id)
            {
                let entry = by_service.entry(batch.service_id.clone()).or_default();
                if entry.len() < self.config.ids_per_request {
                    entry.push(batch);
                }
            }
        }
        for (service_id, batches) in by_service {
            if in_flight.len() >= self.config.concurrent_polls {
                break;
            }
            polling.services.insert(service_id.clone());
            let client = self.client.clone();
            let wait = self.config.status_wait;
            let task_service = service_id.clone();
            let handle = in_flight.spawn(async move {
                let ids: Vec<String> = batches.iter().map(|b| b.batch_id.clone()).collect();
                metrics::counter!(m::POLLS).increment(1);
                let answer = client
                    .batch_statuses(&task_service, &ids, Some(wait))
                    .await
                    .map_err(|error| error.to_string());
                (task_service, batches, answer)
            });
            polling.by_task.insert(handle.id(), service_id);
        }
        Ok(())
    }

    /// Records the transitions the ledger's answers call for, of every finished poll, in
    /// one fenced transaction.
    async fn record(&self, answers: Vec<PollAnswer>) {
        let mut grouped: BTreeMap<HeldClaim, Vec<Transition>> = BTreeMap::new();
        let epochs = self.claims.held_claims().borrow().epochs.clone();
        for (batches, answer) in &answers {
            let statuses = match answer {
                Ok(statuses) => statuses,
                Err(error) => {
                    metrics::counter!(m::POLL_ERRORS).increment(1);
                    tracing::warn!(%error, "batch status request failed");
                    continue;
                }
            };
            let by_id: HashMap<&str, &LedgerStatus> =
                statuses.iter().map(|s| (s.batch_id.as_str(), s)).collect();
            for batch in batches {
                let (Some(status), Some(epoch)) = (
                    by_id.get(batch.batch_id.as_str()),
                    epochs.get(&batch.service_id),
                ) else {
                    continue;
                };
                if let Some(transition) = after_status(batch, status, self.config.unknown_grace) {
                    grouped
                        .entry(HeldClaim {
                            service_id: batch.service_id.clone(),
                            epoch: *epoch,
                        })
                        .or_default()
                        .push(transition);
                }
            }
        }
        if grouped.is_empty() {
            return;
        }
        let work: Vec<(HeldClaim, Vec<Transition>)> = grouped.into_iter().collect();
        match self.claims.apply_transitions(&work).await {
            Ok(outcome) => {
                count_transitions(&work, &outcome.applied);
                let frees_a_batch = work
                    .iter()
                    .flat_map(|(_, t)| t)
                    .any(|t| t.to.is_terminal() || t.to == BatchStatus::Queued);
                if frees_a_batch {
                    self.submitter_wakeup.wake();
                }
            }
            // Nothing is lost: the batches are polled again.
            Err(error) => tracing::warn!(%error, "recording ledger statuses failed"),
        }
    }
}
