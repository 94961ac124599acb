//! What operators read and change through the native API: services with their counts,
//! batches with their history, and the operator's own moves (pause, resume, max_in_flight,
//! cancel, requeue).
//!
//! Operator moves on a batch are conditional updates (`… WHERE status IN (allowed)`), like
//! every other transition, so they race safely with the submitter and the observer: a
//! cancel and a `mark_submitting` of the same QUEUED batch cannot both win. They take no
//! claim: an operator is not a holder, and the holder's fenced writes all require the
//! batch to still be in the status they saw.

use std::collections::BTreeMap;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::dialect::Dialect;
use crate::rows::NewEventRow;
use crate::schema::{batch_events, batch_statuses, batches, service_id_claims, services};
use crate::{BatchStatus, Store, StoreError};

/// Largest `max_in_flight` an operator may set: a bound on one service's POSTs in flight.
pub const MAX_IN_FLIGHT_LIMIT: i32 = 1_000;

/// A service as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    pub service_id: String,
    pub paused: bool,
    pub max_in_flight: i32,
    pub created_at_us: i64,
    pub claimant: Option<String>,
    pub epoch: i64,
    /// Batches by status; every status is present (zero when none).
    pub counts: BTreeMap<BatchStatus, i64>,
}

/// One batch with everything stored about its state (not its bytes).
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct BatchRecord {
    pub seq: i64,
    pub service_id: String,
    pub batch_id: String,
    pub status: String,
    pub attempts: i32,
    pub submit_epoch: Option<i64>,
    pub submitted_by: Option<String>,
    pub dlt_message: Option<String>,
    pub last_error: Option<String>,
    pub created_at_us: i64,
    pub updated_at_us: i64,
}

/// One line of a batch's history.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct BatchEvent {
    pub at_us: i64,
    pub old_status: Option<String>,
    pub new_status: String,
    pub epoch: Option<i64>,
    pub instance_id: Option<String>,
    pub detail: Option<String>,
}

/// What an operator move on a batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMove {
    /// The status the batch was in when the move was decided.
    pub before: BatchStatus,
    /// Whether the move changed the batch (false: refused, or nothing to change).
    pub changed: bool,
    /// The batch as it is after the move.
    pub batch: BatchRecord,
}

/// Which operator move on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMoveKind {
    /// QUEUED → CANCELLED.
    Cancel,
    /// QUEUED (backoff cleared) or IN_DOUBT → QUEUED, submittable at once.
    Requeue,
}

impl BatchMoveKind {
    /// The statuses the move applies to.
    pub fn applies_to(self) -> &'static [BatchStatus] {
        match self {
            BatchMoveKind::Cancel => &[BatchStatus::Queued],
            BatchMoveKind::Requeue => &[BatchStatus::Queued, BatchStatus::InDoubt],
        }
    }

    fn target(self) -> BatchStatus {
        match self {
            BatchMoveKind::Cancel => BatchStatus::Cancelled,
            BatchMoveKind::Requeue => BatchStatus::Queued,
        }
    }

    fn detail(self) -> &'static str {
        match self {
            BatchMoveKind::Cancel => "cancelled by an operator",
            BatchMoveKind::Requeue => "requeued by an operator",
        }
    }
}

fn parse_status(text: &str) -> Result<BatchStatus, StoreError> {
    text.parse().map_err(|problem: String| {
        StoreError::Query(diesel::result::Error::DeserializationError(problem.into()))
    })
}

impl Store {
    /// Every service (or only `only`), ordered by id, with its holder and batch counts.
    /// Counting reads every status row of the services asked for; it is an operator's
    /// view, not a hot path (retention keeps the history bounded).
    pub async fn services(&self, only: Option<&str>) -> Result<Vec<ServiceRecord>, StoreError> {
        type ServiceRow = (String, bool, i32, i64, Option<String>, Option<i64>);
        let (rows, counts): (Vec<ServiceRow>, Vec<(String, String, i64)>) =
            with_conn!(self, |conn| {
                let mut service_query = services::table
                    .left_join(service_id_claims::table)
                    .select((
                        services::service_id,
                        services::paused,
                        services::max_in_flight,
                        services::created_at_us,
                        service_id_claims::claimant.nullable(),
                        service_id_claims::epoch.nullable(),
                    ))
                    .order(services::service_id)
                    .into_boxed();
                let mut count_query = batch_statuses::table
                    .group_by((batch_statuses::service_id, batch_statuses::status))
                    .select((
                        batch_statuses::service_id,
                        batch_statuses::status,
                        diesel::dsl::count_star(),
                    ))
                    .into_boxed();
                if let Some(service_id) = only {
                    service_query = service_query.filter(services::service_id.eq(service_id));
                    count_query = count_query.filter(batch_statuses::service_id.eq(service_id));
                }
                let rows = service_query.load(conn).await?;
                let counts = count_query.load(conn).await?;
                Ok::<_, StoreError>((rows, counts))
            })?;
        let mut by_service: BTreeMap<String, BTreeMap<BatchStatus, i64>> = BTreeMap::new();
        for (service_id, status, count) in counts {
            by_service
                .entry(service_id)
                .or_default()
                .insert(parse_status(&status)?, count);
        }
        Ok(rows
            .into_iter()
            .map(
                |(service_id, paused, max_in_flight, created_at_us, claimant, epoch)| {
                    let found = by_service.remove(&service_id).unwrap_or_default();
                    let counts = BatchStatus::ALL
                        .into_iter()
                        .map(|status| (status, found.get(&status).copied().unwrap_or(0)))
                        .collect();
                    ServiceRecord {
                        service_id,
                        paused,
                        max_in_flight,
                        created_at_us,
                        claimant,
                        epoch: epoch.unwrap_or(0),
                        counts,
                    }
                },
            )
            .collect())
    }

    /// Pauses or resumes a service: a paused service starts no new submission (batches
    /// in flight finish). `false` if there is no such service.
    pub async fn set_service_paused(
        &self,
        service_id: &str,
        paused: bool,
    ) -> Result<bool, StoreError> {
        let changed = write_transaction!(self, |conn| {
            Ok(diesel::update(services::table.find(service_id))
                .set(services::paused.eq(paused))
                .execute(conn)
                .await?)
        })?;
        Ok(changed == 1)
    }

    /// Sets how many of a service's batches may be in flight at once (in order).
    /// `false` if there is no such service.
    pub async fn set_service_max_in_flight(
        &self,
        service_id: &str,
        max_in_flight: i32,
    ) -> Result<bool, StoreError> {
        if !(1..=MAX_IN_FLIGHT_LIMIT).contains(&max_in_flight) {
            return Err(StoreError::InvalidInput {
                field: "max_in_flight",
                problem: format!("must be 1 to {MAX_IN_FLIGHT_LIMIT}, not {max_in_flight}"),
            });
        }
        let changed = write_transaction!(self, |conn| {
            Ok(diesel::update(services::table.find(service_id))
                .set(services::max_in_flight.eq(max_in_flight))
                .execute(conn)
                .await?)
        })?;
        Ok(changed == 1)
    }

    /// The batches with these ids, of one service or of any; ordered by `seq`. Ids not
    /// found are left out; an id may appear once per service.
    pub async fn find_batches(
        &self,
        service_id: Option<&str>,
        batch_ids: &[&str],
    ) -> Result<Vec<BatchRecord>, StoreError> {
        let mut found = Vec::with_capacity(batch_ids.len());
        for chunk in batch_ids.chunks(1_000) {
            let mut rows: Vec<BatchRecord> = with_conn!(self, |conn| {
                let mut query = batches::table
                    .inner_join(batch_statuses::table)
                    .filter(batches::batch_id.eq_any(chunk))
                    .select(BATCH_RECORD_COLUMNS)
                    .into_boxed();
                if let Some(service_id) = service_id {
                    query = query.filter(batches::service_id.eq(service_id));
                }
                Ok::<_, StoreError>(query.load(conn).await?)
            })?;
            found.append(&mut rows);
        }
        found.sort_by_key(|batch| batch.seq);
        Ok(found)
    }

    /// Every batch id of a service with its status, in `seq` (acceptance) order: what a
    /// checker compares with the ledger's order.
    pub async fn batch_ids_in_order(
        &self,
        service_id: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        with_conn!(self, |conn| {
            Ok(batches::table
                .inner_join(batch_statuses::table)
                .filter(batches::service_id.eq(service_id))
                .order(batches::seq)
                .select((batches::batch_id, batch_statuses::status))
                .load(conn)
                .await?)
        })
    }

    /// Every history event of a service's batches in the order they were written (event
    /// id), with the batch's `seq`: what the chaos checker reads epochs from.
    pub async fn service_history(
        &self,
        service_id: &str,
    ) -> Result<Vec<(i64, BatchEvent)>, StoreError> {
        let rows: Vec<HistoryRow> = with_conn!(self, |conn| {
            Ok::<_, StoreError>(
                batch_events::table
                    .inner_join(batches::table)
                    .filter(batches::service_id.eq(service_id))
                    .order(batch_events::event_id)
                    .select((
                        batch_events::seq,
                        batch_events::at_us,
                        batch_events::old_status,
                        batch_events::new_status,
                        batch_events::epoch,
                        batch_events::instance_id,
                        batch_events::detail,
                    ))
                    .load(conn)
                    .await?,
            )
        })?;
        Ok(rows
            .into_iter()
            .map(
                |(seq, at_us, old_status, new_status, epoch, instance_id, detail)| {
                    (
                        seq,
                        BatchEvent {
                            at_us,
                            old_status,
                            new_status,
                            epoch,
                            instance_id,
                            detail,
                        },
                    )
                },
            )
            .collect())
    }

    /// A batch's history, oldest first.
    pub async fn batch_history(&self, seq: i64) -> Result<Vec<BatchEvent>, StoreError> {
        with_conn!(self, |conn| {
            Ok(batch_events::table
                .filter(batch_events::seq.eq(seq))
                .order(batch_events::event_id)
                .select((
                    batch_events::at_us,
                    batch_events::old_status,
                    batch_events::new_status,
                    batch_events::epoch,
                    batch_events::instance_id,
                    batch_events::detail,
                ))
                .load(conn)
                .await?)
        })
    }

    /// Cancels or requeues the batch `seq` if its status allows (see [`BatchMoveKind`]),
    /// with a history event; otherwise changes nothing. `None` if there is no such batch.
    ///
    /// The update is conditional on the status read in the same transaction, so it never
    /// overwrites a move the holder made in between (that move is then reported as the
    /// status `before`, and the operator's move is refused).
    pub async fn move_batch(
        &self,
        seq: i64,
        kind: BatchMoveKind,
    ) -> Result<Option<BatchMove>, StoreError> {
        let now = self.now();
        let allowed: Vec<&'static str> = kind.applies_to().iter().map(|s| s.as_str()).collect();
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let current: Option<String> = batch_statuses::table
                .find(seq)
                .select(batch_statuses::status)
                .first(conn)
                .await
                .optional()?;
            let Some(current) = current else {
                return Ok(None);
            };
            let before = parse_status(&current)?;
            let mut changed = false;
            if kind.applies_to().contains(&before) {
                // Requeueing a QUEUED batch only clears its backoff; the event says so.
                let count = diesel::update(
                    batch_statuses::table
                        .find(seq)
                        .filter(batch_statuses::status.eq_any(&allowed))
                        .filter(batch_statuses::status.eq(before.as_str())),
                )
                .set((
                    batch_statuses::status.eq(kind.target().as_str()),
                    batch_statuses::next_attempt_at_us.eq(now_us),
                    batch_statuses::unknown_since_us.eq(None::<i64>),
                    batch_statuses::updated_at_us.eq(now_us),
                ))
                .execute(conn)
                .await?;
                changed = count == 1;
                if changed {
                    conn.insert_events(&[NewEventRow {
                        seq,
                        old_status: Some(before.as_str()),
                        new_status: kind.target().as_str(),
                        epoch: None,
                        instance_id: None,
                        detail: Some(kind.detail()),
                        at_us: now_us,
                    }])
                    .await?;
                }
            }
            let batch: BatchRecord = batches::table
                .inner_join(batch_statuses::table)
                .filter(batches::seq.eq(seq))
                .select(BATCH_RECORD_COLUMNS)
                .first(conn)
                .await?;
            Ok(Some(BatchMove {
                before,
                changed,
                batch,
            }))
        })
    }
}

/// `(seq, at_us, old_status, new_status, epoch, instance_id, detail)` of one event.
type HistoryRow = (
    i64,
    i64,
    Option<String>,
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// The columns of [`BatchRecord`], in its field order.
pub(crate) const BATCH_RECORD_COLUMNS: (
    batches::seq,
    batches::service_id,
    batches::batch_id,
    batch_statuses::status,
    batch_statuses::attempts,
    batch_statuses::submit_epoch,
    batch_statuses::submitted_by,
    batch_statuses::dlt_message,
    batch_statuses::last_error,
    batches::created_at_us,
    batch_statuses::updated_at_us,
) = (
    batches::seq,
    batches::service_id,
    batches::batch_id,
    batch_statuses::status,
    batch_statuses::attempts,
    batch_statuses::submit_epoch,
    batch_statuses::submitted_by,
    batch_statuses::dlt_message,
    batch_statuses::last_error,
    batches::created_at_us,
    batch_statuses::updated_at_us,
);
