//! What the inspection routes (`/_devnet/ledger`, `/_devnet/posts`, `/_devnet/stats`) and
//! [`crate::DevnetControl`] report. Every type is `Deserialize` too, so tests and the chaos
//! checker can read the JSON back into them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::Dialect;

/// The committed batches of every ledger, in commit order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSnapshot {
    /// Keyed by ledger: `circuit::service` for scabbard, `sawtooth` for Sawtooth.
    pub ledgers: BTreeMap<String, LedgerView>,
}

/// One ledger's committed batches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerView {
    /// Ids in commit order. A scabbard duplicate appears once per execution.
    pub committed: Vec<String>,
    /// Commits since start, including those no longer listed.
    pub committed_total: u64,
    /// The oldest commits dropped from `committed` to bound memory (`ledger_limit`).
    pub truncated: u64,
}

/// Counters of one ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerStats {
    /// POSTs to this ledger, whatever their answer.
    pub posts: u64,
    /// Batches accepted (answered 202, or accepted before an injected failure), duplicates
    /// included.
    pub accepted: u64,
    /// Batches received again while known: re-executed on scabbard, dropped on Sawtooth.
    pub duplicates: u64,
    pub committed: u64,
    pub invalid: u64,
    /// Accepted and neither committed nor invalid yet.
    pub in_flight: u64,
    /// Batches in flight forgotten by restarts.
    pub forgotten: u64,
    /// POSTs answered 429.
    pub rejected_backpressure: u64,
    /// False while scabbard's back-pressure holds (until in-flight drops below the low mark).
    pub accepting: bool,
}

/// Counters of the whole devnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevnetStats {
    pub dialect: Dialect,
    pub seed: u64,
    pub restarts: u64,
    pub ledgers: BTreeMap<String, LedgerStats>,
}

/// One POST to a ledger route, whatever became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostRecord {
    /// Order of arrival, from 0.
    pub seq: u64,
    /// Arrival, microseconds since the Unix epoch.
    pub time_us: u64,
    pub ledger: String,
    /// Ids of the BatchList, empty if the body was refused.
    pub batch_ids: Vec<String>,
    /// Ids this ledger already knew (see [`LedgerStats::duplicates`]).
    pub duplicates: Vec<String>,
    /// The `X-Dltsub-Instance` request header.
    pub instance: Option<String>,
    /// The `X-Dltsub-Epoch` request header.
    pub epoch: Option<String>,
    /// The HTTP status answered; `None` when the connection was dropped without a response.
    pub status: Option<u16>,
    /// The injected fault, if any: `error_500_before`, `error_503_before`,
    /// `error_500_after_commit`, `drop_after_commit`.
    pub fault: Option<String>,
}

/// The POST log: the last `post_log_limit` POSTs, and how many came before them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostLog {
    /// POSTs answered (or dropped) since start.
    pub total: u64,
    /// The oldest POSTs no longer in `entries`.
    pub evicted: u64,
    pub entries: Vec<PostRecord>,
}

/// The bounded log behind `/_devnet/posts`.
pub(crate) struct PostLogStore {
    limit: usize,
    inner: Mutex<PostLogInner>,
}

struct PostLogInner {
    /// Sequence numbers handed out (POSTs arrived).
    arrived: u64,
    /// Records pushed (POSTs answered or dropped).
    recorded: u64,
    entries: VecDeque<PostRecord>,
}

impl PostLogStore {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(PostLogInner {
                arrived: 0,
                recorded: 0,
                entries: VecDeque::new(),
            }),
        }
    }

    /// Reserves the next sequence number (taken on arrival, so the log is in arrival order
    /// even though records are pushed when the answer is known).
    pub(crate) fn next_seq(&self) -> u64 {
        let mut inner = self.lock();
        inner.arrived += 1;
        inner.arrived - 1
    }

    pub(crate) fn push(&self, record: PostRecord) {
        let mut inner = self.lock();
        inner.recorded += 1;
        // Records arrive slightly out of order (each when its answer is known); insert in
        // place so readers see arrival order. The displacement is at most the concurrency.
        let at = inner
            .entries
            .iter()
            .rposition(|r| r.seq < record.seq)
            .map_or(0, |i| i + 1);
        inner.entries.insert(at, record);
        while inner.entries.len() > self.limit {
            inner.entries.pop_front();
        }
    }

    pub(crate) fn snapshot(&self) -> PostLog {
        let inner = self.lock();
        let entries: Vec<_> = inner.entries.iter().cloned().collect();
        PostLog {
            total: inner.recorded,
            evicted: inner.recorded - entries.len() as u64,
            entries,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PostLogInner> {
        // A panic while holding this lock cannot leave the log inconsistent; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}
