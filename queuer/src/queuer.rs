//! The queuer of one instance: the claim tick, its loop, the leader's chores, and the
//! fenced entry points the submission path uses.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use dltsub_chaos_points::{Event, Phase};
use dltsub_store::{
    ClaimTiming, FencedOutcome, HeldClaim, InstanceInfo, InstanceState, LEADER_LEASE,
    PollableBatch, Store, StoreError, SubmittableBatch, Transition,
};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fair_share;
use crate::held::HeldClaims;
use crate::metrics as m;

/// Timings and limits of the queuer, validated by the daemon's configuration.
#[derive(Debug, Clone)]
pub struct QueuerConfig {
    pub timing: ClaimTiming,
    /// Time between two ticks (jittered by ±10%).
    pub renew_interval: Duration,
    /// Subtracted from the fast expiry in the self-fencing deadline.
    pub self_fence_margin: Duration,
    /// Instances silent for this long are deleted from the registry by the leader.
    pub prune_instances_after: Duration,
    /// Terminal batches (COMMITTED, INVALID, CANCELLED) older than this are deleted by the
    /// leader; `None` keeps them forever.
    pub terminal_retention: Option<Duration>,
    /// Most terminal batches deleted per chore run, so retention never makes a long
    /// transaction.
    pub retention_batch_limit: usize,
}

impl QueuerConfig {
    /// Derives the rest from the three claim timings, the way the daemon does.
    pub fn from_timings(
        fast_expiry: Duration,
        slow_expiry: Duration,
        renew_interval: Duration,
    ) -> Self {
        Self {
            timing: ClaimTiming {
                fast_expiry,
                slow_expiry,
                // A heartbeat missed three times running means the instance is gone for
                // the fair share; its claims still move only by expiry.
                instance_stale_after: renew_interval * 3,
            },
            renew_interval,
            self_fence_margin: (fast_expiry / 10).max(Duration::from_millis(50)),
            prune_instances_after: slow_expiry.max(renew_interval * 10),
            terminal_retention: None,
            retention_batch_limit: 1_000,
        }
    }
}

/// What one tick did.
#[derive(Debug, Clone, Default)]
pub struct TickReport {
    pub held: usize,
    pub acquired: Vec<HeldClaim>,
    pub released: Vec<String>,
    /// Claims held at the previous tick that are gone now (taken over after expiry).
    pub lost: Vec<HeldClaim>,
    pub live_instances: usize,
    pub leader: bool,
    /// Batches found mid-submission in services taken over, now IN_DOUBT: the observer
    /// asks the ledger about them before anything is resubmitted.
    pub in_doubt: Vec<i64>,
    /// Holders found gone with batches mid-submission (see `Store::claim_tick`).
    pub gone_holders: Vec<String>,
}

/// One instance's queuer. Owned by its loop; the submission path reads the held claims
/// through [`Queuer::held_claims`].
pub struct Queuer {
    store: Store,
    me: InstanceInfo,
    config: QueuerConfig,
    state: InstanceState,
    held_tx: Arc<watch::Sender<HeldClaims>>,
    ticks: u64,
}

impl Queuer {
    pub fn new(store: Store, me: InstanceInfo, config: QueuerConfig) -> Self {
        let held_tx = Arc::new(watch::Sender::new(HeldClaims::none()));
        Self {
            store,
            me,
            config,
            state: InstanceState::Running,
            held_tx,
            ticks: 0,
        }
    }

    pub fn instance(&self) -> &InstanceInfo {
        &self.me
    }

    /// The claims held as of the last successful tick, updated by every tick.
    pub fn held_claims(&self) -> watch::Receiver<HeldClaims> {
        self.held_tx.subscribe()
    }

    /// A copy of the current held claims.
    pub fn current(&self) -> HeldClaims {
        self.held_tx.borrow().clone()
    }

    /// One claim tick: heartbeat, renew, rebalance and acquire in one transaction, then
    /// the leader lease and, when leader, its chores.
    pub async fn tick(&mut self) -> Result<TickReport, StoreError> {
        // The self-fencing term counts from before the renewal is sent.
        let holding = !self.held_tx.borrow().epochs.is_empty();
        chaos_point(Event::E1, Phase::Before).await?;
        if holding {
            chaos_point(Event::E9, Phase::Before).await?;
        }
        let sent_at = Instant::now();
        let started = std::time::Instant::now();
        let outcome = self
            .store
            .claim_tick(&self.me, self.state, self.config.timing, fair_share::plan)
            .await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                metrics::counter!(m::TICK_ERRORS).increment(1);
                return Err(error);
            }
        };
        chaos_point(Event::E1, Phase::After).await?;
        if holding {
            chaos_point(Event::E9, Phase::After).await?;
        }
        if !outcome.acquired.is_empty() {
            chaos_point(Event::E2, Phase::Before).await?;
        }
        let epochs: BTreeMap<String, i64> = outcome
            .held
            .iter()
            .map(|claim| (claim.service_id.clone(), claim.epoch))
            .collect();
        let previous = self.held_tx.borrow().epochs.clone();
        let lost: Vec<HeldClaim> = previous
            .iter()
            .filter(|(service_id, epoch)| {
                epochs.get(*service_id) != Some(epoch) && !outcome.released.contains(service_id)
            })
            .map(|(service_id, epoch)| HeldClaim {
                service_id: service_id.clone(),
                epoch: *epoch,
            })
            .collect();
        let valid_until = HeldClaims::deadline(
            sent_at,
            self.config.timing.fast_expiry,
            self.config.self_fence_margin,
        );
        self.held_tx.send_replace(HeldClaims {
            epochs,
            valid_until,
        });
        if !outcome.acquired.is_empty() {
            chaos_point(Event::E2, Phase::After).await?;
        }

        metrics::gauge!(m::CLAIMS_HELD).set(outcome.held.len() as f64);
        metrics::counter!(m::CLAIMS_ACQUIRED).increment(outcome.acquired.len() as u64);
        metrics::counter!(m::CLAIMS_RELEASED).increment(outcome.released.len() as u64);
        metrics::counter!(m::CLAIMS_LOST).increment(lost.len() as u64);
        metrics::counter!(m::GONE_HOLDERS).increment(outcome.gone_holders.len() as u64);
        for holder in &outcome.gone_holders {
            tracing::warn!(
                holder.id = %holder,
                "instance {holder} is gone with batches mid-submission: its services are taken over at the fast expiry, the ledger asked about those batches"
            );
        }
        for claim in &lost {
            tracing::warn!(
                service.id = %claim.service_id,
                epoch = claim.epoch,
                "claim on {} lost: taken over after expiry",
                claim.service_id
            );
        }

        let leader = outcome.leader_epoch.is_some();
        metrics::gauge!(m::IS_LEADER).set(if leader { 1.0 } else { 0.0 });
        if leader {
            self.leader_chores().await?;
        }
        self.ticks += 1;
        metrics::histogram!(m::TICK_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(TickReport {
            held: outcome.held.len(),
            acquired: outcome.acquired,
            released: outcome.released,
            lost,
            live_instances: outcome.live.len(),
            leader,
            in_doubt: outcome.in_doubt,
            gone_holders: outcome.gone_holders,
        })
    }

    /// The leader's chores, every tenth tick: pruning silent instances and deleting old
    /// terminal batches. They are cleanup, not part of the claim protocol.
    async fn leader_chores(&mut self) -> Result<(), StoreError> {
        if !self.ticks.is_multiple_of(10) {
            return Ok(());
        }
        let pruned = self
            .store
            .prune_instances(self.config.prune_instances_after)
            .await?;
        if !pruned.is_empty() {
            tracing::info!(count = pruned.len(), "pruned silent instances: {pruned:?}");
        }
        if let Some(retention) = self.config.terminal_retention {
            let deleted = self
                .store
                .delete_terminal_batches(retention, self.config.retention_batch_limit)
                .await?;
            if deleted > 0 {
                tracing::info!(count = deleted, "deleted terminal batches past retention");
            }
        }
        Ok(())
    }

    /// A cloneable handle for the submission path: the held claims and the fenced
    /// writes made under them.
    pub fn handle(&self) -> ClaimsHandle {
        ClaimsHandle {
            store: self.store.clone(),
            instance_id: self.me.instance_id.clone(),
            held_tx: self.held_tx.clone(),
        }
    }

    /// Graceful hand-over: stop acquiring (draining), hand back every claim with nothing
    /// mid-submission so other instances take them on their next tick, give up the leader
    /// lease and leave the registry. Returns the released services.
    pub async fn shutdown(&mut self) -> Result<Vec<String>, StoreError> {
        self.state = InstanceState::Draining;
        let released = self.store.release_idle_claims(&self.me.instance_id).await?;
        metrics::counter!(m::CLAIMS_RELEASED).increment(released.len() as u64);
        self.held_tx.send_modify(|held| {
            for service_id in &released {
                held.epochs.remove(service_id);
            }
        });
        self.store
            .release_lease(LEADER_LEASE, &self.me.instance_id)
            .await?;
        metrics::gauge!(m::IS_LEADER).set(0.0);
        self.store.deregister_instance(&self.me.instance_id).await?;
        tracing::info!(count = released.len(), "released claims for shutdown");
        Ok(released)
    }

    /// Ticks every `renew_interval` (±10% jitter) until `shutdown` is cancelled, then
    /// hands everything back. Once `drain` is cancelled the instance is draining: it keeps
    /// renewing what it holds (its in-flight work must finish under a valid claim) but
    /// acquires nothing, takes no service over and gives up leading. A failed tick is
    /// logged and retried on the next interval; meanwhile the self-fencing deadline runs
    /// out and submissions stop by themselves.
    pub async fn run(mut self, drain: CancellationToken, shutdown: CancellationToken) {
        loop {
            if drain.is_cancelled() {
                self.state = InstanceState::Draining;
            }
            match self.tick().await {
                Ok(report) => {
                    if !report.acquired.is_empty() || !report.released.is_empty() {
                        tracing::info!(
                            held = report.held,
                            acquired = report.acquired.len(),
                            released = report.released.len(),
                            live_instances = report.live_instances,
                            "claims rebalanced"
                        );
                    }
                }
                Err(error) => tracing::error!(%error, "claim tick failed"),
            }
            let pause = jittered(self.config.renew_interval);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                // Tick at once when draining starts, so the registry says so.
                _ = drain.cancelled(), if self.state == InstanceState::Running => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
        if let Err(error) = self.shutdown().await {
            tracing::error!(%error, "releasing claims at shutdown failed; they will expire");
        }
    }
}

/// `interval` ± 10%, so instances started together don't tick in lockstep.
fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..1.1);
    interval.mul_f64(factor)
}

/// What the submission path needs from the queuer: the held claims (with the self-fencing
/// deadline) and the fenced reads and writes made under them. Cheap to clone.
#[derive(Clone)]
pub struct ClaimsHandle {
    store: Store,
    instance_id: String,
    held_tx: Arc<watch::Sender<HeldClaims>>,
}

impl ClaimsHandle {
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The claims held as of the last successful tick; changes wake `changed()`.
    pub fn held_claims(&self) -> watch::Receiver<HeldClaims> {
        self.held_tx.subscribe()
    }

    /// May a submission for this claim start now (held at this epoch, inside the term)?
    pub fn may_submit(&self, claim: &HeldClaim) -> bool {
        self.held_tx
            .borrow()
            .may_submit(&claim.service_id, claim.epoch, Instant::now())
    }

    /// Batches this instance may submit now, at most `limit`, of services it holds at the
    /// epoch of its last tick and while its self-fencing term lasts.
    pub async fn select_submittable(
        &self,
        limit: usize,
    ) -> Result<Vec<SubmittableBatch>, StoreError> {
        let held = self.held_tx.borrow().clone();
        if held.is_empty() || Instant::now() >= held.valid_until {
            return Ok(Vec::new());
        }
        chaos_point(Event::E3, Phase::Before).await?;
        let mut batches = self
            .store
            .select_submittable(&self.instance_id, limit)
            .await?;
        chaos_point(Event::E3, Phase::After).await?;
        let now = Instant::now();
        batches.retain(|batch| held.may_submit(&batch.service_id, batch.epoch, now));
        Ok(batches)
    }

    /// Marks batches SUBMITTING under their claims. Claims that fail the fence are
    /// dropped from the held view at once, so nothing more is started for them.
    pub async fn mark_submitting(
        &self,
        batches: &[(HeldClaim, Vec<i64>)],
    ) -> Result<FencedOutcome, StoreError> {
        chaos_point(Event::E5, Phase::Before).await?;
        let outcome = self
            .store
            .mark_submitting(&self.instance_id, batches)
            .await?;
        self.forget_lost(&outcome.lost);
        // An error here is a mark whose acknowledgement was lost: the batches stay
        // SUBMITTING with no POST, for the stranded sweep to resolve.
        chaos_point(Event::E5, Phase::After).await?;
        Ok(outcome)
    }

    /// Applies status transitions under their claims (see `Store::apply_transitions`);
    /// claims that fail the fence are dropped from the held view at once.
    pub async fn apply_transitions(
        &self,
        transitions: &[(HeldClaim, Vec<Transition>)],
    ) -> Result<FencedOutcome, StoreError> {
        chaos_point(Event::E8, Phase::Before).await?;
        let outcome = self
            .store
            .apply_transitions(&self.instance_id, transitions)
            .await?;
        self.forget_lost(&outcome.lost);
        // An error here is a recorded status whose acknowledgement was lost: the caller
        // retries, and the transition's `from` guard makes the retry a no-op.
        chaos_point(Event::E8, Phase::After).await?;
        Ok(outcome)
    }

    /// Batches of held services waiting for the ledger's verdict, oldest first.
    pub async fn pollable_batches(&self, limit: usize) -> Result<Vec<PollableBatch>, StoreError> {
        self.store.pollable_batches(&self.instance_id, limit).await
    }

    /// Turns this instance's stranded SUBMITTING batches IN_DOUBT (see
    /// `Store::sweep_stranded_submitting`).
    pub async fn sweep_stranded_submitting(
        &self,
        older_than: std::time::Duration,
        in_flight: &[i64],
    ) -> Result<Vec<i64>, StoreError> {
        self.store
            .sweep_stranded_submitting(&self.instance_id, older_than, in_flight)
            .await
    }

    /// Stops all work on claims a fenced write found lost.
    pub fn forget_lost(&self, lost: &[HeldClaim]) {
        if lost.is_empty() {
            return;
        }
        metrics::counter!(m::FENCED_WRITES_REJECTED).increment(lost.len() as u64);
        metrics::counter!(m::CLAIMS_LOST).increment(lost.len() as u64);
        self.held_tx.send_modify(|held| {
            for claim in lost {
                if held.epochs.get(&claim.service_id) == Some(&claim.epoch) {
                    held.epochs.remove(&claim.service_id);
                }
            }
        });
        for claim in lost {
            tracing::warn!(
                service.id = %claim.service_id,
                epoch = claim.epoch,
                "fenced write refused for {}: claim at epoch {} no longer ours",
                claim.service_id,
                claim.epoch
            );
        }
    }
}

/// A chaos event point (inert unless built with the `chaos` feature); an injected error
/// takes the path of a database error at that point.
async fn chaos_point(event: Event, phase: Phase) -> Result<(), StoreError> {
    dltsub_chaos_points::reached(event, phase)
        .await
        .map_err(|injected| StoreError::Injected(injected.to_string()))
}
