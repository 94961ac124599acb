//! Databases for tests: every test gets its own, so tests run in parallel and leave
//! nothing behind.
//!
//! - PostgreSQL: a fresh schema in the database named by `DLTSUB_TEST_DATABASE_URL`
//!   (default `postgres://dltsub:dltsub@127.0.0.1:5432/dltsub_test`, which `scripts/test`
//!   creates), selected through the connection's `search_path` and dropped when the
//!   [`TestDatabase`] is dropped.
//! - SQLite: a file in a fresh temporary directory, removed on drop.
//!
//! A missing PostgreSQL is a test failure, not a skip: the test script sets it up.

use std::path::PathBuf;

use crate::{DatabaseUrl, MigrationReport, Store, StoreError, StoreOptions, run_migrations};

pub const DEFAULT_TEST_DATABASE_URL: &str = "postgres://dltsub:dltsub@127.0.0.1:5432/dltsub_test";

/// The backends every storage behaviour is tested against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Postgres,
    Sqlite,
}

/// A database of one test's own. Dropping it removes it.
pub struct TestDatabase {
    pub options: StoreOptions,
    cleanup: Cleanup,
}

enum Cleanup {
    DropSchema { admin_url: String, schema: String },
    RemoveDir(PathBuf),
}

impl TestDatabase {
    /// An empty database (no schema applied yet).
    pub async fn empty(backend: TestBackend) -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        match backend {
            TestBackend::Postgres => {
                let admin_url = std::env::var("DLTSUB_TEST_DATABASE_URL")
                    .unwrap_or_else(|_| DEFAULT_TEST_DATABASE_URL.to_string());
                let schema = format!("test_{}", &suffix[..16]);
                run_admin_sql(&admin_url, &format!("CREATE SCHEMA {schema}"))
                    .await
                    .unwrap_or_else(|error| {
                        panic!(
                            "cannot create a test schema in {admin_url} ({error}); \
                             run the tests through scripts/test, which sets up PostgreSQL"
                        )
                    });
                let separator = if admin_url.contains('?') { '&' } else { '?' };
                let url = format!("{admin_url}{separator}options=-csearch_path%3D{schema}");
                Self {
                    options: StoreOptions::new(url.parse().expect("test database URL")),
                    cleanup: Cleanup::DropSchema { admin_url, schema },
                }
            }
            TestBackend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("dltsub-test-{suffix}"));
                std::fs::create_dir_all(&dir).expect("create a temporary directory");
                let path = dir.join("dltsub.db");
                Self {
                    options: StoreOptions::new(DatabaseUrl::Sqlite(path)),
                    cleanup: Cleanup::RemoveDir(dir),
                }
            }
        }
    }

    /// A database with every migration applied.
    pub async fn migrated(backend: TestBackend) -> Self {
        let database = Self::empty(backend).await;
        database.migrate().await.expect("migrate the test database");
        database
    }

    pub async fn migrate(&self) -> Result<MigrationReport, StoreError> {
        run_migrations(&self.options).await
    }

    /// On PostgreSQL, the URL of the database without the schema selection, and the name
    /// of this database's schema: for benchmark peers that install their own tables in it.
    pub fn postgres_schema(&self) -> Option<(&str, &str)> {
        match &self.cleanup {
            Cleanup::DropSchema { admin_url, schema } => Some((admin_url, schema)),
            Cleanup::RemoveDir(_) => None,
        }
    }

    /// A new pool on this database.
    pub async fn store(&self) -> Store {
        Store::connect(&self.options)
            .await
            .expect("connect to the test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::DropSchema { admin_url, schema } => {
                // Drop may run inside a tokio runtime, which must not block on another
                // runtime; a plain thread with its own small runtime may.
                let admin_url = admin_url.clone();
                let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
                let _ = std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("cleanup runtime");
                    if let Err(error) = runtime.block_on(run_admin_sql(&admin_url, &sql)) {
                        eprintln!("warning: could not drop test schema: {error}");
                    }
                })
                .join();
            }
            Cleanup::RemoveDir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

async fn run_admin_sql(url: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(sql).await;
    drop(client);
    let _ = driver.await;
    result
}

/// Declares one test per backend for each named `async fn(TestBackend)`:
/// `backend_tests!(enqueue_is_idempotent)` yields `postgres::enqueue_is_idempotent` and
/// `sqlite::enqueue_is_idempotent`, so a test's name says which backend it ran on.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::testing::TestBackend::Postgres).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::testing::TestBackend::Sqlite).await
                }
            )+
        }
    };
}

impl Store {
    /// Evaluates one SQL expression of type BIGINT on a pooled connection (so with this
    /// store's session settings). For tests that look at the database directly.
    pub async fn scalar_i64_for_tests(&self, sql_expression: &str) -> i64 {
        self.try_scalar_i64(sql_expression)
            .await
            .unwrap_or_else(|error| panic!("{sql_expression}: {error}"))
    }

    async fn try_scalar_i64(&self, sql_expression: &str) -> Result<i64, crate::StoreError> {
        use diesel_async::RunQueryDsl;
        let expression = diesel::dsl::sql::<diesel::sql_types::BigInt>(sql_expression);
        crate::connection::with_conn!(self, |conn| {
            Ok(diesel::select(expression.clone())
                .get_result::<i64>(conn)
                .await?)
        })
    }

    /// Runs one SQL statement (tests only, never user input) and returns rows affected.
    pub async fn execute_for_tests(&self, sql: &str) -> usize {
        use diesel_async::RunQueryDsl;
        let result: Result<usize, crate::StoreError> = async {
            crate::connection::with_conn!(self, |conn| {
                Ok(diesel::sql_query(sql).execute(conn).await?)
            })
        }
        .await;
        result.unwrap_or_else(|error| panic!("{sql}: {error}"))
    }

    /// For every COMMITTED batch accepted at or after `accepted_since_us`, the time from
    /// its acceptance (`created_at_us`) to its COMMITTED status being recorded, in
    /// microseconds, both on the database clock. For benchmarks (`dltsub bench all`).
    pub async fn commit_latencies_us_for_bench(
        &self,
        accepted_since_us: i64,
    ) -> Result<Vec<i64>, StoreError> {
        use crate::schema::{batch_statuses, batches};
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        crate::connection::with_conn!(self, |conn| {
            Ok(batches::table
                .inner_join(batch_statuses::table)
                .filter(batch_statuses::status.eq(crate::BatchStatus::Committed.as_str()))
                .filter(batches::created_at_us.ge(accepted_since_us))
                .select(batch_statuses::updated_at_us - batches::created_at_us)
                .load::<i64>(conn)
                .await?)
        })
    }

    /// Rows in `table` (a name from the schema; tests only, never user input).
    pub async fn count_rows_for_tests(&self, table: &str) -> i64 {
        self.scalar_i64_for_tests(&format!("(SELECT COUNT(*) FROM {table})"))
            .await
    }
}
