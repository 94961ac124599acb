//! The submission loop: select what may be submitted now, mark it SUBMITTING under its
//! claim, POST it, and hand the outcome to the observer.
//!
//! Woken by events, not by the claim tick (DESIGN.md §8): a batch accepted for a held
//! service, a batch reaching a final status (which frees its service's next batch), a POST
//! finishing (which frees capacity) or a claim acquired all call [`Wakeup::wake`]. A short
//! poll is the fallback, and the only path for batches accepted by another process on SQLite.

use dltsub_chaos_points::{Event, Phase};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dltsub_queuer::ClaimsHandle;
use dltsub_store::{HeldClaim, SubmittableBatch};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::client::{DltClient, PostOutcome};
use crate::metrics as m;

/// Wakes the submission loop. Cheap to clone; many wakes before the loop runs count once.
#[derive(Debug, Clone, Default)]
pub struct Wakeup(Arc<Notify>);

impl Wakeup {
    pub fn wake(&self) {
        self.0.notify_one();
    }

    pub async fn woken(&self) {
        self.0.notified().await;
    }
}

/// The seqs this instance has marked SUBMITTING and whose outcome is not recorded yet: the
/// submitter adds them, the observer removes them once recorded. Anything SUBMITTING by
/// this instance and not in here for long was stranded (see the observer's sweep).
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<std::sync::Mutex<std::collections::HashSet<i64>>>);

impl InFlight {
    pub fn add(&self, seqs: impl IntoIterator<Item = i64>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(seqs);
    }

    pub fn remove(&self, seqs: impl IntoIterator<Item = i64>) {
        let mut set = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for seq in seqs {
            set.remove(&seq);
        }
    }

    pub fn snapshot(&self) -> Vec<i64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

/// The outcome of one POST (one or more batches of one service), for the observer.
#[derive(Debug, Clone)]
pub struct Submission {
    pub claim: HeldClaim,
    /// The batches of the POST, in seq order: `(seq, batch_id, attempts so far)`.
    pub batches: Vec<(i64, String, i32)>,
    pub outcome: PostOutcome,
}

#[derive(Debug, Clone)]
pub struct SubmitterConfig {
    /// Most batches of this instance between mark SUBMITTING and the ledger's answer.
    pub max_in_flight: usize,
    /// Poll for submittable batches this often when nothing wakes the loop.
    pub idle_poll: Duration,
    /// Wait this long for in-flight POSTs at shutdown before giving up on them.
    pub drain_timeout: Duration,
}

pub struct Submitter {
    claims: ClaimsHandle,
    client: DltClient,
    config: SubmitterConfig,
    wakeup: Wakeup,
    results: mpsc::Sender<Submission>,
    in_flight: InFlight,
}

impl Submitter {
    pub fn new(
        claims: ClaimsHandle,
        client: DltClient,
        config: SubmitterConfig,
        wakeup: Wakeup,
        results: mpsc::Sender<Submission>,
        in_flight: InFlight,
    ) -> Self {
        Self {
            claims,
            client,
            config,
            wakeup,
            results,
            in_flight,
        }
    }

    /// Runs until `shutdown`, then waits up to `drain_timeout` for POSTs in flight so their
    /// outcomes are recorded.
    pub async fn run(self, shutdown: CancellationToken) {
        let permits = Arc::new(Semaphore::new(self.config.max_in_flight));
        let tracker = TaskTracker::new();
        let mut held = self.claims.held_claims();
        loop {
            let free = permits.available_permits();
            if free > 0 {
                match self.submit_round(free, &permits, &tracker).await {
                    // A full round suggests more is waiting: go again at once.
                    Ok(started) if started == free => continue,
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "selecting batches to submit failed"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.wakeup.woken() => {}
                // New claims (or lost ones) change what is submittable.
                changed = held.changed() => {
                    if changed.is_err() {
                        // The queuer is gone (shutting down): fall back to polling.
                        tokio::time::sleep(self.config.idle_poll).await;
                    }
                }
                _ = tokio::time::sleep(self.config.idle_poll) => {}
            }
        }
        tracker.close();
        if tokio::time::timeout(self.config.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.config.max_in_flight - permits.available_permits(),
                "shutdown: POSTs still in flight after the drain timeout"
            );
        }
    }

    /// One round: select up to `free` batches, mark them SUBMITTING, start their POSTs.
    /// Returns how many batches were started.
    async fn submit_round(
        &self,
        free: usize,
        permits: &Arc<Semaphore>,
        tracker: &TaskTracker,
    ) -> Result<usize, dltsub_store::StoreError> {
        let batches = self.claims.select_submittable(free).await?;
        if batches.is_empty() {
            return Ok(0);
        }
        chaos_point(Event::E4, Phase::Before).await?;
        // Group per claim, keeping seq order within each service.
        let mut groups: BTreeMap<HeldClaim, Vec<SubmittableBatch>> = BTreeMap::new();
        for batch in batches {
            let claim = HeldClaim {
                service_id: batch.service_id.clone(),
                epoch: batch.epoch,
            };
            groups.entry(claim).or_default().push(batch);
        }
        // A batch submitted before goes alone (a 400 on a list says nothing about which
        // batch was bad; a 413 needs a smaller list); fresh ones go together. The rest of
        // the service waits for the next round, behind it.
        for batches in groups.values_mut() {
            let keep = if batches[0].attempts > 0 {
                1
            } else {
                batches.iter().take_while(|b| b.attempts == 0).count()
            };
            batches.truncate(keep);
        }
        let marks: Vec<(HeldClaim, Vec<i64>)> = groups
            .iter()
            .map(|(claim, batches)| (claim.clone(), batches.iter().map(|b| b.seq).collect()))
            .collect();
        chaos_point(Event::E4, Phase::After).await?;
        let marked = self.claims.mark_submitting(&marks).await?;
        self.in_flight.add(marked.applied.iter().copied());
        let applied: std::collections::HashSet<i64> = marked.applied.iter().copied().collect();
        let mut started = 0;
        for (claim, batches) in groups {
            let batches: Vec<SubmittableBatch> = batches
                .into_iter()
                .filter(|b| applied.contains(&b.seq))
                .collect();
            if batches.is_empty() {
                continue;
            }
            let Ok(permit) = permits.clone().try_acquire_many_owned(batches.len() as u32) else {
                // Cannot happen (we selected at most `free`); the batches stay SUBMITTING
                // and are resolved by the observer's in-doubt path after a takeover.
                tracing::error!(service.id = %claim.service_id, "no submission capacity left");
                break;
            };
            started += batches.len();
            let task = PostTask {
                claims: self.claims.clone(),
                client: self.client.clone(),
                results: self.results.clone(),
                wakeup: self.wakeup.clone(),
                claim,
                batches,
            };
            tracker.spawn(async move {
                task.run().await;
                drop(permit);
            });
        }
        metrics::gauge!(m::IN_FLIGHT)
            .set((self.config.max_in_flight - permits.available_permits()) as f64);
        Ok(started)
    }
}

/// One POST of one or more batches of one service.
struct PostTask {
    claims: ClaimsHandle,
    client: DltClient,
    results: mpsc::Sender<Submission>,
    wakeup: Wakeup,
    claim: HeldClaim,
    batches: Vec<SubmittableBatch>,
}

impl PostTask {
    async fn run(self) {
        let first_batch = self.batches[0].batch_id.clone();
        let span = tracing::info_span!(
            "submission",
            service.id = %self.claim.service_id,
            batch.id = %first_batch,
            batch.count = self.batches.len(),
            epoch = self.claim.epoch,
            outcome = tracing::field::Empty,
        );
        let mut outcome = self.post().instrument(span.clone()).await;
        // The response is received; an injected error here is a response lost on its way
        // to the observer: the outcome is unknown.
        if let Err(injected) = dltsub_chaos_points::reached(Event::E7, Phase::Before).await {
            outcome = PostOutcome::InDoubt {
                error: injected.to_string(),
            };
        }
        let label = outcome_label(&outcome);
        span.record("outcome", label);
        metrics::counter!(m::SUBMISSIONS, "outcome" => label).increment(1);
        metrics::counter!(m::SUBMITTED_BATCHES, "outcome" => label)
            .increment(self.batches.len() as u64);
        let submission = Submission {
            claim: self.claim,
            batches: self
                .batches
                .iter()
                .map(|b| (b.seq, b.batch_id.clone(), b.attempts + 1))
                .collect(),
            outcome,
        };
        // The observer outlives the submitter at shutdown, so this only fails if it died;
        // then the batches stay SUBMITTING and are resolved after a takeover.
        if self.results.send(submission).await.is_err() {
            tracing::error!("observer gone; submission outcome not recorded");
        }
        // Nothing is left to fail after the hand-off; stall, stop and kill still apply.
        let _ = dltsub_chaos_points::reached(Event::E7, Phase::After).await;
        self.wakeup.wake();
    }

    async fn post(&self) -> PostOutcome {
        // Self-fencing: no POST starts once the claim's term has run out, even though the
        // batches are already marked SUBMITTING (they go back to QUEUED, fenced).
        if !self.claims.may_submit(&self.claim) {
            metrics::counter!(m::SELF_FENCED).increment(1);
            return PostOutcome::NotSent {
                error: "self-fenced: the claim's term ran out before the POST".into(),
            };
        }
        // Each stored batch is a BatchList of one batch; concatenated protobuf messages
        // merge their repeated fields, so the concatenation is one BatchList of all of them.
        let body: Vec<u8> = self
            .batches
            .iter()
            .flat_map(|b| b.serialized_batch.iter().copied())
            .collect();
        if let Err(injected) = dltsub_chaos_points::reached(Event::E6, Phase::Before).await {
            return PostOutcome::NotSent {
                error: injected.to_string(),
            };
        }
        let started = Instant::now();
        let outcome = self
            .client
            .post_batches(
                &self.claim.service_id,
                body,
                self.claims.instance_id(),
                self.claim.epoch,
            )
            .await;
        metrics::histogram!(m::POST_SECONDS).record(started.elapsed().as_secs_f64());
        // The POST happened; an injected error here loses its answer.
        if let Err(injected) = dltsub_chaos_points::reached(Event::E6, Phase::After).await {
            return PostOutcome::InDoubt {
                error: injected.to_string(),
            };
        }
        outcome
    }
}

fn outcome_label(outcome: &PostOutcome) -> &'static str {
    match outcome {
        PostOutcome::Accepted => m::OUTCOME_ACCEPTED,
        PostOutcome::Rejected { .. } => m::OUTCOME_REJECTED,
        PostOutcome::BackPressure { .. } => m::OUTCOME_BACK_PRESSURE,
        PostOutcome::NotSent { error } if error.starts_with("self-fenced") => {
            m::OUTCOME_SELF_FENCED
        }
        PostOutcome::NotSent { .. } => m::OUTCOME_NOT_SENT,
        PostOutcome::InDoubt { .. } => m::OUTCOME_IN_DOUBT,
    }
}

/// A chaos event point of the submission loop (inert unless built with the `chaos`
/// feature); an injected error takes the path of a database error.
async fn chaos_point(event: Event, phase: Phase) -> Result<(), dltsub_store::StoreError> {
    dltsub_chaos_points::reached(event, phase)
        .await
        .map_err(|injected| dltsub_store::StoreError::Injected(injected.to_string()))
}
