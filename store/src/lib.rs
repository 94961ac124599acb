#![doc = include_str!("../README.md")]

mod claims;
mod clock;
mod connection;
mod console;
mod dialect;
mod enqueue;
mod gauges;
mod liveness;
mod migrate;
mod operator;
mod pinning;
mod retention;
mod rows;
mod schema;
mod status;
mod submission;
#[cfg(feature = "test-support")]
pub mod testing;
mod transitions;

use diesel_async::RunQueryDsl;

pub use claims::{
    ClaimRecord, ClaimTiming, ClusterView, GroupPlan, HeldClaim, InstanceInfo, InstanceRecord,
    InstanceState, LEADER_LEASE, LiveInstance, SHARD_RANGE, TickOutcome, TickPlan, service_shard,
};
pub use clock::DbNowMicros;
pub use connection::{
    ClockOffset, DatabaseUrl, RoundTrips, StoreOptions, is_read_only_error, redact_url,
};
pub use console::{
    BatchPage, CommitBucket, MAX_PAGE, ServiceFilter, ServicePage, ServiceRow, ServiceSubset,
};
pub use enqueue::{EnqueuedBatch, NewBatch, is_batch_id};
pub use gauges::{BacklogGauges, StatusGauge};
pub use migrate::{MigrationReport, known_migrations, run_migrations};
pub use operator::{
    BatchEvent, BatchMove, BatchMoveKind, BatchRecord, MAX_IN_FLIGHT_LIMIT, ServiceRecord,
};
pub use pinning::{MAX_LABEL_LEN, Pin, ServiceGroup, is_label, parse_labels};
pub use status::BatchStatus;
pub use submission::{FencedOutcome, SubmittableBatch};
pub use transitions::{BatchState, PollableBatch, Transition, UnknownSince};

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
    /// The service already has `limit` unfinished batches (or would have more with these).
    /// Nothing was written; the client should retry later.
    #[error(
        "service {service_id} has {unfinished} unfinished batches; the limit is {limit}: retry later"
    )]
    QueueFull {
        service_id: String,
        unfinished: i64,
        limit: u64,
    },
    /// The server answers but accepts no writes: a standby, or a primary being demoted.
    /// The connection that saw it is dropped; the next one looks for the primary.
    #[error("the database server is read-only (a standby, not the primary)")]
    ReadOnly,
    /// A fault injected at a chaos event point (only in builds with the `chaos` feature).
    #[error("{0}")]
    Injected(String),
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
    /// Added to the database clock; zero except in tests that move time forward.
    clock_offset: ClockOffset,
    /// Round trips made through this pool (every clone of this handle shares the count).
    round_trips: RoundTrips,
    /// Serialises this process's SQLite write transactions (see `write_transaction!`).
    sqlite_write_gate: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Store {
    /// Opens a pool. Does not migrate: see [`run_migrations`].
    pub async fn connect(options: &StoreOptions) -> Result<Self, StoreError> {
        let round_trips = RoundTrips::default();
        Ok(Self {
            pool: connection::open_pool(options, &round_trips).await?,
            round_trips,
            url: options.url.clone(),
            clock_offset: options.clock_offset.clone(),
            sqlite_write_gate: Default::default(),
        })
    }

    /// The same pool, seeing the database clock shifted by `offset` (and not by the
    /// offset shared with other handles). For tests.
    pub fn with_clock_offset(&self, offset: std::time::Duration) -> Self {
        let clock_offset = ClockOffset::default();
        clock_offset.advance(offset);
        Self {
            clock_offset,
            ..self.clone()
        }
    }

    /// Statements, BEGINs and COMMITs sent through this handle's pool so far.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.get()
    }

    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// `now` on the database clock (plus this handle's offset), as an SQL expression.
    pub(crate) fn now(&self) -> DbNowMicros {
        DbNowMicros::with_offset(self.clock_offset.micros())
    }

    /// Reads the database clock: microseconds since the Unix epoch.
    pub async fn database_now_us(&self) -> Result<i64, StoreError> {
        let now = self.now();
        with_conn!(self, |conn| {
            Ok(diesel::select(now).get_result::<i64>(conn).await?)
        })
    }
}
