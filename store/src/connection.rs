//! Connection pools for the two backends, chosen by URL, and the per-session settings each
//! backend needs before it is safe to share between several dltsub processes.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use diesel::SqliteConnection;
use diesel_async::pooled_connection::bb8::Pool as Bb8Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures::FutureExt;

use crate::StoreError;

pub type PgConn = AsyncPgConnection;
pub type SqliteConn = SyncConnectionWrapper<SqliteConnection>;

/// Which database dltsub talks to, parsed from `postgres://…` / `postgresql://…` or
/// `sqlite://PATH` (`sqlite:///abs/path.db` or `sqlite://relative.db`).
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// Kept as given: tokio-postgres understands multi-host URLs and
    /// `target_session_attrs=read-write`, which a failover setup needs.
    Postgres(String),
    Sqlite(PathBuf),
}

impl DatabaseUrl {
    pub fn backend_name(&self) -> &'static str {
        match self {
            DatabaseUrl::Postgres(_) => "postgres",
            DatabaseUrl::Sqlite(_) => "sqlite",
        }
    }

    /// The URL with any password replaced by `***`, for logs and `dltsub config`.
    pub fn redacted(&self) -> String {
        match self {
            DatabaseUrl::Postgres(raw) => match url::Url::parse(raw) {
                Ok(mut parsed) if parsed.password().is_some() => {
                    let _ = parsed.set_password(Some("***"));
                    parsed.to_string()
                }
                _ => raw.clone(),
            },
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        if let Some(path) = raw.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err("a sqlite URL needs a file path, e.g. sqlite://dltsub.db".into());
            }
            if path.starts_with(':') {
                // One in-memory database per connection would give every pooled
                // connection its own empty database.
                return Err("in-memory SQLite is not supported; give a file path".into());
            }
            return Ok(DatabaseUrl::Sqlite(PathBuf::from(path)));
        }
        if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            // tokio-postgres is the final judge (multi-host lists are not valid `url::Url`s),
            // so parse with its own config parser to report errors up front.
            raw.parse::<tokio_postgres::Config>()
                .map_err(|error| format!("not a valid PostgreSQL URL: {error}"))?;
            return Ok(DatabaseUrl::Postgres(raw.to_string()));
        }
        Err("expected a URL starting with postgres://, postgresql:// or sqlite://".into())
    }
}

/// Everything needed to open a pool. Built from dltsub's configuration.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub url: DatabaseUrl,
    /// Upper bound of pooled connections of this process.
    pub pool_size: u32,
    /// How long to wait for a pooled connection (and to open one) before failing.
    pub connect_timeout: Duration,
    /// PostgreSQL `statement_timeout`: no query of a stalled plan holds locks forever.
    pub statement_timeout: Duration,
    /// PostgreSQL `lock_timeout`: a row lock held by a stalled instance fails us fast.
    pub lock_timeout: Duration,
    /// PostgreSQL `idle_in_transaction_session_timeout`: a process stopped (SIGSTOP)
    /// inside a transaction has it ended by the server, releasing its locks.
    pub idle_in_transaction_timeout: Duration,
    /// SQLite `busy_timeout`: how long a writer waits for another process's write lock.
    pub sqlite_busy_timeout: Duration,
    /// Added to the database clock by every store opened with these options. Zero in
    /// production; tests advance it to move past expiries without sleeping.
    pub clock_offset: ClockOffset,
    /// PostgreSQL `application_name` of every session. A `dltsub run` instance sets its
    /// `InstanceInfo::session_tag` here: while any session carries it, other instances
    /// know the process lives (see `liveness.rs`). `None`: the driver's default.
    pub application_name: Option<String>,
}

/// A shift of the database clock shared by every handle that holds a clone of it.
#[derive(Debug, Clone, Default)]
pub struct ClockOffset(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl ClockOffset {
    /// Moves the clock of every sharing handle forward by `by`.
    pub fn advance(&self, by: Duration) {
        let micros = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        self.0
            .fetch_add(micros, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn micros(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl StoreOptions {
    /// Defaults suitable for tests and for a single host.
    pub fn new(url: DatabaseUrl) -> Self {
        Self {
            url,
            pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(2),
            idle_in_transaction_timeout: Duration::from_secs(10),
            sqlite_busy_timeout: Duration::from_secs(5),
            clock_offset: ClockOffset::default(),
            application_name: None,
        }
    }
}

#[derive(Clone)]
pub(crate) enum Pool {
    Postgres(Bb8Pool<PgConn>),
    Sqlite(Bb8Pool<SqliteConn>),
}

/// Counts the round trips (statements, BEGIN, COMMIT, ROLLBACK) of every connection of a
/// pool, so benchmarks and metrics can show statements per operation.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl RoundTrips {
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn instrumentation(&self) -> impl diesel::connection::Instrumentation {
        use diesel::connection::InstrumentationEvent as Event;
        let counter = self.0.clone();
        move |event: Event<'_>| {
            // BEGIN, COMMIT and ROLLBACK are sent as queries too, so they appear here as
            // well as in the transaction events; count only the queries.
            if matches!(event, Event::StartQuery { .. }) {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

pub(crate) async fn open_pool(
    options: &StoreOptions,
    round_trips: &RoundTrips,
) -> Result<Pool, StoreError> {
    match &options.url {
        DatabaseUrl::Postgres(url) => {
            let session_sql = postgres_session_sql(options);
            let mut config = ManagerConfig::<PgConn>::default();
            // The default check-out test (`SELECT 1`) would add a round trip to every
            // transaction; a broken connection surfaces on first use instead, and the
            // loops retry.
            config.recycling_method = RecyclingMethod::Fast;
            let round_trips = round_trips.clone();
            config.custom_setup = Box::new(move |url| {
                let session_sql = session_sql.clone();
                let round_trips = round_trips.clone();
                async move {
                    let mut conn = PgConn::establish(url).await?;
                    conn.set_instrumentation(round_trips.instrumentation());
                    conn.batch_execute(&session_sql).await.map_err(|error| {
                        diesel::ConnectionError::BadConnection(error.to_string())
                    })?;
                    Ok(conn)
                }
                .boxed()
            });
            let manager = AsyncDieselConnectionManager::new_with_config(url.clone(), config);
            let pool = Bb8Pool::builder()
                .max_size(options.pool_size)
                .connection_timeout(options.connect_timeout)
                .build(manager)
                .await
                .map_err(|error| StoreError::Connect(error.to_string()))?;
            Ok(Pool::Postgres(pool))
        }
        DatabaseUrl::Sqlite(path) => {
            let session_sql = sqlite_session_sql(options);
            let mut config = ManagerConfig::<SqliteConn>::default();
            config.recycling_method = RecyclingMethod::Fast;
            let round_trips = round_trips.clone();
            config.custom_setup = Box::new(move |path| {
                let session_sql = session_sql.clone();
                let round_trips = round_trips.clone();
                async move {
                    let mut conn = SqliteConn::establish(path).await?;
                    conn.set_instrumentation(round_trips.instrumentation());
                    conn.batch_execute(&session_sql).await.map_err(|error| {
                        diesel::ConnectionError::BadConnection(error.to_string())
                    })?;
                    Ok(conn)
                }
                .boxed()
            });
            let path = path.to_str().ok_or_else(|| StoreError::InvalidUrl {
                url: path.display().to_string(),
                reason: "the SQLite path is not valid UTF-8".into(),
            })?;
            let manager = AsyncDieselConnectionManager::new_with_config(path, config);
            let pool = Bb8Pool::builder()
                .max_size(options.pool_size)
                .connection_timeout(options.connect_timeout)
                .build(manager)
                .await
                .map_err(|error| StoreError::Connect(error.to_string()))?;
            Ok(Pool::Sqlite(pool))
        }
    }
}

fn postgres_session_sql(options: &StoreOptions) -> String {
    let mut sql = format!(
        "SET statement_timeout = {}; SET lock_timeout = {}; \
         SET idle_in_transaction_session_timeout = {}; SET TIME ZONE 'UTC';",
        options.statement_timeout.as_millis(),
        options.lock_timeout.as_millis(),
        options.idle_in_transaction_timeout.as_millis(),
    );
    if let Some(name) = &options.application_name {
        // A string literal: quotes doubled.
        sql.push_str(&format!(
            " SET application_name = '{}';",
            name.replace('\'', "''")
        ));
    }
    sql
}

fn sqlite_session_sql(options: &StoreOptions) -> String {
    // busy_timeout first: a new connection's timeout is 0, and switching to WAL can itself
    // meet another process's lock. WAL lets readers proceed while one process writes;
    // synchronous=NORMAL is durable across process crashes in WAL mode.
    format!(
        "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
         PRAGMA foreign_keys = ON;",
        options.sqlite_busy_timeout.as_millis(),
    )
}

/// Runs `$body` with `$conn` bound to a pooled connection of whichever backend the store
/// uses. The body is compiled once per backend, so it is written once with diesel code both
/// accept; where the backends must differ it calls a [`crate::dialect::Dialect`] method.
macro_rules! with_conn {
    ($store:expr, |$conn:ident| $body:expr) => {{
        match &$store.pool {
            $crate::connection::Pool::Postgres(pool) => {
                let mut pooled = pool.get().await.map_err($crate::StoreError::from_pool)?;
                let $conn: &mut $crate::connection::PgConn = &mut pooled;
                $body
            }
            $crate::connection::Pool::Sqlite(pool) => {
                let mut pooled = pool.get().await.map_err($crate::StoreError::from_pool)?;
                let $conn: &mut $crate::connection::SqliteConn = &mut pooled;
                $body
            }
        }
    }};
}

/// Like [`with_conn!`], inside one write transaction. On SQLite the transaction starts with
/// `BEGIN IMMEDIATE`, taking the write lock up front: a deferred transaction that reads and
/// then writes fails with "database is locked" when another process wrote in between.
macro_rules! write_transaction {
    ($store:expr, |$conn:ident| $body:expr) => {{
        match &$store.pool {
            $crate::connection::Pool::Postgres(pool) => {
                let mut pooled = pool.get().await.map_err($crate::StoreError::from_pool)?;
                let result: Result<_, $crate::StoreError> =
                    diesel_async::AsyncConnection::transaction(
                        &mut *pooled,
                        async |$conn: &mut $crate::connection::PgConn| $body,
                    )
                    .await;
                result
            }
            $crate::connection::Pool::Sqlite(pool) => {
                // Writers of this process queue here rather than in SQLite's busy handler,
                // which polls with sleeps of up to 100 ms; other processes still meet
                // busy_timeout.
                let _gate = $store.sqlite_write_gate.lock().await;
                let mut pooled = pool.get().await.map_err($crate::StoreError::from_pool)?;
                let result: Result<_, $crate::StoreError> = pooled
                    .immediate_transaction(async |$conn: &mut $crate::connection::SqliteConn| $body)
                    .await;
                result
            }
        }
    }};
}

pub(crate) use {with_conn, write_transaction};
