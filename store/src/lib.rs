#![doc = include_str!("../README.md")]

mod clock;
mod connection;
mod dialect;
mod enqueue;
mod migrate;
mod rows;
mod schema;
mod status;
#[cfg(feature = "test-support")]
pub mod testing;

use diesel_async::RunQueryDsl;

pub use clock::DbNowMicros;
pub use connection::{DatabaseUrl, StoreOptions};
pub use enqueue::{EnqueuedBatch, NewBatch};
pub use migrate::{MigrationReport, known_migrations, run_migrations};
pub use status::BatchStatus;

use connection::{Pool, with_conn};

/// Longest accepted `service_id` (scabbard ids are `circuit::service`, both short).
pub const MAX_SERVICE_ID_LEN: usize = 256;

/// Errors at the storage boundary. Callers match on the typed variants (conflicts, bad
/// input) and report the rest as infrastructure failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot connect to the database: {0}")]
    Connect(String),
    #[error("no database connection available: {0}")]
    Pool(String),
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    #[error("migration failed: {0}")]
    Migration(String),
    /// The same batch id was accepted before with different bytes. Nothing was written.
    #[error(
        "batch {batch_id} of service {service_id} was already accepted (seq {existing_seq}) with different bytes"
    )]
    BatchConflict {
        service_id: String,
        batch_id: String,
        existing_seq: i64,
    },
    /// A request that can never succeed as given. Nothing was written.
    #[error("invalid {field}: {problem}")]
    InvalidInput {
        field: &'static str,
        problem: String,
    },
}

impl StoreError {
    pub(crate) fn from_pool<E: std::error::Error + 'static>(error: bb8::RunError<E>) -> Self {
        StoreError::Pool(error.to_string())
    }
}

/// A handle on the database: a pool of connections to PostgreSQL or SQLite. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    url: DatabaseUrl,
    /// Added to the database clock; zero except in tests that move one instance's time.
    clock_offset_us: i64,
    /// Serialises this process's SQLite write transactions (see `write_transaction!`).
    sqlite_write_gate: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Store {
    /// Opens a pool. Does not migrate: see [`run_migrations`].
    pub async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        Ok(Self {
            pool: connection::open_pool(options).await?,
            url: options.url.clone(),
            clock_offset_us: 0,
            sqlite_write_gate: Default::default(),
        })
    }

    /// The same pool, seeing the database clock shifted by `offset`. For tests that move
    /// time past an expiry without sleeping.
    pub fn with_clock_offset(&self, offset: std::time::Duration) -> Self {
        Self {
            clock_offset_us: i64::try_from(offset.as_micros()).unwrap_or(i64::MAX),
            ..self.clone()
        }
    }

    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// `now` on the database clock (plus this handle's offset), as an SQL expression.
    pub(crate) fn now(&self) -> DbNowMicros {
        DbNowMicros::with_offset(self.clock_offset_us)
    }

    /// Reads the database clock: microseconds since the Unix epoch.
    pub async fn database_now_us(&self) -> Result<i64, StoreError> {
        let now = self.now();
        with_conn!(self, |conn| {
            Ok(diesel::select(now).get_result::<i64>(conn).await?)
        })
    }
}
