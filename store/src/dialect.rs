//! The few places where PostgreSQL and SQLite need different SQL. Everything else is
//! written once (see `connection::with_conn!`).
//!
//! Multi-row inserts are here because diesel-async cannot send diesel's SQLite batch
//! insert (diesel implements it only for its synchronous connection).

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::connection::{PgConn, SqliteConn};
use crate::liveness::{StuckHolder, local_process_gone};
use crate::rows::{NewBatchRow, NewEventRow, NewStatusRow};
use crate::schema::{batch_events, batch_statuses, batches, services};
use crate::submission::SubmittableBatch;

/// Rows per multi-row INSERT on PostgreSQL: well under its 65,535 bind parameters.
const PG_INSERT_CHUNK_ROWS: usize = 1_000;

pub(crate) trait Dialect: Send {
    /// Appended to a subselect that picks claim rows to change: on PostgreSQL it locks
    /// them and skips rows another transaction holds; SQLite has one writer at a time.
    fn row_lock_clause(&self) -> &'static str;

    /// Appended to a subselect ordered by service_id that picks my own claim rows: locks
    /// them in that order on PostgreSQL.
    fn claim_lock_in_order(&self) -> &'static str;

    /// Serialises enqueues into the given services until the transaction ends, so that a
    /// service's batches receive `seq` values in commit order: a reader that sees seq n of a
    /// service has already been able to see every smaller seq of it.
    async fn lock_services_for_enqueue(&mut self, service_ids: &[&str]) -> QueryResult<()>;

    /// Inserts the batches that are not there yet; returns `(seq, batch_id)` of those it
    /// inserted. Existing (service_id, batch_id) pairs are skipped, not overwritten.
    async fn insert_new_batches(
        &mut self,
        rows: &[NewBatchRow<'_>],
    ) -> QueryResult<Vec<(i64, String)>>;

    async fn insert_statuses(&mut self, rows: &[NewStatusRow<'_>]) -> QueryResult<()>;

    async fn insert_events(&mut self, rows: &[NewEventRow<'_>]) -> QueryResult<()>;

    /// `(service_id, epoch)` of the given services whose claim `instance_id` holds (and,
    /// with `fast_expiry_after`, whose fast expiry is later than it), locked against a
    /// concurrent takeover until the transaction ends.
    async fn lock_held_claims(
        &mut self,
        instance_id: &str,
        service_ids: &[&str],
        fast_expiry_after: Option<i64>,
    ) -> QueryResult<Vec<(String, i64)>>;

    /// See `Store::select_submittable`.
    async fn select_submittable(
        &mut self,
        instance_id: &str,
        now_us: i64,
        limit: i64,
    ) -> QueryResult<Vec<SubmittableBatch>>;

    /// The instance ids of the holders in `stuck` whose process is gone (`liveness.rs`).
    /// PostgreSQL: no session carries the holder's tag any more. SQLite, whose instances
    /// share a host: the holder ran on this host and its process has ended.
    async fn gone_holders(
        &mut self,
        my_hostname: &str,
        stuck: &[StuckHolder],
    ) -> QueryResult<Vec<String>>;
}

#[derive(QueryableByName)]
struct SessionTagRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    tag: String,
}

/// The unfinished statuses, in the exact words of the partial index `batch_statuses_active`
/// so that PostgreSQL can use it.
const ACTIVE_STATUSES: &str = "('QUEUED', 'SUBMITTING', 'PENDING', 'VALID', 'IN_DOUBT')";

/// An earlier batch `e` of the service that keeps later ones from being submitted: one whose
/// POST may still be under way or whose fate is unknown (SUBMITTING, IN_DOUBT) — so a
/// service has at most one POST in flight, and a 429 or a lost answer can never let a later
/// batch overtake it — or one waiting out a retry backoff. Behind PENDING and VALID batches
/// (the ledger has them, in order) later ones may go.
const BLOCKS_LATER: &str = "(e.status IN ('SUBMITTING', 'IN_DOUBT') \
     OR (e.status = 'QUEUED' AND e.next_attempt_at_us > $2))";

#[derive(QueryableByName)]
struct HeldClaimRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    service_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    epoch: i64,
}

/// `SELECT service_id, epoch` of the claims of `$1` among the services `$3, $4, …` whose
/// fast expiry is after `$2`, followed by the dialect's `$lock` clause. A macro rather than a
/// generic function: the trait bounds diesel needs for a generic raw query are longer than
/// the query.
macro_rules! load_held_claims {
    ($conn:expr, $lock:expr, $instance_id:expr, $service_ids:expr, $fast_expiry_after:expr) => {{
        let mut held = Vec::with_capacity($service_ids.len());
        for chunk in $service_ids.chunks(1_000) {
            let placeholders: Vec<String> =
                (0..chunk.len()).map(|i| format!("${}", i + 3)).collect();
            let sql = format!(
                "SELECT service_id, epoch FROM service_id_claims \
                  WHERE claimant = $1 AND fast_expiry_us > $2 AND service_id IN ({}) \
                  ORDER BY service_id {}",
                placeholders.join(", "),
                $lock
            );
            let mut query = diesel::sql_query(sql)
                .into_boxed()
                .bind::<diesel::sql_types::Text, _>($instance_id)
                .bind::<diesel::sql_types::BigInt, _>($fast_expiry_after.unwrap_or(i64::MIN));
            for service_id in chunk {
                query = query.bind::<diesel::sql_types::Text, _>(*service_id);
            }
            let rows: Vec<HeldClaimRow> = query.load($conn).await?;
            held.extend(rows.into_iter().map(|row| (row.service_id, row.epoch)));
        }
        Ok(held)
    }};
}

impl Dialect for PgConn {
    fn row_lock_clause(&self) -> &'static str {
        "FOR UPDATE SKIP LOCKED"
    }

    fn claim_lock_in_order(&self) -> &'static str {
        "FOR UPDATE"
    }

    async fn lock_held_claims(
        &mut self,
        instance_id: &str,
        service_ids: &[&str],
        fast_expiry_after: Option<i64>,
    ) -> QueryResult<Vec<(String, i64)>> {
        load_held_claims!(
            self,
            "FOR SHARE",
            instance_id,
            service_ids,
            fast_expiry_after
        )
    }

    async fn select_submittable(
        &mut self,
        instance_id: &str,
        now_us: i64,
        limit: i64,
    ) -> QueryResult<Vec<SubmittableBatch>> {
        // LATERAL reads, per held service, only its first max_in_flight unfinished batches
        // through the partial index: the cost follows the number of held services, not
        // the size of the backlog.
        let sql = format!(
            "SELECT w.seq, c.service_id, b.batch_id, c.epoch, b.serialized_batch, w.attempts \
               FROM service_id_claims c \
               JOIN services s ON s.service_id = c.service_id \
              CROSS JOIN LATERAL ( \
                    SELECT x.seq, x.status, x.next_attempt_at_us, x.attempts FROM batch_statuses x \
                     WHERE x.service_id = c.service_id AND x.status IN {ACTIVE_STATUSES} \
                     ORDER BY x.seq LIMIT s.max_in_flight) w \
               JOIN batches b ON b.seq = w.seq \
              WHERE c.claimant = $1 AND NOT s.paused \
                AND w.status = 'QUEUED' AND w.next_attempt_at_us <= $2 \
                AND NOT EXISTS (SELECT 1 FROM batch_statuses e \
                     WHERE e.service_id = c.service_id AND e.status IN {ACTIVE_STATUSES} \
                       AND e.seq < w.seq AND {BLOCKS_LATER}) \
              ORDER BY w.seq LIMIT $3"
        );
        diesel::sql_query(sql)
            .bind::<diesel::sql_types::Text, _>(instance_id)
            .bind::<diesel::sql_types::BigInt, _>(now_us)
            .bind::<diesel::sql_types::BigInt, _>(limit)
            .load(self)
            .await
    }

    async fn gone_holders(
        &mut self,
        _my_hostname: &str,
        stuck: &[StuckHolder],
    ) -> QueryResult<Vec<String>> {
        // A killed process's sockets are closed by its kernel, and PostgreSQL ends those
        // sessions at once; a stopped (SIGSTOP) process keeps them open.
        let tags: Vec<&str> = stuck.iter().map(|h| h.session_tag.as_str()).collect();
        let alive: Vec<SessionTagRow> = diesel::sql_query(
            "SELECT DISTINCT application_name AS tag FROM pg_stat_activity \
              WHERE application_name = ANY($1)",
        )
        .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(&tags)
        .load(self)
        .await?;
        Ok(stuck
            .iter()
            .filter(|holder| !alive.iter().any(|row| row.tag == holder.session_tag))
            .map(|holder| holder.instance_id.clone())
            .collect())
    }

    async fn lock_services_for_enqueue(&mut self, service_ids: &[&str]) -> QueryResult<()> {
        services::table
            .filter(services::service_id.eq_any(service_ids))
            .select(services::service_id)
            .order(services::service_id)
            .for_update()
            .load::<String>(self)
            .await
            .map(drop)
    }

    async fn insert_new_batches(
        &mut self,
        rows: &[NewBatchRow<'_>],
    ) -> QueryResult<Vec<(i64, String)>> {
        let mut inserted = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(PG_INSERT_CHUNK_ROWS) {
            let mut ids: Vec<(i64, String)> = diesel::insert_into(batches::table)
                .values(chunk)
                .on_conflict((batches::service_id, batches::batch_id))
                .do_nothing()
                .returning((batches::seq, batches::batch_id))
                .get_results(self)
                .await?;
            inserted.append(&mut ids);
        }
        Ok(inserted)
    }

    async fn insert_statuses(&mut self, rows: &[NewStatusRow<'_>]) -> QueryResult<()> {
        for chunk in rows.chunks(PG_INSERT_CHUNK_ROWS) {
            diesel::insert_into(batch_statuses::table)
                .values(chunk)
                .execute(self)
                .await?;
        }
        Ok(())
    }

    async fn insert_events(&mut self, rows: &[NewEventRow<'_>]) -> QueryResult<()> {
        for chunk in rows.chunks(PG_INSERT_CHUNK_ROWS) {
            diesel::insert_into(batch_events::table)
                .values(chunk)
                .execute(self)
                .await?;
        }
        Ok(())
    }
}

/// SQLite's limit is 32,766 host parameters per statement.
const SQLITE_MAX_PARAMS: usize = 32_000;

/// `(?, ?, ?), (?, ?, ?)`: the VALUES list for `rows` rows of `columns` columns.
fn sqlite_placeholders(columns: usize, rows: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

#[derive(QueryableByName)]
struct InsertedBatch {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    batch_id: String,
}

impl Dialect for SqliteConn {
    fn row_lock_clause(&self) -> &'static str {
        ""
    }

    fn claim_lock_in_order(&self) -> &'static str {
        ""
    }

    async fn lock_held_claims(
        &mut self,
        instance_id: &str,
        service_ids: &[&str],
        fast_expiry_after: Option<i64>,
    ) -> QueryResult<Vec<(String, i64)>> {
        load_held_claims!(self, "", instance_id, service_ids, fast_expiry_after)
    }

    async fn select_submittable(
        &mut self,
        instance_id: &str,
        now_us: i64,
        limit: i64,
    ) -> QueryResult<Vec<SubmittableBatch>> {
        // SQLite has no LATERAL and no correlated LIMIT: take each held service's first
        // few unfinished batches (as many as the largest max_in_flight), then keep those
        // with fewer than max_in_flight unfinished batches before them.
        let sql = format!(
            "SELECT bs.seq, c.service_id, b.batch_id, c.epoch, b.serialized_batch, bs.attempts \
               FROM service_id_claims c \
               JOIN services s ON s.service_id = c.service_id \
               JOIN batch_statuses bs ON bs.seq IN ( \
                    SELECT x.seq FROM batch_statuses x \
                     WHERE x.service_id = c.service_id AND x.status IN {ACTIVE_STATUSES} \
                     ORDER BY x.seq LIMIT (SELECT MAX(max_in_flight) FROM services)) \
               JOIN batches b ON b.seq = bs.seq \
              WHERE c.claimant = $1 AND NOT s.paused \
                AND bs.status = 'QUEUED' AND bs.next_attempt_at_us <= $2 \
                AND (SELECT COUNT(*) FROM batch_statuses z \
                      WHERE z.service_id = c.service_id AND z.status IN {ACTIVE_STATUSES} \
                        AND z.seq < bs.seq) < s.max_in_flight \
                AND NOT EXISTS (SELECT 1 FROM batch_statuses e \
                     WHERE e.service_id = c.service_id AND e.status IN {ACTIVE_STATUSES} \
                       AND e.seq < bs.seq AND {BLOCKS_LATER}) \
              ORDER BY bs.seq LIMIT $3"
        );
        diesel::sql_query(sql)
            .bind::<diesel::sql_types::Text, _>(instance_id)
            .bind::<diesel::sql_types::BigInt, _>(now_us)
            .bind::<diesel::sql_types::BigInt, _>(limit)
            .load(self)
            .await
    }

    async fn gone_holders(
        &mut self,
        my_hostname: &str,
        stuck: &[StuckHolder],
    ) -> QueryResult<Vec<String>> {
        // A holder on another host (a shared file system) cannot be probed: it stays
        // alive for us, and its services wait for the slow expiry.
        Ok(stuck
            .iter()
            .filter(|holder| holder.hostname == my_hostname && local_process_gone(holder.pid))
            .map(|holder| holder.instance_id.clone())
            .collect())
    }

    async fn lock_services_for_enqueue(&mut self, _service_ids: &[&str]) -> QueryResult<()> {
        // Every SQLite write transaction starts with BEGIN IMMEDIATE and so already holds
        // the database's single write lock.
        Ok(())
    }

    // The inserts below are raw SQL with a bind list built at run time, because diesel's
    // typed multi-row insert for SQLite exists only on its synchronous connection. Each
    // statement crosses to SQLite's blocking thread once, so many rows per statement
    // matter as much here as round trips do on PostgreSQL.

    async fn insert_new_batches(
        &mut self,
        rows: &[NewBatchRow<'_>],
    ) -> QueryResult<Vec<(i64, String)>> {
        use diesel::sql_types::{BigInt, Binary, Text};
        let mut inserted = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(SQLITE_MAX_PARAMS / 4) {
            let sql = format!(
                "INSERT INTO batches (service_id, batch_id, serialized_batch, created_at_us) \
                 VALUES {} ON CONFLICT (service_id, batch_id) DO NOTHING RETURNING seq, batch_id",
                sqlite_placeholders(4, chunk.len())
            );
            let mut query = diesel::sql_query(sql).into_boxed();
            for row in chunk {
                query = query
                    .bind::<Text, _>(row.service_id)
                    .bind::<Text, _>(row.batch_id)
                    .bind::<Binary, _>(row.serialized_batch)
                    .bind::<BigInt, _>(row.created_at_us);
            }
            let returned: Vec<InsertedBatch> = query.load(self).await?;
            inserted.extend(returned.into_iter().map(|row| (row.seq, row.batch_id)));
        }
        // RETURNING order is unspecified in SQLite; callers rely on seq order.
        inserted.sort_unstable_by_key(|(seq, _)| *seq);
        Ok(inserted)
    }

    async fn insert_statuses(&mut self, rows: &[NewStatusRow<'_>]) -> QueryResult<()> {
        use diesel::sql_types::{BigInt, Text};
        for chunk in rows.chunks(SQLITE_MAX_PARAMS / 5) {
            let sql = format!(
                "INSERT INTO batch_statuses \
                 (seq, service_id, status, next_attempt_at_us, updated_at_us) VALUES {}",
                sqlite_placeholders(5, chunk.len())
            );
            let mut query = diesel::sql_query(sql).into_boxed();
            for row in chunk {
                query = query
                    .bind::<BigInt, _>(row.seq)
                    .bind::<Text, _>(row.service_id)
                    .bind::<Text, _>(row.status)
                    .bind::<BigInt, _>(row.next_attempt_at_us)
                    .bind::<BigInt, _>(row.updated_at_us);
            }
            query.execute(self).await?;
        }
        Ok(())
    }

    async fn insert_events(&mut self, rows: &[NewEventRow<'_>]) -> QueryResult<()> {
        use diesel::sql_types::{BigInt, Nullable, Text};
        for chunk in rows.chunks(SQLITE_MAX_PARAMS / 7) {
            let sql = format!(
                "INSERT INTO batch_events \
                 (seq, old_status, new_status, epoch, instance_id, detail, at_us) VALUES {}",
                sqlite_placeholders(7, chunk.len())
            );
            let mut query = diesel::sql_query(sql).into_boxed();
            for row in chunk {
                query = query
                    .bind::<BigInt, _>(row.seq)
                    .bind::<Nullable<Text>, _>(row.old_status)
                    .bind::<Text, _>(row.new_status)
                    .bind::<Nullable<BigInt>, _>(row.epoch)
                    .bind::<Nullable<Text>, _>(row.instance_id)
                    .bind::<Nullable<Text>, _>(row.detail)
                    .bind::<BigInt, _>(row.at_us);
            }
            query.execute(self).await?;
        }
        Ok(())
    }
}
