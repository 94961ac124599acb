//! Embedded migrations, one folder per backend, applied by `dltsub migrate` and (by
//! default) when `dltsub run` starts.
//!
//! Instances that start together race to migrate: two PostgreSQL sessions creating the same
//! tables fail with `duplicate key … pg_type_typname_nsp_index`. So on PostgreSQL the
//! migration runs under a session advisory lock, and on SQLite inside one `BEGIN IMMEDIATE`
//! transaction; whoever comes second finds nothing left to apply.

use diesel::migration::MigrationSource;
use diesel::{Connection, SqliteConnection};
use diesel_async::{AsyncConnection, AsyncMigrationHarness, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

use crate::StoreError;
use crate::connection::{DatabaseUrl, PgConn, StoreOptions};

const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations/postgres");
const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations/sqlite");

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions applied by this run, oldest first; empty when the schema was current.
    pub applied: Vec<String>,
    /// How many migrations the binary knows for this backend.
    pub known: usize,
}

/// Applies every pending migration. Safe to call from many processes at once.
pub async fn run_migrations(options: &StoreOptions) -> Result<MigrationReport, StoreError> {
    match &options.url {
        DatabaseUrl::Postgres(url) => migrate_postgres(url, options).await,
        DatabaseUrl::Sqlite(path) => {
            let path = path.clone();
            let busy_timeout = options.sqlite_busy_timeout;
            tokio::task::spawn_blocking(move || migrate_sqlite(&path, busy_timeout))
                .await
                .map_err(|error| StoreError::Migration(format!("migration task failed: {error}")))?
        }
    }
}

/// The versions known to this binary for the backend of `url`, oldest first.
pub fn known_migrations(url: &DatabaseUrl) -> Vec<String> {
    let source = match url {
        DatabaseUrl::Postgres(_) => POSTGRES_MIGRATIONS,
        DatabaseUrl::Sqlite(_) => SQLITE_MIGRATIONS,
    };
    let migrations = MigrationSource::<diesel::pg::Pg>::migrations(&source).unwrap_or_default();
    migrations
        .iter()
        .map(|m| m.name().version().to_string())
        .collect()
}

async fn migrate_postgres(
    url: &str,
    options: &StoreOptions,
) -> Result<MigrationReport, StoreError> {
    let mut conn = tokio::time::timeout(options.connect_timeout, PgConn::establish(url))
        .await
        .map_err(|_| {
            StoreError::Connect(format!(
                "no connection within {:?}",
                options.connect_timeout
            ))
        })?
        .map_err(|error| StoreError::Connect(error.to_string()))?;
    // The key is per schema so that parallel tests, each in its own schema, don't queue
    // behind each other; production instances share the schema and so the lock.
    conn.batch_execute("SELECT pg_advisory_lock(hashtext('dltsub.migrate.' || current_schema()));")
        .await?;
    let known = MigrationSource::<diesel::pg::Pg>::migrations(&POSTGRES_MIGRATIONS)
        .map_err(|error| StoreError::Migration(error.to_string()))?
        .len();
    // The harness drives diesel's synchronous migration code with block_in_place, which
    // needs the multi-threaded runtime the daemon and the tests use.
    let mut harness = AsyncMigrationHarness::new(conn);
    let applied = harness
        .run_pending_migrations(POSTGRES_MIGRATIONS)
        .map(|versions| versions.iter().map(ToString::to_string).collect())
        .map_err(|error| StoreError::Migration(error.to_string()));
    // Dropping the connection would release the lock too; unlocking keeps it explicit.
    let mut conn = harness.into_inner();
    conn.batch_execute("SELECT pg_advisory_unlock_all();")
        .await?;
    Ok(MigrationReport {
        applied: applied?,
        known,
    })
}

fn migrate_sqlite(
    path: &std::path::Path,
    busy_timeout: std::time::Duration,
) -> Result<MigrationReport, StoreError> {
    let path_text = path
        .to_str()
        .ok_or_else(|| StoreError::Migration("the SQLite path is not valid UTF-8".into()))?;
    let mut conn = SqliteConnection::establish(path_text)
        .map_err(|error| StoreError::Connect(error.to_string()))?;
    crate::connection::SqliteSetup::new(busy_timeout).apply_blocking(&mut conn)?;
    let known = MigrationSource::<diesel::sqlite::Sqlite>::migrations(&SQLITE_MIGRATIONS)
        .map_err(|error| StoreError::Migration(error.to_string()))?
        .len();
    // One immediate transaction around the whole run: a second process waits on the write
    // lock (busy_timeout) and then finds every migration applied. diesel runs each migration
    // in a savepoint inside it.
    let applied = conn
        .immediate_transaction(|conn| {
            conn.run_pending_migrations(SQLITE_MIGRATIONS)
                .map(|versions| versions.iter().map(ToString::to_string).collect())
        })
        .map_err(|error: Box<dyn std::error::Error + Send + Sync>| {
            StoreError::Migration(error.to_string())
        })?;
    Ok(MigrationReport { applied, known })
}

impl crate::Store {
    /// How many of this binary's migrations the database has not applied (0 = current).
    pub async fn pending_migrations(&self) -> Result<usize, StoreError> {
        use diesel_async::RunQueryDsl;
        let known = known_migrations(self.url());
        let applied: Vec<String> = crate::connection::with_conn!(self, |conn| {
            Ok::<_, StoreError>(
                diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
                    .load::<AppliedVersion>(conn)
                    .await?
                    .into_iter()
                    .map(|row| row.version)
                    .collect(),
            )
        })?;
        Ok(known
            .iter()
            .filter(|version| !applied.contains(version))
            .count())
    }
}

impl crate::Store {
    /// Ok when the database accepts writes: always on SQLite; on PostgreSQL when this
    /// session is on the primary. [`StoreError::ReadOnly`] on a standby (the session is
    /// then dropped, so the next one looks for the primary). For `/readyz`.
    pub async fn check_writable(&self) -> Result<(), StoreError> {
        use diesel_async::RunQueryDsl;
        match self.url() {
            DatabaseUrl::Sqlite(_) => Ok(()),
            DatabaseUrl::Postgres(_) => crate::connection::with_conn!(self, |conn| {
                let row: ReadOnlySetting = diesel::sql_query(
                    "SELECT current_setting('transaction_read_only') AS transaction_read_only",
                )
                .get_result(conn)
                .await?;
                if row.transaction_read_only == "on" {
                    Err(StoreError::ReadOnly)
                } else {
                    Ok(())
                }
            }),
        }
    }
}

#[derive(diesel::QueryableByName)]
struct ReadOnlySetting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    transaction_read_only: String,
}

#[derive(diesel::QueryableByName)]
struct AppliedVersion {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}
