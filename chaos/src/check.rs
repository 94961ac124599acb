//! The invariant checker (DESIGN.md §7), from the database (statuses, history events with
//! their epochs) and the simulated ledger (committed order, POST log).

use std::collections::{BTreeMap, HashMap, HashSet};

use dltsub_devnet::Devnet;
use dltsub_store::Store;

/// What the checker found. Every count but `posts_per_batch` and `duplicate_batches` must
/// be zero.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    pub batches: u64,
    /// Accepted batches not COMMITTED, INVALID or CANCELLED.
    pub lost: u64,
    /// COMMITTED in the database but not on the ledger, or the other way round; INVALID
    /// but on the ledger.
    pub disagreements: u64,
    /// Services whose ledger order differs from their acceptance order.
    pub order_violations: u64,
    /// History events written with an epoch older than one written before them for the
    /// same service: a write by a fenced-out holder that was accepted.
    pub stale_writes: u64,
    /// Histogram: POSTs that reached the ledger per batch → number of batches.
    pub posts_per_batch: BTreeMap<usize, u64>,
    /// Batches the ledger received more than once.
    pub duplicate_batches: u64,
    /// Human-readable details of the first problems.
    pub details: Vec<String>,
}

impl Findings {
    /// True when no invariant is broken (duplicates are judged by the scenario).
    pub fn invariants_hold(&self) -> bool {
        self.lost == 0
            && self.disagreements == 0
            && self.order_violations == 0
            && self.stale_writes == 0
    }

    fn note(&mut self, detail: String) {
        if self.details.len() < 10 {
            self.details.push(detail);
        }
    }
}

/// Checks every service of the database against the ledger.
pub async fn check(store: &Store, ledger: &Devnet) -> anyhow::Result<Findings> {
    let mut findings = Findings::default();
    let snapshot = ledger.control().ledger();

    // POSTs that reached the ledger (accepted, or accepted before an injected failure).
    let mut posts: HashMap<String, usize> = HashMap::new();
    for post in ledger.control().posts().entries {
        let reached = post.status == Some(202)
            || matches!(
                post.fault.as_deref(),
                Some("error_500_after_commit" | "drop_after_commit")
            );
        if reached {
            for id in post.batch_ids {
                *posts.entry(id).or_default() += 1;
            }
        }
    }

    for service in store.services(None).await? {
        let service_id = &service.service_id;
        let batches = store.batch_ids_in_order(service_id).await?;
        let on_ledger: Vec<&str> = snapshot
            .ledgers
            .get(service_id)
            .map(|view| view.committed.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let ledger_set: HashSet<&str> = on_ledger.iter().copied().collect();
        let mut committed_in_order = Vec::new();
        for (batch_id, status) in &batches {
            findings.batches += 1;
            let on = ledger_set.contains(batch_id.as_str());
            match status.as_str() {
                "COMMITTED" => {
                    committed_in_order.push(batch_id.as_str());
                    if !on {
                        findings.disagreements += 1;
                        findings.note(format!(
                            "{service_id}: {} COMMITTED in dltsub, not on the ledger",
                            short(batch_id)
                        ));
                    }
                }
                "INVALID" | "CANCELLED" if on => {
                    findings.disagreements += 1;
                    findings.note(format!(
                        "{service_id}: {} {status} in dltsub but on the ledger",
                        short(batch_id)
                    ));
                }
                "INVALID" | "CANCELLED" => {}
                other => {
                    findings.lost += 1;
                    findings.note(format!("{service_id}: {} still {other}", short(batch_id)));
                }
            }
            let count = posts.get(batch_id).copied().unwrap_or(0);
            *findings.posts_per_batch.entry(count).or_default() += 1;
            if count > 1 {
                findings.duplicate_batches += 1;
                findings.note(format!(
                    "{service_id}: {} reached the ledger {count} times",
                    short(batch_id)
                ));
            }
        }
        // Batches on the ledger dltsub does not know as COMMITTED are disagreements too
        // (counted above for INVALID; here for ids it never accepted).
        let known: HashSet<&str> = batches.iter().map(|(id, _)| id.as_str()).collect();
        for id in &on_ledger {
            if !known.contains(id) {
                findings.disagreements += 1;
                findings.note(format!(
                    "{service_id}: {} on the ledger, unknown to dltsub",
                    short(id)
                ));
            }
        }
        // The ledger's distinct ids in first-commit order against the acceptance order.
        let mut seen = HashSet::new();
        let ledger_order: Vec<&str> = on_ledger
            .iter()
            .copied()
            .filter(|id| seen.insert(*id) && known.contains(id))
            .collect();
        if ledger_order != committed_in_order {
            findings.order_violations += 1;
            findings.note(format!(
                "{service_id}: ledger order differs from acceptance order"
            ));
        }

        // Fencing: epochs of a service's writes never go back.
        let mut highest = i64::MIN;
        for (seq, event) in store.service_history(service_id).await? {
            if let Some(epoch) = event.epoch {
                if epoch < highest {
                    findings.stale_writes += 1;
                    findings.note(format!(
                        "{service_id}: seq {seq} {} → {} written at epoch {epoch} after epoch {highest}",
                        event.old_status.as_deref().unwrap_or("-"),
                        event.new_status
                    ));
                }
                highest = highest.max(epoch);
            }
        }
    }
    Ok(findings)
}

fn short(id: &str) -> String {
    format!("{}…", &id[..id.len().min(12)])
}
