//! What the operator console reads: a page of services with filters applied in the
//! database (the console stays usable with 10,000 services because it never loads them
//! all), a page of one service's batches, one batch, the claims per holder, and the commits
//! of the last minutes. Read-only; every query's cost depends on the page size, not on
//! the number of services, except the filtered count that sizes the pager.

use std::collections::BTreeMap;

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable};
use diesel_async::RunQueryDsl;

use crate::connection::with_conn;
use crate::operator::{BATCH_RECORD_COLUMNS, BatchRecord};
use crate::schema::{batch_statuses, batches, service_id_claims, services};
use crate::{BatchStatus, Pin, Store, StoreError};

/// Most rows one page may hold.
pub const MAX_PAGE: i64 = 500;

/// Which services a page lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceFilter {
    /// Exactly this service.
    pub id: Option<String>,
    /// A substring of the service id.
    pub id_contains: Option<String>,
    /// Held by this instance.
    pub holder: Option<String>,
    pub only: Option<ServiceSubset>,
}

/// A named subset of services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceSubset {
    Paused,
    /// Pinned to a label or excluding one.
    Pinned,
    /// Pinned or excluding, and no live instance may hold it.
    Unserved,
    /// No claimant, or past its fast expiry (nobody renews it).
    Unclaimed,
    /// Has unfinished batches.
    Backlog,
}

impl std::str::FromStr for ServiceSubset {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(match text {
            "paused" => ServiceSubset::Paused,
            "pinned" => ServiceSubset::Pinned,
            "unserved" => ServiceSubset::Unserved,
            "unclaimed" => ServiceSubset::Unclaimed,
            "backlog" => ServiceSubset::Backlog,
            _ => return Err("expected paused, pinned, unserved, unclaimed or backlog".into()),
        })
    }
}

/// One service on a console page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRow {
    pub service_id: String,
    pub paused: bool,
    pub max_in_flight: i32,
    pub pin: Pin,
    pub created_at_us: i64,
    pub claimant: Option<String>,
    pub epoch: i64,
    pub fast_expiry_us: i64,
    pub slow_expiry_us: i64,
    pub claimed_at_us: Option<i64>,
    /// Batches by status; statuses with none are left out.
    pub counts: BTreeMap<BatchStatus, i64>,
}

/// A page of services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePage {
    /// The database clock when the page was read.
    pub read_at_us: i64,
    /// Services matching the filter (all pages).
    pub total: i64,
    pub services: Vec<ServiceRow>,
}

/// A page of one service's batches, in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPage {
    pub total: i64,
    pub batches: Vec<BatchRecord>,
}

/// Commits in one interval of the last minutes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommitBucket {
    /// Start of the interval (database clock, microseconds).
    pub start_us: i64,
    pub committed: i64,
    /// From acceptance to COMMITTED, mean and worst, over the interval's commits.
    pub latency_mean_us: f64,
    pub latency_max_us: i64,
}

/// The `unserved` condition on the services row aliased by its table name; `$1`-free: the
/// heartbeat threshold is bound by the caller.
const UNSERVED_CONDITION: &str = "\
(services.pin_label IS NOT NULL OR services.exclude_label IS NOT NULL)
AND NOT EXISTS (
    SELECT 1 FROM instances i
     WHERE i.state = 'running' AND i.heartbeat_at_us > ";
const UNSERVED_CONDITION_END: &str = "
       AND (services.pin_label IS NULL
            OR (',' || i.labels || ',') LIKE ('%,' || services.pin_label || ',%'))
       AND (services.exclude_label IS NULL
            OR (',' || i.labels || ',') NOT LIKE ('%,' || services.exclude_label || ',%')))";

/// Escapes LIKE's wildcards (`\` is the escape character).
fn like_pattern(text: &str) -> String {
    let mut pattern = String::from("%");
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The services query with the filter applied, boxed for the connection's backend.
macro_rules! filtered_services {
    ($filter:expr, $now_us:expr, $live_after_us:expr, $unfinished:expr) => {{
        let filter: &ServiceFilter = $filter;
        let mut query = services::table.into_boxed();
        if let Some(id) = &filter.id {
            query = query.filter(services::service_id.eq(id.clone()));
        }
        if let Some(text) = &filter.id_contains {
            query = query.filter(services::service_id.like(like_pattern(text)).escape('\\'));
        }
        if let Some(holder) = &filter.holder {
            query = query.filter(
                services::service_id.eq_any(
                    service_id_claims::table
                        .filter(service_id_claims::claimant.eq(holder.clone()))
                        .select(service_id_claims::service_id),
                ),
            );
        }
        match filter.only {
            None => {}
            Some(ServiceSubset::Paused) => query = query.filter(services::paused.eq(true)),
            Some(ServiceSubset::Pinned) => {
                query = query.filter(
                    services::pin_label
                        .is_not_null()
                        .or(services::exclude_label.is_not_null()),
                )
            }
            Some(ServiceSubset::Unserved) => {
                query = query.filter(
                    sql::<Bool>(UNSERVED_CONDITION)
                        .bind::<BigInt, _>($live_after_us)
                        .sql(UNSERVED_CONDITION_END),
                )
            }
            Some(ServiceSubset::Unclaimed) => {
                query = query.filter(
                    services::service_id.eq_any(
                        service_id_claims::table
                            .filter(
                                service_id_claims::claimant
                                    .is_null()
                                    .or(service_id_claims::fast_expiry_us.le($now_us)),
                            )
                            .select(service_id_claims::service_id),
                    ),
                )
            }
            Some(ServiceSubset::Backlog) => {
                query = query.filter(
                    services::service_id.eq_any(
                        batch_statuses::table
                            .filter(batch_statuses::status.eq_any($unfinished))
                            .select(batch_statuses::service_id),
                    ),
                )
            }
        }
        query
    }};
}

type ServiceColumns = (String, bool, i32, Option<String>, Option<String>, i64);
type ClaimColumns = (String, Option<String>, i64, i64, i64, Option<i64>);

impl Store {
    /// One page of services ordered by id, with their claims and batch counts, filtered in
    /// the database. `live_after` decides which instances count as live for `Unserved`.
    pub async fn services_page(
        &self,
        filter: &ServiceFilter,
        offset: i64,
        limit: i64,
        live_after: std::time::Duration,
    ) -> Result<ServicePage, StoreError> {
        let now = self.now();
        let offset = offset.max(0);
        let limit = limit.clamp(1, MAX_PAGE);
        let stale = i64::try_from(live_after.as_micros()).unwrap_or(i64::MAX);
        let unfinished: Vec<&'static str> = BatchStatus::ALL
            .into_iter()
            .filter(|status| !status.is_terminal())
            .map(BatchStatus::as_str)
            .collect();
        let (now_us, total, rows, claims, counts) = with_conn!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            let live_after_us = now_us.saturating_sub(stale);
            let total: i64 = filtered_services!(filter, now_us, live_after_us, &unfinished)
                .count()
                .get_result(conn)
                .await?;
            let rows: Vec<ServiceColumns> =
                filtered_services!(filter, now_us, live_after_us, &unfinished)
                    .order(services::service_id)
                    .offset(offset)
                    .limit(limit)
                    .select((
                        services::service_id,
                        services::paused,
                        services::max_in_flight,
                        services::pin_label,
                        services::exclude_label,
                        services::created_at_us,
                    ))
                    .load(conn)
                    .await?;
            let ids: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
            let claims: Vec<ClaimColumns> = service_id_claims::table
                .filter(service_id_claims::service_id.eq_any(&ids))
                .select((
                    service_id_claims::service_id,
                    service_id_claims::claimant,
                    service_id_claims::epoch,
                    service_id_claims::fast_expiry_us,
                    service_id_claims::slow_expiry_us,
                    service_id_claims::claimed_at_us,
                ))
                .load(conn)
                .await?;
            // Through `batches` (indexed by service) to the statuses (by seq): no scan of
            // the whole status table.
            let counts: Vec<(String, String, i64)> = batches::table
                .inner_join(batch_statuses::table)
                .filter(batches::service_id.eq_any(&ids))
                .group_by((batch_statuses::service_id, batch_statuses::status))
                .select((
                    batch_statuses::service_id,
                    batch_statuses::status,
                    diesel::dsl::count_star(),
                ))
                .load(conn)
                .await?;
            Ok::<_, StoreError>((now_us, total, rows, claims, counts))
        })?;
        let mut claims: BTreeMap<String, ClaimColumns> = claims
            .into_iter()
            .map(|claim| (claim.0.clone(), claim))
            .collect();
        let mut by_service: BTreeMap<String, BTreeMap<BatchStatus, i64>> = BTreeMap::new();
        for (service_id, status, count) in counts {
            if let Ok(status) = status.parse() {
                by_service
                    .entry(service_id)
                    .or_default()
                    .insert(status, count);
            }
        }
        let services = rows
            .into_iter()
            .map(
                |(service_id, paused, max_in_flight, pin_label, exclude_label, created_at_us)| {
                    let claim = claims.remove(&service_id);
                    let (_, claimant, epoch, fast, slow, claimed_at) =
                        claim.unwrap_or((String::new(), None, 0, 0, 0, None));
                    ServiceRow {
                        counts: by_service.remove(&service_id).unwrap_or_default(),
                        service_id,
                        paused,
                        max_in_flight,
                        pin: Pin {
                            pin_label,
                            exclude_label,
                        },
                        created_at_us,
                        claimant,
                        epoch,
                        fast_expiry_us: fast,
                        slow_expiry_us: slow,
                        claimed_at_us: claimed_at,
                    }
                },
            )
            .collect();
        Ok(ServicePage {
            read_at_us: now_us,
            total,
            services,
        })
    }

    /// One page of a service's batches in `seq` order (all statuses).
    pub async fn service_batches(
        &self,
        service_id: &str,
        offset: i64,
        limit: i64,
    ) -> Result<BatchPage, StoreError> {
        let offset = offset.max(0);
        let limit = limit.clamp(1, MAX_PAGE);
        with_conn!(self, |conn| {
            let total: i64 = batches::table
                .filter(batches::service_id.eq(service_id))
                .count()
                .get_result(conn)
                .await?;
            let batches: Vec<BatchRecord> = batches::table
                .inner_join(batch_statuses::table)
                .filter(batches::service_id.eq(service_id))
                .order(batches::seq)
                .offset(offset)
                .limit(limit)
                .select(BATCH_RECORD_COLUMNS)
                .load(conn)
                .await?;
            Ok(BatchPage { total, batches })
        })
    }

    /// The batch with this `seq`, if any.
    pub async fn batch_by_seq(&self, seq: i64) -> Result<Option<BatchRecord>, StoreError> {
        with_conn!(self, |conn| {
            Ok(batches::table
                .inner_join(batch_statuses::table)
                .filter(batches::seq.eq(seq))
                .select(BATCH_RECORD_COLUMNS)
                .first(conn)
                .await
                .optional()?)
        })
    }

    /// How many claims each instance holds (claim rows naming it, whatever their expiry).
    pub async fn claims_per_holder(&self) -> Result<BTreeMap<String, i64>, StoreError> {
        let rows: Vec<(Option<String>, i64)> = with_conn!(self, |conn| {
            Ok::<_, StoreError>(
                service_id_claims::table
                    .filter(service_id_claims::claimant.is_not_null())
                    .group_by(service_id_claims::claimant)
                    .select((service_id_claims::claimant, diesel::dsl::count_star()))
                    .load(conn)
                    .await?,
            )
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(holder, count)| Some((holder?, count)))
            .collect())
    }

    /// Services in all, paused, and pinned or excluding.
    pub async fn service_totals(&self) -> Result<(i64, i64, i64), StoreError> {
        with_conn!(self, |conn| {
            let all: i64 = services::table.count().get_result(conn).await?;
            let paused: i64 = services::table
                .filter(services::paused.eq(true))
                .count()
                .get_result(conn)
                .await?;
            let pinned: i64 = services::table
                .filter(
                    services::pin_label
                        .is_not_null()
                        .or(services::exclude_label.is_not_null()),
                )
                .count()
                .get_result(conn)
                .await?;
            Ok((all, paused, pinned))
        })
    }

    /// Commits of the last `buckets × bucket` on the database clock, per interval, with
    /// the time from acceptance to COMMITTED. Reads the `batch_events_committed_at` index.
    /// Intervals without commits are left out. With `since_us`, only the intervals from
    /// the one containing it on are read (a caller that keeps the older, finished ones).
    /// Returns the database clock too.
    pub async fn recent_commits(
        &self,
        bucket: std::time::Duration,
        buckets: i64,
        since_us: Option<i64>,
    ) -> Result<(i64, Vec<CommitBucket>), StoreError> {
        let now = self.now();
        let bucket_us = i64::try_from(bucket.as_micros())
            .unwrap_or(1_000_000)
            .max(1);
        with_conn!(self, |conn| {
            let now_us: i64 = diesel::select(now).get_result(conn).await?;
            // Intervals aligned on multiples of the bucket, the current one included.
            let window = (now_us / bucket_us - (buckets - 1)) * bucket_us;
            let first = since_us.map_or(window, |since| window.max(since / bucket_us * bucket_us));
            let rows: Vec<CommitRow> = diesel::sql_query(RECENT_COMMITS_SQL)
                .bind::<BigInt, _>(first)
                .bind::<BigInt, _>(bucket_us)
                .load(conn)
                .await?;
            Ok((
                now_us,
                rows.into_iter()
                    .map(|row| CommitBucket {
                        start_us: first + row.bucket * bucket_us,
                        committed: row.committed,
                        latency_mean_us: row.latency_sum_us.unwrap_or(0) as f64
                            / row.committed.max(1) as f64,
                        latency_max_us: row.latency_max_us.unwrap_or(0),
                    })
                    .collect(),
            ))
        })
    }
}

/// `$1`: start of the first interval; `$2`: interval length (both microseconds).
const RECENT_COMMITS_SQL: &str = "\
SELECT (e.at_us - $1) / $2 AS bucket, COUNT(*) AS committed,
       CAST(SUM(e.at_us - b.created_at_us) AS BIGINT) AS latency_sum_us,
       MAX(e.at_us - b.created_at_us) AS latency_max_us
  FROM batch_events e JOIN batches b ON b.seq = e.seq
 WHERE e.new_status = 'COMMITTED' AND e.at_us >= $1
 GROUP BY (e.at_us - $1) / $2
 ORDER BY 1";

#[derive(QueryableByName)]
struct CommitRow {
    #[diesel(sql_type = BigInt)]
    bucket: i64,
    #[diesel(sql_type = BigInt)]
    committed: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    latency_sum_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    latency_max_us: Option<i64>,
}
