//! Deleting what is no longer needed: terminal batches past their retention.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::connection::write_transaction;
use crate::schema::{batch_events, batch_statuses, batches};
use crate::{BatchStatus, Store, StoreError};

impl Store {
    /// Deletes up to `limit` batches that reached COMMITTED, INVALID or CANCELLED more than
    /// `older_than` ago, with their statuses and history. Returns how many.
    pub async fn delete_terminal_batches(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let now = self.now();
        let age = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        write_transaction!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let terminal = [
                BatchStatus::Committed.as_str(),
                BatchStatus::Invalid.as_str(),
                BatchStatus::Cancelled.as_str(),
            ];
            let seqs: Vec<i64> = batch_statuses::table
                .filter(batch_statuses::status.eq_any(terminal))
                .filter(batch_statuses::updated_at_us.le(now_us.saturating_sub(age)))
                .order(batch_statuses::seq)
                .limit(limit)
                .select(batch_statuses::seq)
                .load(conn)
                .await?;
            for chunk in seqs.chunks(1_000) {
                diesel::delete(batch_events::table.filter(batch_events::seq.eq_any(chunk)))
                    .execute(conn)
                    .await?;
                diesel::delete(batch_statuses::table.filter(batch_statuses::seq.eq_any(chunk)))
                    .execute(conn)
                    .await?;
                diesel::delete(batches::table.filter(batches::seq.eq_any(chunk)))
                    .execute(conn)
                    .await?;
            }
            Ok(seqs.len())
        })
    }
}
