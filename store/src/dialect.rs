//! The few places where PostgreSQL and SQLite need different SQL. Everything else is
//! written once (see `connection::with_conn!`).
//!
//! Multi-row inserts are here because diesel-async cannot send diesel's SQLite batch
//! insert (diesel implements it only for its synchronous connection).

use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::connection::{PgConn, SqliteConn};
use crate::rows::{NewBatchRow, NewEventRow, NewStatusRow};
use crate::schema::{batch_events, batch_statuses, batches, services};

/// Rows per multi-row INSERT on PostgreSQL: well under its 65,535 bind parameters.
const PG_INSERT_CHUNK_ROWS: usize = 1_000;

pub(crate) trait Dialect: Send {
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
}

impl Dialect for PgConn {
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
