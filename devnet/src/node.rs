//! The simulated node: one [`Ledger`] per service, the fault knobs, the pause, the restart.
//!
//! A ledger is one mutex-protected state and two notifications: `wake` tells its committer
//! task that work arrived, `changed` tells `wait`ing status requests that statuses moved.
//! Every operation on it is O(batches touched); nothing scans the history or the ledger per
//! request, so devnet stays far faster than anything it is used to test.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use dltsub_wire::{BatchList, BatchStatus};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::chance::{self, Draw};
use crate::config::{ConfigError, DevnetConfig, Dialect, Faults, FaultsPatch};
use crate::inspect::{DevnetStats, LedgerSnapshot, LedgerStats, LedgerView, PostLogStore};

/// A transaction payload starting with these bytes makes its batch Invalid: the
/// deterministic rule tests use.
pub const INVALID_PAYLOAD_PREFIX: &[u8] = b"invalid";

/// The error message of a transaction made Invalid by [`INVALID_PAYLOAD_PREFIX`].
pub const INVALID_PAYLOAD_MESSAGE: &str = "devnet: transaction payload starts with \"invalid\"";

/// The error message of a transaction made Invalid by `invalid_fraction`.
pub const INVALID_FRACTION_MESSAGE: &str =
    "devnet: transaction rejected at random (invalid_fraction)";

/// Why a batch is Invalid.
#[derive(Debug)]
pub(crate) struct InvalidTxn {
    pub transaction_id: String,
    pub message: String,
}

/// A batch's status as a status route reports it.
#[derive(Debug, Clone)]
pub(crate) struct StatusView {
    pub id: String,
    pub status: BatchStatus,
    pub transaction_ids: Arc<[String]>,
    pub invalid: Option<Arc<InvalidTxn>>,
    pub timestamp: SystemTime,
}

/// The limits copied into each ledger.
#[derive(Debug, Clone, Copy)]
struct Limits {
    history: usize,
    high: usize,
    low: usize,
    ledger: usize,
}

/// The whole simulated node.
pub(crate) struct Node {
    pub dialect: Dialect,
    pub seed: u64,
    limits: Limits,
    faults: RwLock<Faults>,
    paused: watch::Sender<bool>,
    ledgers: RwLock<HashMap<String, Arc<Ledger>>>,
    pub posts: PostLogStore,
    restarts: AtomicU64,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
}

impl Node {
    pub fn new(config: &DevnetConfig, shutdown: CancellationToken) -> Arc<Self> {
        let (paused, _) = watch::channel(config.faults.paused);
        Arc::new(Self {
            dialect: config.dialect,
            seed: config.seed,
            limits: Limits {
                history: config.history_limit,
                high: config.backpressure_high,
                low: config.backpressure_low,
                ledger: config.ledger_limit,
            },
            faults: RwLock::new(config.faults.clone()),
            paused,
            ledgers: RwLock::new(HashMap::new()),
            posts: PostLogStore::new(config.post_log_limit),
            restarts: AtomicU64::new(0),
            shutdown,
            tracker: TaskTracker::new(),
        })
    }

    pub fn faults(&self) -> Faults {
        self.faults
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn update_faults(&self, patch: &FaultsPatch) -> Result<Faults, ConfigError> {
        let mut faults = self.faults.write().unwrap_or_else(|e| e.into_inner());
        let mut next = faults.clone();
        next.apply(patch);
        next.validate()?;
        *faults = next.clone();
        self.paused.send_if_modified(|paused| {
            let modified = *paused != next.paused;
            *paused = next.paused;
            modified
        });
        Ok(next)
    }

    pub fn set_faults(&self, faults: Faults) -> Result<(), ConfigError> {
        faults.validate()?;
        let patch = FaultsPatch {
            response_latency: Some(faults.response_latency),
            commit_latency: Some(faults.commit_latency),
            invalid_fraction: Some(faults.invalid_fraction),
            error_500_before: Some(faults.error_500_before),
            error_503_before: Some(faults.error_503_before),
            error_500_after_commit: Some(faults.error_500_after_commit),
            drop_after_commit: Some(faults.drop_after_commit),
            paused: Some(faults.paused),
        };
        self.update_faults(&patch).map(|_| ())
    }

    /// A reproducible draw in `[0, 1)` (see [`crate::chance`]).
    pub fn draw(&self, draw: Draw, key: &str, counter: u64) -> f64 {
        chance::unit(self.seed, draw, key, counter)
    }

    /// Waits out a pause. False when devnet is shutting down instead.
    pub async fn unpaused(&self) -> bool {
        let mut paused = self.paused.subscribe();
        tokio::select! {
            result = paused.wait_for(|p| !*p) => result.is_ok(),
            () = self.shutdown.cancelled() => false,
        }
    }

    /// The ledger of `key`, created (with its committer task) on first use.
    pub fn ledger(self: &Arc<Self>, key: &str) -> Arc<Ledger> {
        if let Some(ledger) = self.existing_ledger(key) {
            return ledger;
        }
        let mut ledgers = self.ledgers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(ledger) = ledgers.get(key) {
            return ledger.clone();
        }
        let ledger = Arc::new(Ledger::new(key, self.dialect, self.limits));
        ledgers.insert(key.to_owned(), ledger.clone());
        self.tracker
            .spawn(run_committer(self.clone(), ledger.clone()));
        ledger
    }

    pub fn existing_ledger(&self, key: &str) -> Option<Arc<Ledger>> {
        let ledgers = self.ledgers.read().unwrap_or_else(|e| e.into_inner());
        ledgers.get(key).cloned()
    }

    fn all_ledgers(&self) -> Vec<Arc<Ledger>> {
        let ledgers = self.ledgers.read().unwrap_or_else(|e| e.into_inner());
        ledgers.values().cloned().collect()
    }

    /// A node restart: every batch in flight is forgotten (reads Unknown, never commits) and
    /// the in-memory status history is lost. Committed batches stay in the ledger. Returns
    /// how many batches were forgotten.
    pub fn restart(&self) -> u64 {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.all_ledgers()
            .iter()
            .map(|ledger| ledger.restart())
            .sum()
    }

    pub fn ledger_snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            ledgers: self
                .all_ledgers()
                .iter()
                .map(|ledger| (ledger.key.clone(), ledger.view()))
                .collect(),
        }
    }

    pub fn stats(&self) -> DevnetStats {
        DevnetStats {
            dialect: self.dialect,
            seed: self.seed,
            restarts: self.restarts.load(Ordering::Relaxed),
            ledgers: self
                .all_ledgers()
                .iter()
                .map(|ledger| (ledger.key.clone(), ledger.stats()))
                .collect::<BTreeMap<_, _>>(),
        }
    }
}

/// What the ledger knows happened to an id it accepted (not the node's memory: devnet's own
/// bookkeeping, for duplicates and for Sawtooth's block store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    InFlight,
    Committed,
    Invalid,
    Lost,
}

struct HistoryEntry {
    status: BatchStatus,
    transaction_ids: Arc<[String]>,
    invalid: Option<Arc<InvalidTxn>>,
    timestamp: SystemTime,
}

struct Queued {
    id: Arc<str>,
    exec_at: Instant,
    commit_at: Instant,
    invalid: Option<Arc<InvalidTxn>>,
}

struct LedgerState {
    /// The node's status history (the real nodes keep it in memory, capped).
    history: HashMap<Arc<str>, HistoryEntry>,
    /// History ids, oldest first, for eviction.
    history_order: VecDeque<Arc<str>>,
    /// Accepted batches in order; `queue[..executed]` have executed. Execution and commit
    /// times never decrease along the queue, so both happen in acceptance order.
    queue: VecDeque<Queued>,
    executed: usize,
    in_flight: usize,
    accepting: bool,
    last_exec_at: Instant,
    last_commit_at: Instant,
    accept_seq: u64,
    /// Every id accepted (up to `ledger_limit`, oldest forgotten first) and its fate.
    known: HashMap<Arc<str>, Fate>,
    known_order: VecDeque<Arc<str>>,
    /// Committed ids in commit order (up to `ledger_limit`).
    committed: VecDeque<Arc<str>>,
    truncated: u64,
    stats: LedgerStats,
}

/// One batch as accepted: its outcome is decided on arrival (it depends only on the batch and
/// the seed) and applied when it executes.
pub(crate) struct Incoming {
    id: Arc<str>,
    transaction_ids: Arc<[String]>,
    invalid: Option<Arc<InvalidTxn>>,
}

/// The answer to an acceptance.
pub(crate) enum Acceptance {
    /// Accepted; the ids already known (duplicates) listed.
    Accepted { duplicates: Vec<String> },
    /// Back-pressure: nothing was accepted.
    Full,
}

/// One service's ledger.
pub(crate) struct Ledger {
    pub key: String,
    dialect: Dialect,
    limits: Limits,
    state: Mutex<LedgerState>,
    /// Statuses changed: wakes `wait`ing status requests.
    changed: Notify,
    /// Work arrived: wakes the committer.
    wake: Notify,
    /// POSTs so far; the POST's number keys its fault draws.
    pub posts: AtomicU64,
    /// Requests so far; keys the response latency draws.
    pub requests: AtomicU64,
}

impl Ledger {
    fn new(key: &str, dialect: Dialect, limits: Limits) -> Self {
        let now = Instant::now();
        Self {
            key: key.to_owned(),
            dialect,
            limits,
            state: Mutex::new(LedgerState {
                history: HashMap::new(),
                history_order: VecDeque::new(),
                queue: VecDeque::new(),
                executed: 0,
                in_flight: 0,
                accepting: true,
                last_exec_at: now,
                last_commit_at: now,
                accept_seq: 0,
                known: HashMap::new(),
                known_order: VecDeque::new(),
                committed: VecDeque::new(),
                truncated: 0,
                stats: LedgerStats {
                    accepting: true,
                    ..LedgerStats::default()
                },
            }),
            changed: Notify::new(),
            wake: Notify::new(),
            posts: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        // Every mutation below leaves the state consistent before it can panic; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prepares a BatchList for [`Ledger::accept`], outside the lock: ids, transaction ids,
    /// and whether each batch will be Invalid.
    pub fn incoming(node: &Node, list: &BatchList, faults: &Faults) -> Vec<Incoming> {
        list.batches
            .iter()
            .map(|batch| {
                let by_payload = batch
                    .transactions
                    .iter()
                    .find(|txn| txn.payload.starts_with(INVALID_PAYLOAD_PREFIX))
                    .map(|txn| InvalidTxn {
                        transaction_id: txn.header_signature.clone(),
                        message: INVALID_PAYLOAD_MESSAGE.to_owned(),
                    });
                let invalid = by_payload.or_else(|| {
                    let drawn = faults.invalid_fraction > 0.0
                        && node.draw(Draw::Invalid, &batch.header_signature, 0)
                            < faults.invalid_fraction;
                    drawn.then(|| InvalidTxn {
                        transaction_id: batch
                            .transactions
                            .first()
                            .map(|txn| txn.header_signature.clone())
                            .unwrap_or_default(),
                        message: INVALID_FRACTION_MESSAGE.to_owned(),
                    })
                });
                Incoming {
                    id: Arc::from(batch.header_signature.as_str()),
                    transaction_ids: batch
                        .transactions
                        .iter()
                        .map(|txn| txn.header_signature.clone())
                        .collect(),
                    invalid: invalid.map(Arc::new),
                }
            })
            .collect()
    }

    /// Accepts batches, or refuses them all under back-pressure.
    pub fn accept(&self, node: &Node, batches: Vec<Incoming>, faults: &Faults) -> Acceptance {
        let now = Instant::now();
        let timestamp = SystemTime::now();
        let mut duplicates = Vec::new();
        {
            let mut state = self.lock();
            let state = &mut *state;
            let full = match self.dialect {
                Dialect::Scabbard => !state.accepting,
                Dialect::Sawtooth => state.in_flight >= self.limits.high,
            };
            if full {
                state.stats.rejected_backpressure += 1;
                return Acceptance::Full;
            }
            for batch in batches {
                let known = state.known.get(&batch.id).copied();
                if matches!(known, Some(Fate::InFlight | Fate::Committed)) {
                    state.stats.duplicates += 1;
                    duplicates.push(batch.id.to_string());
                    // Sawtooth's validator drops a batch it already has; scabbard executes
                    // it again.
                    if self.dialect == Dialect::Sawtooth {
                        continue;
                    }
                }
                match state.history.get_mut(&batch.id) {
                    Some(entry) => {
                        // Scabbard's history upserts: same entry and timestamp, Pending again.
                        entry.status = BatchStatus::Pending;
                        entry.invalid = None;
                        entry.transaction_ids = batch.transaction_ids.clone();
                    }
                    None => {
                        state.history.insert(
                            batch.id.clone(),
                            HistoryEntry {
                                status: BatchStatus::Pending,
                                transaction_ids: batch.transaction_ids.clone(),
                                invalid: None,
                                timestamp,
                            },
                        );
                        state.history_order.push_back(batch.id.clone());
                        if state.history_order.len() > self.limits.history
                            && let Some(oldest) = state.history_order.pop_front()
                        {
                            state.history.remove(&oldest);
                        }
                    }
                }
                match known {
                    Some(_) => {
                        state.known.insert(batch.id.clone(), Fate::InFlight);
                    }
                    None => {
                        state.known.insert(batch.id.clone(), Fate::InFlight);
                        state.known_order.push_back(batch.id.clone());
                        if state.known_order.len() > self.limits.ledger
                            && let Some(oldest) = state.known_order.pop_front()
                        {
                            state.known.remove(&oldest);
                        }
                    }
                }
                let latency = faults.commit_latency.sample(node.draw(
                    Draw::CommitLatency,
                    &self.key,
                    state.accept_seq,
                ));
                state.accept_seq += 1;
                let exec_at = state.last_exec_at.max(now + latency / 2);
                let commit_at = state.last_commit_at.max(now + latency).max(exec_at);
                state.last_exec_at = exec_at;
                state.last_commit_at = commit_at;
                state.queue.push_back(Queued {
                    id: batch.id,
                    exec_at,
                    commit_at,
                    invalid: batch.invalid,
                });
                state.in_flight += 1;
                state.stats.accepted += 1;
            }
            if self.dialect == Dialect::Scabbard && state.in_flight >= self.limits.high {
                state.accepting = false;
            }
        }
        self.wake.notify_one();
        Acceptance::Accepted { duplicates }
    }

    /// Executes and commits what is due at `now`. Returns the next due time.
    fn process(&self, now: Instant) -> Option<Instant> {
        let mut changed = false;
        let next = {
            let mut state = self.lock();
            let state = &mut *state;
            while let Some(queued) = state.queue.get(state.executed)
                && queued.exec_at <= now
            {
                state.executed += 1;
                changed = true;
                if let Some(entry) = state.history.get_mut(&queued.id)
                    && entry.status == BatchStatus::Pending
                {
                    entry.status = if queued.invalid.is_some() {
                        BatchStatus::Invalid
                    } else {
                        BatchStatus::Valid
                    };
                    entry.invalid = queued.invalid.clone();
                }
                if queued.invalid.is_some() {
                    state.in_flight -= 1;
                    state.stats.invalid += 1;
                    if let Some(fate) = state.known.get_mut(&queued.id) {
                        *fate = Fate::Invalid;
                    }
                }
            }
            while state.executed > 0
                && let Some(front) = state.queue.front()
                && front.commit_at <= now
            {
                let Some(queued) = state.queue.pop_front() else {
                    break;
                };
                state.executed -= 1;
                changed = true;
                if queued.invalid.is_some() {
                    continue;
                }
                if let Some(entry) = state.history.get_mut(&queued.id)
                    && entry.status == BatchStatus::Valid
                {
                    entry.status = BatchStatus::Committed;
                }
                if let Some(fate) = state.known.get_mut(&queued.id) {
                    *fate = Fate::Committed;
                }
                state.committed.push_back(queued.id);
                if state.committed.len() > self.limits.ledger {
                    state.committed.pop_front();
                    state.truncated += 1;
                }
                state.in_flight -= 1;
                state.stats.committed += 1;
            }
            if self.dialect == Dialect::Scabbard
                && !state.accepting
                && state.in_flight < self.limits.low
            {
                state.accepting = true;
            }
            let next_exec = state.queue.get(state.executed).map(|q| q.exec_at);
            let next_commit = (state.executed > 0)
                .then(|| state.queue.front().map(|q| q.commit_at))
                .flatten();
            match (next_exec, next_commit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        if changed {
            self.changed.notify_waiters();
        }
        next
    }

    fn restart(&self) -> u64 {
        let forgotten = {
            let mut state = self.lock();
            let state = &mut *state;
            let forgotten = state.in_flight as u64;
            for queued in state.queue.drain(..) {
                if let Some(fate) = state.known.get_mut(&queued.id)
                    && *fate == Fate::InFlight
                {
                    *fate = Fate::Lost;
                }
            }
            state.executed = 0;
            state.in_flight = 0;
            // The forgotten batches no longer hold back the next ones.
            let now = Instant::now();
            state.last_exec_at = now;
            state.last_commit_at = now;
            state.accepting = true;
            state.history.clear();
            state.history_order.clear();
            state.stats.forgotten += forgotten;
            forgotten
        };
        self.changed.notify_waiters();
        forgotten
    }

    /// The current statuses of `ids`, in the order asked.
    pub fn statuses(&self, ids: &[String]) -> Vec<StatusView> {
        let state = self.lock();
        let now = SystemTime::now();
        ids.iter()
            .map(|id| match state.history.get(id.as_str()) {
                Some(entry) => StatusView {
                    id: id.clone(),
                    status: entry.status,
                    transaction_ids: entry.transaction_ids.clone(),
                    invalid: entry.invalid.clone(),
                    timestamp: entry.timestamp,
                },
                None => {
                    // Sawtooth answers COMMITTED from its block store for any batch in a
                    // block, however old; scabbard only knows its in-memory history.
                    let in_block = self.dialect == Dialect::Sawtooth
                        && state.known.get(id.as_str()) == Some(&Fate::Committed);
                    StatusView {
                        id: id.clone(),
                        status: if in_block {
                            BatchStatus::Committed
                        } else {
                            BatchStatus::Unknown
                        },
                        transaction_ids: Arc::from(Vec::new()),
                        invalid: None,
                        timestamp: now,
                    }
                }
            })
            .collect()
    }

    /// The statuses of `ids` once all are final (Committed or Invalid), or at `deadline`
    /// (or shutdown) as they are then. Woken by status changes, never polling.
    pub async fn wait_statuses(
        &self,
        ids: &[String],
        deadline: Option<Instant>,
        shutdown: &CancellationToken,
    ) -> Vec<StatusView> {
        let Some(deadline) = deadline else {
            return self.statuses(ids);
        };
        loop {
            // Register for the wake-up before reading, so a change between the read and the
            // wait is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let views = self.statuses(ids);
            if views.iter().all(|view| view.status.is_final()) {
                return views;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => return self.statuses(ids),
                () = shutdown.cancelled() => return self.statuses(ids),
            }
        }
    }

    fn view(&self) -> LedgerView {
        let state = self.lock();
        LedgerView {
            committed: state.committed.iter().map(|id| id.to_string()).collect(),
            committed_total: state.stats.committed,
            truncated: state.truncated,
        }
    }

    fn stats(&self) -> LedgerStats {
        let state = self.lock();
        LedgerStats {
            posts: self.posts.load(Ordering::Relaxed),
            in_flight: state.in_flight as u64,
            accepting: state.accepting,
            ..state.stats.clone()
        }
    }
}

/// Executes and commits a ledger's batches when they are due; stops on shutdown and does
/// nothing while paused.
async fn run_committer(node: Arc<Node>, ledger: Arc<Ledger>) {
    let mut paused = node.paused.subscribe();
    loop {
        tokio::select! {
            result = paused.wait_for(|p| !*p) => if result.is_err() { return },
            () = node.shutdown.cancelled() => return,
        }
        let next = ledger.process(Instant::now());
        let due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = due => {}
            () = ledger.wake.notified() => {}
            _ = paused.changed() => {}
            () = node.shutdown.cancelled() => return,
        }
    }
}
