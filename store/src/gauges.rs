//! What the scrape-time gauges read: the backlog by status with the age of its oldest batch,
//! and the services that have unfinished batches but no live claim.
//!
//! These are cluster-wide facts (every instance reports the same numbers) read on the
//! database clock, so an alert built on them does not depend on which instance answered.

use std::collections::HashMap;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable};
use diesel_async::RunQueryDsl;

use crate::connection::with_conn;
use crate::{BatchStatus, Store, StoreError};

/// Unfinished batches of one status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusGauge {
    pub count: i64,
    /// Microseconds since the oldest of them entered this status (its last transition).
    pub oldest_age_us: i64,
}

/// The cluster's backlog, read at one moment of the database clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BacklogGauges {
    /// Unfinished statuses present in the backlog; a status missing here has no batch.
    pub by_status: HashMap<BatchStatus, StatusGauge>,
    /// Services with at least one unfinished batch and no live claim (no claimant, or its
    /// fast expiry has passed: nobody is renewing it).
    pub unclaimed_services: i64,
    /// How long the longest-waiting of those services has had both a backlog and no live
    /// claim: since the later of its claim's fast expiry and its oldest unfinished batch's
    /// last transition. A claim released on shutdown has its expiry reset to 0, so for it
    /// this over-estimates until the next tick takes it; alert only on a sustained value.
    pub unclaimed_oldest_age_us: i64,
}

/// Unfinished services without a live claim. `$1` is `now` in microseconds; one text for
/// both backends.
const UNCLAIMED_SQL: &str = "\
SELECT COUNT(*) AS services,
       MIN(CASE WHEN c.fast_expiry_us > u.oldest_us THEN c.fast_expiry_us ELSE u.oldest_us END)
           AS since_us
  FROM (SELECT service_id, MIN(updated_at_us) AS oldest_us
          FROM batch_statuses
         WHERE status IN ('QUEUED', 'SUBMITTING', 'PENDING', 'VALID', 'IN_DOUBT')
         GROUP BY service_id) u
  JOIN service_id_claims c ON c.service_id = u.service_id
 WHERE c.claimant IS NULL OR c.fast_expiry_us <= $1";

#[derive(QueryableByName)]
struct UnclaimedRow {
    #[diesel(sql_type = BigInt)]
    services: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    since_us: Option<i64>,
}

impl Store {
    /// The backlog gauges, in three statements on one connection (no transaction: a scrape
    /// may see the backlog and the claims a moment apart, which a gauge tolerates).
    pub async fn backlog_gauges(&self) -> Result<BacklogGauges, StoreError> {
        use crate::schema::batch_statuses;
        let now = self.now();
        let unfinished: Vec<&str> = BatchStatus::ALL
            .into_iter()
            .filter(|status| !status.is_terminal())
            .map(BatchStatus::as_str)
            .collect();
        let (now_us, rows, unclaimed) = with_conn!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let rows: Vec<(String, i64, Option<i64>)> = batch_statuses::table
                .filter(batch_statuses::status.eq_any(&unfinished))
                .group_by(batch_statuses::status)
                .select((
                    batch_statuses::status,
                    diesel::dsl::count_star(),
                    diesel::dsl::min(batch_statuses::updated_at_us),
                ))
                .load(conn)
                .await?;
            let unclaimed: UnclaimedRow = diesel::sql_query(UNCLAIMED_SQL)
                .bind::<BigInt, _>(now_us)
                .get_result(conn)
                .await?;
            Ok::<_, StoreError>((now_us, rows, unclaimed))
        })?;
        let by_status = rows
            .into_iter()
            .filter_map(|(status, count, oldest)| {
                let status = status.parse().ok()?;
                let oldest_age_us = oldest.map_or(0, |oldest| (now_us - oldest).max(0));
                Some((
                    status,
                    StatusGauge {
                        count,
                        oldest_age_us,
                    },
                ))
            })
            .collect();
        Ok(BacklogGauges {
            by_status,
            unclaimed_services: unclaimed.services,
            unclaimed_oldest_age_us: unclaimed
                .since_us
                .map_or(0, |since| (now_us - since).max(0)),
        })
    }
}
