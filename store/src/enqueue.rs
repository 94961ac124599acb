//! Accepting batches: the first write of a batch's life.

use std::collections::HashMap;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::connection::{with_conn, write_transaction};
use crate::dialect::Dialect;
use crate::rows::{NewBatchRow, NewEventRow, NewStatusRow};
use crate::schema::{batch_statuses, batches, service_id_claims, services};
use crate::{BatchStatus, MAX_SERVICE_ID_LEN, Store, StoreError, service_shard};

/// Ids per `IN (…)` list: well under PostgreSQL's 65,535 bind parameters and SQLite's
/// 32,766 host parameters.
const ID_CHUNK: usize = 1_000;

/// The statuses that count against a service's queue cap.
const UNFINISHED: [&str; 5] = ["QUEUED", "SUBMITTING", "PENDING", "VALID", "IN_DOUBT"];

/// A batch as a client handed it in: its id (the header signature) and the bytes of a
/// `BatchList` holding just this batch, which is what gets POSTed to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBatch {
    pub batch_id: String,
    pub serialized_batch: Vec<u8>,
}

/// The stored state of one batch of an enqueue request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueuedBatch {
    pub batch_id: String,
    pub seq: i64,
    pub status: BatchStatus,
    /// False when the batch had been accepted before with identical bytes (idempotent
    /// resubmission by a client); `status` is then its current status.
    pub newly_accepted: bool,
}

impl Store {
    /// Accepts `batches` for `service_id` in one transaction: the service and its claim row
    /// if they are new, each batch, its QUEUED status and a history event.
    ///
    /// Idempotent per (service, batch id): a batch already accepted with identical bytes is
    /// reported with its current status and written again nowhere. If any batch id was
    /// accepted before with *different* bytes, the whole call fails with
    /// [`StoreError::BatchConflict`] and writes nothing.
    ///
    /// The order of `batches` is their submission order within the service.
    pub async fn enqueue(
        &self,
        service_id: &str,
        batches: &[NewBatch],
    ) -> Result<Vec<EnqueuedBatch>, StoreError> {
        self.enqueue_limited(service_id, batches, None).await
    }

    /// [`Store::enqueue`] with a cap on the service's unfinished batches: if accepting the
    /// new ones would leave more than `max_unfinished` unfinished (QUEUED, SUBMITTING,
    /// PENDING, VALID, IN_DOUBT), nothing is written and the call fails with
    /// [`StoreError::QueueFull`]. A request whose batches were all accepted before is
    /// never refused: it adds nothing.
    pub async fn enqueue_limited(
        &self,
        service_id: &str,
        batches: &[NewBatch],
        max_unfinished: Option<u64>,
    ) -> Result<Vec<EnqueuedBatch>, StoreError> {
        validate_enqueue(service_id, batches)?;
        let now = self.now();
        let results = write_transaction!(self, |conn| {
            // One reading of the clock for every row this transaction writes.
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            diesel::insert_into(services::table)
                .values((
                    services::service_id.eq(service_id),
                    services::created_at_us.eq(now_us),
                ))
                .on_conflict_do_nothing()
                .execute(conn)
                .await?;
            diesel::insert_into(service_id_claims::table)
                .values((
                    service_id_claims::service_id.eq(service_id),
                    service_id_claims::shard.eq(service_shard(service_id)),
                ))
                .on_conflict_do_nothing()
                .execute(conn)
                .await?;
            conn.lock_services_for_enqueue(&[service_id]).await?;

            let batch_rows: Vec<NewBatchRow<'_>> = batches
                .iter()
                .map(|batch| NewBatchRow {
                    service_id,
                    batch_id: &batch.batch_id,
                    serialized_batch: &batch.serialized_batch,
                    created_at_us: now_us,
                })
                .collect();
            let inserted = conn.insert_new_batches(&batch_rows).await?;
            let status_rows: Vec<NewStatusRow<'_>> = inserted
                .iter()
                .map(|(seq, _)| NewStatusRow {
                    seq: *seq,
                    service_id,
                    status: BatchStatus::Queued.as_str(),
                    next_attempt_at_us: now_us,
                    updated_at_us: now_us,
                })
                .collect();
            conn.insert_statuses(&status_rows).await?;
            let event_rows: Vec<NewEventRow<'_>> = inserted
                .iter()
                .map(|(seq, _)| NewEventRow {
                    seq: *seq,
                    old_status: None,
                    new_status: BatchStatus::Queued.as_str(),
                    epoch: None,
                    instance_id: None,
                    detail: Some("accepted"),
                    at_us: now_us,
                })
                .collect();
            conn.insert_events(&event_rows).await?;
            if let Some(limit) = max_unfinished.filter(|_| !inserted.is_empty()) {
                // The service row is locked (above), so no other enqueue of this service
                // counts at the same time; the partial index of unfinished batches makes
                // this a count of the backlog, not of the history.
                let unfinished: i64 = batch_statuses::table
                    .filter(batch_statuses::service_id.eq(service_id))
                    .filter(batch_statuses::status.eq_any(UNFINISHED))
                    .count()
                    .get_result(conn)
                    .await?;
                if u64::try_from(unfinished).unwrap_or(0) > limit {
                    return Err(StoreError::QueueFull {
                        service_id: service_id.to_string(),
                        unfinished: unfinished - i64::try_from(inserted.len()).unwrap_or(0),
                        limit,
                    });
                }
            }
            let accepted: HashMap<String, i64> =
                inserted.into_iter().map(|(seq, id)| (id, seq)).collect();

            // Whatever was not inserted existed before: identical bytes make the request
            // idempotent, different bytes are a conflict that rolls everything back.
            let mut existing: HashMap<String, (i64, BatchStatus)> = HashMap::new();
            let already: Vec<&NewBatch> = batches
                .iter()
                .filter(|batch| !accepted.contains_key(&batch.batch_id))
                .collect();
            for chunk in already.chunks(ID_CHUNK) {
                let ids: Vec<&str> = chunk.iter().map(|batch| batch.batch_id.as_str()).collect();
                let rows: Vec<(i64, String, Vec<u8>, String)> = batches::table
                    .inner_join(batch_statuses::table)
                    .filter(batches::service_id.eq(service_id))
                    .filter(batches::batch_id.eq_any(&ids))
                    .select((
                        batches::seq,
                        batches::batch_id,
                        batches::serialized_batch,
                        batch_statuses::status,
                    ))
                    .load(conn)
                    .await?;
                let by_id: HashMap<&str, &NewBatch> = chunk
                    .iter()
                    .map(|batch| (batch.batch_id.as_str(), *batch))
                    .collect();
                for (seq, batch_id, stored_bytes, status) in rows {
                    let offered = by_id
                        .get(batch_id.as_str())
                        .map(|b| b.serialized_batch.as_slice());
                    if offered != Some(stored_bytes.as_slice()) {
                        return Err(StoreError::BatchConflict {
                            service_id: service_id.to_string(),
                            batch_id,
                            existing_seq: seq,
                        });
                    }
                    let status = status.parse().map_err(|problem: String| {
                        StoreError::Query(diesel::result::Error::DeserializationError(
                            problem.into(),
                        ))
                    })?;
                    existing.insert(batch_id, (seq, status));
                }
            }
            Ok((accepted, existing))
        })?;

        let (accepted, existing) = results;
        batches
            .iter()
            .map(|batch| {
                if let Some(seq) = accepted.get(&batch.batch_id) {
                    Ok(EnqueuedBatch {
                        batch_id: batch.batch_id.clone(),
                        seq: *seq,
                        status: BatchStatus::Queued,
                        newly_accepted: true,
                    })
                } else if let Some((seq, status)) = existing.get(&batch.batch_id) {
                    Ok(EnqueuedBatch {
                        batch_id: batch.batch_id.clone(),
                        seq: *seq,
                        status: *status,
                        newly_accepted: false,
                    })
                } else {
                    // Neither inserted nor found: only possible if the row vanished between
                    // the two statements of one transaction, which the isolation forbids.
                    Err(StoreError::Query(diesel::result::Error::NotFound))
                }
            })
            .collect()
    }
}

impl Store {
    /// Unfinished batches (QUEUED, SUBMITTING, PENDING, VALID, IN_DOUBT) of every service,
    /// in one statement over the partial index of unfinished batches: what the API checks
    /// `max_queued_total` against.
    pub async fn unfinished_total(&self) -> Result<i64, StoreError> {
        with_conn!(self, |conn| {
            let total: i64 = batch_statuses::table
                .filter(batch_statuses::status.eq_any(UNFINISHED))
                .count()
                .get_result(conn)
                .await?;
            Ok(total)
        })
    }
}

fn validate_enqueue(service_id: &str, batches: &[NewBatch]) -> Result<(), StoreError> {
    if service_id.is_empty() || service_id.len() > MAX_SERVICE_ID_LEN {
        return Err(StoreError::InvalidInput {
            field: "service_id",
            problem: format!("must be 1 to {MAX_SERVICE_ID_LEN} bytes long"),
        });
    }
    if service_id.chars().any(char::is_control) {
        return Err(StoreError::InvalidInput {
            field: "service_id",
            problem: "must not contain control characters".into(),
        });
    }
    if batches.is_empty() {
        return Err(StoreError::InvalidInput {
            field: "batches",
            problem: "at least one batch is required".into(),
        });
    }
    let mut seen: HashMap<&str, &[u8]> = HashMap::with_capacity(batches.len());
    for batch in batches {
        if !is_batch_id(&batch.batch_id) {
            return Err(StoreError::InvalidInput {
                field: "batch_id",
                problem: format!(
                    "{:?} is not a batch header signature (128 hexadecimal characters)",
                    batch.batch_id
                ),
            });
        }
        if batch.serialized_batch.is_empty() {
            return Err(StoreError::InvalidInput {
                field: "serialized_batch",
                problem: format!("batch {} has no bytes", batch.batch_id),
            });
        }
        if seen
            .insert(&batch.batch_id, &batch.serialized_batch)
            .is_some()
        {
            return Err(StoreError::InvalidInput {
                field: "batch_id",
                problem: format!("batch {} appears twice in one request", batch.batch_id),
            });
        }
    }
    Ok(())
}

/// A batch id is a header signature: exactly 128 hexadecimal characters, never truncated.
pub fn is_batch_id(text: &str) -> bool {
    text.len() == 128 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}
