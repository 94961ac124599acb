//! The `dltsub` binary as an operator runs it: real processes, real databases.

use std::process::{Command, Output};

use dltsub_store::testing::{TestBackend, TestDatabase};

fn dltsub(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(args)
        .env_remove("DLTSUB_CONFIG")
        .output()
        .expect("run dltsub")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn database_url_arg(database: &TestDatabase) -> String {
    match &database.options.url {
        dltsub_store::DatabaseUrl::Postgres(url) => url.clone(),
        dltsub_store::DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
    }
}

/// `dltsub migrate` creates the schema; a second run changes nothing and says so.
async fn migrate_twice(backend: TestBackend) {
    let database = TestDatabase::empty(backend).await;
    let url = database_url_arg(&database);
    let first = dltsub(&["migrate", "--database-url", &url]);
    assert!(
        first.status.success(),
        "first migrate failed: {}",
        stderr(&first)
    );
    assert!(
        stdout(&first).starts_with("applied 4 of 4 migrations"),
        "{}",
        stdout(&first)
    );

    let store = database.store().await;
    assert_eq!(
        store.count_rows_for_tests("batches").await,
        0,
        "schema exists"
    );
    let tables_before = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM __diesel_schema_migrations)")
        .await;

    let second = dltsub(&["migrate", "--database-url", &url]);
    assert!(
        second.status.success(),
        "second migrate failed: {}",
        stderr(&second)
    );
    assert!(
        stdout(&second).contains("is up to date (4 migrations)"),
        "{}",
        stdout(&second)
    );
    let tables_after = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM __diesel_schema_migrations)")
        .await;
    assert_eq!(tables_before, tables_after);
}

/// Several instances migrating one database at the same moment all succeed.
async fn concurrent_migrate_processes(backend: TestBackend) {
    let database = TestDatabase::empty(backend).await;
    let url = database_url_arg(&database);
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_dltsub"))
                .args(["migrate", "--database-url", &url])
                .output()
        })
        .collect();
    for child in children {
        let output = child.expect("run dltsub");
        assert!(output.status.success(), "{}", stderr(&output));
    }
}

dltsub_store::backend_tests!(migrate_twice, concurrent_migrate_processes);

/// Bad configuration exits non-zero with one line naming the key and the problem.
#[test]
fn bad_configuration_is_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dltsub.toml");
    std::fs::write(&file, "fast_expiry = \"10s\"\nfast_expirey = \"5s\"\n").unwrap();
    let file = file.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["config", "--fast-expiry", "60s", "--slow-expiry", "30s"],
            "fast_expiry (1m) must be shorter than slow_expiry (30s)",
        ),
        (
            &["config", "--renew-interval", "banana"],
            "renew_interval = \"banana\" (from flag --renew-interval): not a duration",
        ),
        (
            &["config", "--config", file],
            "unknown key `fast_expirey` in config file",
        ),
        (
            &["migrate", "--database-url", "postgres://host:99999999/db"],
            "database_url = \"postgres://host:99999999/db\" (from flag --database-url): not a valid PostgreSQL URL",
        ),
        (
            &["config", "--dlt-url", "localhost:8008"],
            "dlt_url = \"localhost:8008\" (from flag --dlt-url): expected an http:// or https:// URL",
        ),
    ];
    for (args, expected) in cases {
        let output = dltsub(args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert_eq!(message.lines().count(), 1, "{args:?}: {message}");
        assert!(message.contains(expected), "{args:?}: {message}");
    }
}

/// An unknown DLTSUB_ variable is a typo until proven otherwise.
#[test]
fn unknown_environment_variable_is_rejected() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["config"])
        .env("DLTSUB_SLOW_EXPIRE", "1m")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("unknown environment variable DLTSUB_SLOW_EXPIRE"));
}

/// `dltsub config` prints every key with its origin, and never a password.
#[test]
fn config_prints_effective_values_without_secrets() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args([
            "config",
            "--database-url",
            "postgres://dltsub:hunter2@db/dltsub",
        ])
        .env("DLTSUB_FAST_EXPIRY", "9s")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("fast_expiry = \"9s\"  # environment DLTSUB_FAST_EXPIRY"),
        "{text}"
    );
    assert!(text.contains("slow_expiry = \"60s\"  # default"), "{text}");
    assert!(text.contains("postgres://dltsub:***@db/dltsub"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

/// A database that cannot be reached is an operational failure (exit 1), not a usage error.
#[test]
fn unreachable_database_exits_one() {
    let output = dltsub(&[
        "migrate",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/nowhere",
        "--database-connect-timeout",
        "2s",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).starts_with("error: migrating postgres://"),
        "{}",
        stderr(&output)
    );
}
