//! Status transitions after the ledger answered, and what the observer polls.
//!
//! Every transition is fenced like `mark_submitting` (see `submission.rs`): applied only for
//! claims still held at their epoch, with the claim rows locked for the transaction, and
//! only if the batch is still in the status the caller saw (`from`), so two observers of
//! one instance, or a retry, never apply a transition twice. All transitions of a poll go
//! in one statement through `UPDATE … FROM (VALUES …)`, which both backends accept.

use std::collections::HashMap;
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::dialect::Dialect;
use crate::rows::NewEventRow;
use crate::{BatchStatus, FencedOutcome, HeldClaim, Store, StoreError};

/// What to do with `unknown_since_us`, the start of a run of Unknown answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownSince {
    /// Leave it as it is.
    #[default]
    Keep,
    /// The ledger said Unknown: start the run now unless one is running.
    Mark,
    /// The ledger knows the batch (or it is being resubmitted): end the run.
    Clear,
}

/// One batch's move from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub seq: i64,
    pub from: BatchStatus,
    pub to: BatchStatus,
    /// The ledger's status message (JSON), stored when given.
    pub dlt_message: Option<String>,
    /// Why the last attempt failed; cleared when `None`.
    pub last_error: Option<String>,
    /// For a move back to QUEUED: not submittable before `now + retry_after`.
    pub retry_after: Option<Duration>,
    pub unknown_since: UnknownSince,
    /// Written to the history event.
    pub detail: Option<String>,
}

impl Transition {
    pub fn new(seq: i64, from: BatchStatus, to: BatchStatus) -> Self {
        Self {
            seq,
            from,
            to,
            dlt_message: None,
            last_error: None,
            retry_after: None,
            unknown_since: UnknownSince::Keep,
            detail: None,
        }
    }
}

/// A batch the observer asks the ledger about.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct PollableBatch {
    pub seq: i64,
    pub service_id: String,
    pub batch_id: String,
    pub status: String,
    pub unknown_since_us: Option<i64>,
    pub submit_epoch: Option<i64>,
    /// The database clock when this was read (for the Unknown grace period).
    pub read_at_us: i64,
}

#[derive(QueryableByName)]
struct ChangedRow {
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// Rows of VALUES per statement: 8 parameters each, well under both backends' limits.
const TRANSITION_CHUNK: usize = 1_000;

fn unknown_code(unknown: UnknownSince) -> i32 {
    match unknown {
        UnknownSince::Keep => 0,
        UnknownSince::Mark => 1,
        UnknownSince::Clear => 2,
    }
}

impl Store {
    /// Applies transitions grouped by the claim they are made under. Claims no longer held
    /// at their epoch come back in `lost` and nothing of theirs changes; a batch no longer
    /// in its `from` status is skipped (someone else moved it first). `applied` lists the
    /// seqs that changed.
    pub async fn apply_transitions(
        &self,
        instance_id: &str,
        transitions: &[(HeldClaim, Vec<Transition>)],
    ) -> Result<FencedOutcome, StoreError> {
        let now = self.now();
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let service_ids: Vec<&str> = transitions
                .iter()
                .map(|(claim, _)| claim.service_id.as_str())
                .collect();
            let held: std::collections::HashSet<(String, i64)> = conn
                .lock_held_claims(instance_id, &service_ids, None)
                .await?
                .into_iter()
                .collect();
            let mut outcome = FencedOutcome::default();
            let mut todo: Vec<&Transition> = Vec::new();
            let mut epoch_of: HashMap<i64, i64> = HashMap::new();
            for (claim, claim_transitions) in transitions {
                if held.contains(&(claim.service_id.clone(), claim.epoch)) {
                    for transition in claim_transitions {
                        epoch_of.insert(transition.seq, claim.epoch);
                        todo.push(transition);
                    }
                } else {
                    outcome.lost.push(claim.clone());
                }
            }
            let by_seq: HashMap<i64, &Transition> = todo.iter().map(|t| (t.seq, *t)).collect();
            let mut changed: Vec<ChangedRow> = Vec::new();
            for chunk in todo.chunks(TRANSITION_CHUNK) {
                let rows: Vec<String> = (0..chunk.len())
                    .map(|row| {
                        let first = 2 + row * 7;
                        let params: Vec<String> =
                            (first..first + 7).map(|n| format!("${n}")).collect();
                        format!("({})", params.join(", "))
                    })
                    .collect();
                // Parameters appear in the text in numeric order — $1 (now) in SET, the
                // rows, then the instance last — so SQLite's numbering of named
                // parameters matches PostgreSQL's.
                let instance_param = 2 + chunk.len() * 7;
                let sql = format!(
                    "UPDATE batch_statuses \
                        SET status = v.to_status, \
                            updated_at_us = $1, \
                            dlt_message = COALESCE(v.dlt_message, batch_statuses.dlt_message), \
                            last_error = v.last_error, \
                            next_attempt_at_us = CASE WHEN v.retry_after_us IS NULL \
                                THEN batch_statuses.next_attempt_at_us \
                                ELSE $1 + v.retry_after_us END, \
                            unknown_since_us = CASE v.unknown \
                                WHEN 1 THEN COALESCE(batch_statuses.unknown_since_us, $1) \
                                WHEN 2 THEN NULL \
                                ELSE batch_statuses.unknown_since_us END \
                       FROM (SELECT column1 AS seq, column2 AS from_status, column3 AS to_status, \
                                    column4 AS dlt_message, column5 AS last_error, \
                                    column6 AS retry_after_us, column7 AS unknown \
                               FROM (VALUES {}) AS t) AS v \
                      WHERE batch_statuses.seq = v.seq \
                        AND batch_statuses.status = v.from_status \
                        AND EXISTS (SELECT 1 FROM service_id_claims c \
                                     WHERE c.service_id = batch_statuses.service_id \
                                       AND c.claimant = ${instance_param}) \
                  RETURNING batch_statuses.seq",
                    rows.join(", ")
                );
                let mut query = diesel::sql_query(sql)
                    .into_boxed()
                    .bind::<BigInt, _>(now_us);
                for transition in chunk {
                    let retry_after_us = transition
                        .retry_after
                        .map(|delay| i64::try_from(delay.as_micros()).unwrap_or(i64::MAX));
                    query = query
                        .bind::<BigInt, _>(transition.seq)
                        .bind::<Text, _>(transition.from.as_str())
                        .bind::<Text, _>(transition.to.as_str())
                        .bind::<Nullable<Text>, _>(transition.dlt_message.clone())
                        .bind::<Nullable<Text>, _>(transition.last_error.clone())
                        .bind::<Nullable<BigInt>, _>(retry_after_us)
                        .bind::<Integer, _>(unknown_code(transition.unknown_since));
                }
                query = query.bind::<Text, _>(instance_id);
                changed.extend(query.load::<ChangedRow>(conn).await?);
            }
            // Transitions that only move the Unknown marker are not history.
            let events: Vec<NewEventRow<'_>> = changed
                .iter()
                .filter_map(|row| {
                    let transition = by_seq.get(&row.seq)?;
                    (transition.from != transition.to).then(|| NewEventRow {
                        seq: row.seq,
                        old_status: Some(transition.from.as_str()),
                        new_status: transition.to.as_str(),
                        epoch: epoch_of.get(&row.seq).copied(),
                        instance_id: Some(instance_id),
                        detail: transition.detail.as_deref(),
                        at_us: now_us,
                    })
                })
                .collect();
            conn.insert_events(&events).await?;
            outcome.applied = changed.into_iter().map(|row| row.seq).collect();
            outcome.applied.sort_unstable();
            Ok(outcome)
        })
    }

    /// Batches of services `instance_id` holds that wait for the ledger's verdict
    /// (PENDING, VALID, IN_DOUBT), oldest first, at most `limit`.
    pub async fn pollable_batches(
        &self,
        instance_id: &str,
        limit: usize,
    ) -> Result<Vec<PollableBatch>, StoreError> {
        use crate::schema::{batch_statuses, batches, service_id_claims};
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let now = self.now();
        with_conn!(self, |conn| {
            Ok(batch_statuses::table
                .inner_join(batches::table)
                .inner_join(
                    service_id_claims::table
                        .on(service_id_claims::service_id.eq(batch_statuses::service_id)),
                )
                .filter(service_id_claims::claimant.eq(instance_id))
                .filter(batch_statuses::status.eq_any([
                    BatchStatus::Pending.as_str(),
                    BatchStatus::Valid.as_str(),
                    BatchStatus::InDoubt.as_str(),
                ]))
                .order(batch_statuses::seq)
                .limit(limit)
                .select((
                    batch_statuses::seq,
                    batch_statuses::service_id,
                    batches::batch_id,
                    batch_statuses::status,
                    batch_statuses::unknown_since_us,
                    batch_statuses::submit_epoch,
                    now,
                ))
                .load(conn)
                .await?)
        })
    }
}

impl Store {
    /// Unfinished batches (QUEUED, SUBMITTING, PENDING, VALID, IN_DOUBT) by status, across
    /// the cluster. Reads only the partial index of unfinished batches, so its cost follows
    /// the backlog, not the history.
    pub async fn count_unfinished_by_status(
        &self,
    ) -> Result<HashMap<BatchStatus, i64>, StoreError> {
        use crate::schema::batch_statuses;
        let rows: Vec<(String, i64)> = with_conn!(self, |conn| {
            Ok::<_, StoreError>(
                batch_statuses::table
                    .filter(batch_statuses::status.eq_any([
                        BatchStatus::Queued.as_str(),
                        BatchStatus::Submitting.as_str(),
                        BatchStatus::Pending.as_str(),
                        BatchStatus::Valid.as_str(),
                        BatchStatus::InDoubt.as_str(),
                    ]))
                    .group_by(batch_statuses::status)
                    .select((batch_statuses::status, diesel::dsl::count_star()))
                    .load(conn)
                    .await?,
            )
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(status, count)| Some((status.parse().ok()?, count)))
            .collect())
    }
}

/// What a client may learn about one batch by id.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct BatchState {
    pub batch_id: String,
    pub status: String,
    pub dlt_message: Option<String>,
    pub created_at_us: i64,
}

impl Store {
    /// The states of the given batch ids, of one service or (`None`) of any service — the
    /// Sawtooth routes name no service. Ids not found are left out.
    pub async fn batch_states(
        &self,
        service_id: Option<&str>,
        batch_ids: &[&str],
    ) -> Result<Vec<BatchState>, StoreError> {
        use crate::schema::{batch_statuses, batches};
        let mut states = Vec::with_capacity(batch_ids.len());
        for chunk in batch_ids.chunks(1_000) {
            let mut rows: Vec<BatchState> = with_conn!(self, |conn| {
                Ok::<_, StoreError>(
                    batches::table
                        .inner_join(batch_statuses::table)
                        .filter(batches::batch_id.eq_any(chunk))
                        .filter(
                            batches::service_id
                                .nullable()
                                .eq(service_id)
                                .or(service_id.is_none().into_sql::<diesel::sql_types::Bool>()),
                        )
                        .select((
                            batches::batch_id,
                            batch_statuses::status,
                            batch_statuses::dlt_message,
                            batches::created_at_us,
                        ))
                        .load(conn)
                        .await?,
                )
            })?;
            states.append(&mut rows);
        }
        Ok(states)
    }
}

impl Store {
    /// Turns `instance_id`'s own SUBMITTING batches that are older than `older_than` and not
    /// in `in_flight` (the seqs it still has a POST or an unrecorded outcome for) IN_DOUBT,
    /// for services it still holds: their outcome was lost inside this process (a database
    /// error while recording, a lost commit acknowledgement), and the ledger must be asked.
    /// Without this such a batch would block its service until the instance exits.
    pub async fn sweep_stranded_submitting(
        &self,
        instance_id: &str,
        older_than: Duration,
        in_flight: &[i64],
    ) -> Result<Vec<i64>, StoreError> {
        use crate::schema::{batch_statuses, service_id_claims};
        let now = self.now();
        let age = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let held = service_id_claims::table
                .filter(service_id_claims::claimant.eq(instance_id))
                .select(service_id_claims::service_id);
            let mut swept: Vec<i64> = diesel::update(batch_statuses::table)
                .filter(batch_statuses::status.eq(BatchStatus::Submitting.as_str()))
                .filter(batch_statuses::submitted_by.eq(instance_id))
                .filter(batch_statuses::updated_at_us.le(now_us.saturating_sub(age)))
                .filter(batch_statuses::service_id.eq_any(held))
                .filter(diesel::dsl::not(batch_statuses::seq.eq_any(in_flight)))
                .set((
                    batch_statuses::status.eq(BatchStatus::InDoubt.as_str()),
                    batch_statuses::updated_at_us.eq(now_us),
                    batch_statuses::last_error.eq("outcome lost inside the submitting instance"),
                ))
                .returning(batch_statuses::seq)
                .get_results(conn)
                .await?;
            swept.sort_unstable();
            let events: Vec<NewEventRow<'_>> = swept
                .iter()
                .map(|seq| NewEventRow {
                    seq: *seq,
                    old_status: Some(BatchStatus::Submitting.as_str()),
                    new_status: BatchStatus::InDoubt.as_str(),
                    epoch: None,
                    instance_id: Some(instance_id),
                    detail: Some("stranded SUBMITTING swept"),
                    at_us: now_us,
                })
                .collect();
            conn.insert_events(&events).await?;
            Ok(swept)
        })
    }
}
