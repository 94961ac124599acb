//! Fenced reads and writes of the submission path: selecting the batches an instance may
//! submit now, and marking them SUBMITTING.
//!
//! **Fencing.** Every write made on behalf of a claim carries the claim's epoch and is
//! conditional, in the same transaction, on `claimant = me AND epoch = e` with the claim row
//! locked (`FOR SHARE` on PostgreSQL; SQLite's single writer serialises anyway), so a
//! concurrent takeover — which updates the row — is ordered entirely before or after it. A
//! claim that fails the check is reported back as lost: the caller stops all work on that
//! service and writes nothing more for it.

use std::collections::{HashMap, HashSet};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Binary, Text};
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::dialect::Dialect;
use crate::rows::NewEventRow;
use crate::{BatchStatus, HeldClaim, Store, StoreError};

/// A batch the queuer may hand to the submitter.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct SubmittableBatch {
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    #[diesel(sql_type = Text)]
    pub service_id: String,
    #[diesel(sql_type = Text)]
    pub batch_id: String,
    /// The epoch of the claim under which it was selected (the fencing token).
    #[diesel(sql_type = BigInt)]
    pub epoch: i64,
    #[diesel(sql_type = Binary)]
    pub serialized_batch: Vec<u8>,
    /// Submissions started so far (before this one).
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
}

/// The result of a fenced write over several claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FencedOutcome {
    /// Batches the write applied to, by seq.
    pub applied: Vec<i64>,
    /// Claims that failed the fence: taken over (another claimant or epoch) or, for
    /// writes that start a submission, past their fast expiry.
    pub lost: Vec<HeldClaim>,
}

#[derive(QueryableByName)]
struct MarkedRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Text)]
    service_id: String,
}

/// Seqs per `IN (…)` list.
const SEQ_CHUNK: usize = 1_000;

impl Store {
    /// The batches `instance_id` may submit now, oldest first, at most `limit`: of every
    /// service it holds and that is not paused, the batches among the first
    /// `max_in_flight` unfinished ones (in `seq` order) that are QUEUED and past their
    /// backoff, and behind no earlier batch that is SUBMITTING, IN_DOUBT or waiting out a
    /// backoff — a batch never overtakes an earlier one whose POST may be under way or must
    /// be retried. One statement for all held services.
    pub async fn select_submittable(
        &self,
        instance_id: &str,
        limit: usize,
    ) -> Result<Vec<SubmittableBatch>, StoreError> {
        let now = self.now();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        with_conn!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            Ok(conn.select_submittable(instance_id, now_us, limit).await?)
        })
    }

    /// Marks batches SUBMITTING (attempt + 1, epoch, instance) for every claim still held
    /// at its epoch and inside its fast expiry; the others come back as lost and nothing
    /// of theirs changes. Only batches still QUEUED change. One transaction of a few
    /// statements, whatever the number of batches and services.
    pub async fn mark_submitting(
        &self,
        instance_id: &str,
        batches: &[(HeldClaim, Vec<i64>)],
    ) -> Result<FencedOutcome, StoreError> {
        let now = self.now();
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let service_ids: Vec<&str> = batches
                .iter()
                .map(|(claim, _)| claim.service_id.as_str())
                .collect();
            // Starting a submission needs the claim inside its fast expiry: past it, the
            // service may be taken over as soon as nothing of it is SUBMITTING.
            let rows = conn
                .lock_held_claims(instance_id, &service_ids, Some(now_us))
                .await?;
            let held: HashSet<(String, i64)> = rows.into_iter().collect();
            let mut outcome = FencedOutcome::default();
            let mut seqs: Vec<i64> = Vec::new();
            let mut epoch_of: HashMap<&str, i64> = HashMap::new();
            for (claim, claim_seqs) in batches {
                if held.contains(&(claim.service_id.clone(), claim.epoch)) {
                    seqs.extend(claim_seqs);
                    epoch_of.insert(&claim.service_id, claim.epoch);
                } else {
                    outcome.lost.push(claim.clone());
                }
            }
            let mut marked: Vec<MarkedRow> = Vec::new();
            for chunk in seqs.chunks(SEQ_CHUNK) {
                // The epoch is copied from the claim row, which this transaction has just
                // checked and locked, so each batch gets its own service's epoch in one
                // statement. The EXISTS keeps a seq of a service I don't hold untouched.
                let placeholders: Vec<String> =
                    (0..chunk.len()).map(|i| format!("${}", i + 3)).collect();
                let sql = format!(
                    "UPDATE batch_statuses \
                        SET status = 'SUBMITTING', attempts = attempts + 1, submitted_by = $1, \
                            updated_at_us = $2, \
                            submit_epoch = (SELECT c.epoch FROM service_id_claims c \
                                             WHERE c.service_id = batch_statuses.service_id) \
                      WHERE status = 'QUEUED' AND seq IN ({}) \
                        AND EXISTS (SELECT 1 FROM service_id_claims c \
                                     WHERE c.service_id = batch_statuses.service_id \
                                       AND c.claimant = $1) \
                  RETURNING seq, service_id",
                    placeholders.join(", ")
                );
                let mut query = diesel::sql_query(sql)
                    .into_boxed()
                    .bind::<Text, _>(instance_id)
                    .bind::<BigInt, _>(now_us);
                for seq in chunk {
                    query = query.bind::<BigInt, _>(*seq);
                }
                marked.extend(query.load::<MarkedRow>(conn).await?);
            }
            let events: Vec<NewEventRow<'_>> = marked
                .iter()
                .map(|row| NewEventRow {
                    seq: row.seq,
                    old_status: Some(BatchStatus::Queued.as_str()),
                    new_status: BatchStatus::Submitting.as_str(),
                    epoch: epoch_of.get(row.service_id.as_str()).copied(),
                    instance_id: Some(instance_id),
                    detail: None,
                    at_us: now_us,
                })
                .collect();
            conn.insert_events(&events).await?;
            outcome.applied = marked.into_iter().map(|row| row.seq).collect();
            outcome.applied.sort_unstable();
            Ok(outcome)
        })
    }
}
