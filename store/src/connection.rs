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
            DatabaseUrl::Postgres(raw) => redact_url(raw),
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        }
    }
}

/// `raw` with the password of its user information (`user:PASSWORD@host`) and the value of
/// a `password=` query parameter replaced by `***`: what logs and `dltsub config` may show
/// of a URL. Works on text, so multi-host PostgreSQL URLs (`@h1,h2/db`) and URLs that do
/// not parse are redacted too.
pub fn redact_url(raw: &str) -> String {
    let (before_query, query) = match raw.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (raw, None),
    };
    let mut out = String::with_capacity(raw.len());
    let rest = match before_query.split_once("://") {
        Some((scheme, rest)) => {
            out.push_str(scheme);
            out.push_str("://");
            rest
        }
        None => before_query,
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push('@');
            out.push_str(hosts);
        }
        None => out.push_str(authority),
    }
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
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
            // transaction. This one costs none: it refuses a connection whose socket the
            // server already closed (a primary that died or was demoted closes every
            // session), so after a failover the pool opens fresh connections — to
            // whichever host now accepts writes — instead of failing one request per stale
            // connection. A connection that breaks silently surfaces on first use, and the
            // loops retry.
            config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
                let broken = diesel_async::pooled_connection::PoolableConnection::is_broken(conn);
                async move {
                    if broken {
                        Err(diesel::result::Error::BrokenTransactionManager)
                    } else {
                        Ok(())
                    }
                }
                .boxed()
            }));
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
            let url = with_default_connect_timeout(url, options.connect_timeout);
            let manager = AsyncDieselConnectionManager::new_with_config(url, config);
            let pool = Bb8Pool::builder()
                .max_size(options.pool_size)
                // A failed connect is retried in the background with capped backoff
                // (200 ms, doubling, at most half of `connect_timeout`) while callers wait
                // up to `connect_timeout`: during a failover the first connection to the
                // new primary goes to whoever waits. (`/readyz` bounds its own wait.)
                .connection_timeout(options.connect_timeout)
                .build(manager)
                .await
                .map_err(|error| StoreError::Connect(error.to_string()))?;
            Ok(Pool::Postgres(pool))
        }
        DatabaseUrl::Sqlite(path) => {
            let setup = std::sync::Arc::new(SqliteSetup::new(options.sqlite_busy_timeout));
            let mut config = ManagerConfig::<SqliteConn>::default();
            config.recycling_method = RecyclingMethod::Fast;
            let round_trips = round_trips.clone();
            config.custom_setup = Box::new(move |path| {
                let setup = setup.clone();
                let round_trips = round_trips.clone();
                async move {
                    let mut conn = SqliteConn::establish(path).await?;
                    conn.set_instrumentation(round_trips.instrumentation());
                    setup.apply(&mut conn).await.map_err(|error| {
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

/// The URL with `connect_timeout` added unless it names one. tokio-postgres applies it to
/// each host of a multi-host URL, so a primary that vanished without closing its port (a
/// dead machine, a partition) costs that long before the next host is tried, rather than
/// the operating system's TCP timeout of minutes.
fn with_default_connect_timeout(url: &str, timeout: Duration) -> String {
    if url.contains("connect_timeout=") {
        return url.to_string();
    }
    // In whole seconds (the driver's unit), at least one: 0 would mean "no timeout".
    let seconds = timeout.as_secs().max(1);
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}connect_timeout={seconds}")
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

/// The settings every SQLite connection gets before use: busy timeout, WAL, the rest.
pub(crate) struct SqliteSetup {
    busy_timeout: Duration,
}

impl SqliteSetup {
    pub(crate) fn new(busy_timeout: Duration) -> Self {
        Self { busy_timeout }
    }

    /// First: a new connection's busy timeout is 0, so anything before it fails at once on
    /// another process's lock.
    pub(crate) fn busy_timeout_sql(&self) -> String {
        format!("PRAGMA busy_timeout = {};", self.busy_timeout.as_millis())
    }

    /// Second, retried (see [`Self::should_retry_wal`]). WAL lets readers proceed while one
    /// process writes.
    pub(crate) const WAL_SQL: &'static str = "PRAGMA journal_mode = WAL;";

    /// Third: synchronous=NORMAL is durable across process crashes in WAL mode.
    pub(crate) const REST_SQL: &'static str =
        "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;";

    /// Switching a file to WAL takes an exclusive lock, and SQLite answers "database is
    /// locked" at once, without waiting out the busy timeout, when another connection
    /// is switching the same fresh file or holds a lock the switch must wait for (its
    /// deadlock avoidance). Processes that start together on a new file meet exactly
    /// that, so the switch is retried until the busy timeout has passed.
    pub(crate) fn should_retry_wal(
        &self,
        error: &diesel::result::Error,
        started: std::time::Instant,
    ) -> bool {
        let locked = matches!(
            error,
            diesel::result::Error::DatabaseError(_, info) if info.message().contains("locked")
        );
        locked && started.elapsed() < self.busy_timeout
    }

    /// How long to wait between two attempts to switch to WAL.
    pub(crate) const WAL_RETRY_PAUSE: Duration = Duration::from_millis(20);

    /// Applies the settings to a pooled connection.
    async fn apply(&self, conn: &mut SqliteConn) -> diesel::QueryResult<()> {
        conn.batch_execute(&self.busy_timeout_sql()).await?;
        let started = std::time::Instant::now();
        loop {
            match conn.batch_execute(Self::WAL_SQL).await {
                Err(error) if self.should_retry_wal(&error, started) => {
                    tokio::time::sleep(Self::WAL_RETRY_PAUSE).await;
                }
                result => break result?,
            }
        }
        conn.batch_execute(Self::REST_SQL).await
    }

    /// Applies the settings to the migration's own synchronous connection.
    pub(crate) fn apply_blocking(&self, conn: &mut SqliteConnection) -> diesel::QueryResult<()> {
        use diesel::connection::SimpleConnection;
        conn.batch_execute(&self.busy_timeout_sql())?;
        let started = std::time::Instant::now();
        loop {
            match conn.batch_execute(Self::WAL_SQL) {
                Err(error) if self.should_retry_wal(&error, started) => {
                    std::thread::sleep(Self::WAL_RETRY_PAUSE);
                }
                result => break result?,
            }
        }
        conn.batch_execute(Self::REST_SQL)
    }
}

/// Whether `error` says the server accepts no writes: a standby, or a primary being
/// demoted (SQLSTATE 25006, `read_only_sql_transaction`).
pub fn is_read_only_error<T>(result: &Result<T, StoreError>) -> bool {
    matches!(
        result,
        Err(StoreError::ReadOnly
            | StoreError::Query(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ReadOnlyTransaction,
                _
            )))
    )
}

/// Called with every result of a PostgreSQL connection before it goes back to the pool.
/// A session on a server that turned read-only stays open, so the pool would keep handing
/// it out after a failover; ending it from the server side makes the pool drop it, and
/// the next connection is opened — `target_session_attrs=read-write` — on the new primary.
pub(crate) async fn after_postgres_error<T>(conn: &mut PgConn, result: &Result<T, StoreError>) {
    if is_read_only_error(result) {
        tracing::warn!(
            "the database server is read-only (a standby, or a primary being demoted); \
             dropping the connection so the next one finds the primary"
        );
        // The statement fails (the server ends the session while answering it); the
        // connection is closed either way, which is what is wanted.
        let _ = conn
            .batch_execute("SELECT pg_terminate_backend(pg_backend_pid())")
            .await;
    }
}

/// Runs `$body` with `$conn` bound to a pooled connection of whichever backend the store
/// uses. The body is compiled once per backend, so it is written once with diesel code both
/// accept; where the backends must differ it calls a [`crate::dialect::Dialect`] method.
macro_rules! with_conn {
    ($store:expr, |$conn:ident| $body:expr) => {{
        match &$store.pool {
            $crate::connection::Pool::Postgres(pool) => {
                let mut pooled = pool.get().await.map_err($crate::StoreError::from_pool)?;
                let result = {
                    let $conn: &mut $crate::connection::PgConn = &mut pooled;
                    $body
                };
                $crate::connection::after_postgres_error(&mut pooled, &result).await;
                result
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
                $crate::connection::after_postgres_error(&mut pooled, &result).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_timeout_is_added_unless_given() {
        let timeout = Duration::from_millis(2_500);
        assert_eq!(
            with_default_connect_timeout("postgres://u@h1:5432,h2:5433/db", timeout),
            "postgres://u@h1:5432,h2:5433/db?connect_timeout=2"
        );
        assert_eq!(
            with_default_connect_timeout(
                "postgres://u@h1,h2/db?target_session_attrs=read-write",
                Duration::from_millis(300)
            ),
            "postgres://u@h1,h2/db?target_session_attrs=read-write&connect_timeout=1"
        );
        let given = "postgres://u@h/db?connect_timeout=9";
        assert_eq!(with_default_connect_timeout(given, timeout), given);
    }

    #[test]
    fn urls_are_redacted() {
        for (raw, shown) in [
            (
                "postgres://dltsub:s3cret@db1,db2/dltsub?target_session_attrs=read-write",
                "postgres://dltsub:***@db1,db2/dltsub?target_session_attrs=read-write",
            ),
            (
                "postgres://u@h/db?sslmode=require&password=s3cret",
                "postgres://u@h/db?sslmode=require&password=***",
            ),
            (
                "postgres://u:p@ss:w0rd@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            (
                "http://user:s3cret@ledger:8008",
                "http://user:***@ledger:8008",
            ),
            ("http://ledger:8008/base", "http://ledger:8008/base"),
            ("postgres://u@h/db", "postgres://u@h/db"),
        ] {
            assert_eq!(redact_url(raw), shown, "{raw}");
        }
        let url: DatabaseUrl = "postgres://u:s3cret@h1,h2/db".parse().unwrap();
        assert_eq!(url.to_string(), "postgres://u:***@h1,h2/db");
        assert_eq!(format!("{url:?}"), "postgres://u:***@h1,h2/db");
    }
}
