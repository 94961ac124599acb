//! No secret reaches the logs or `dltsub config`: a real instance on PostgreSQL with a
//! password in `database_url`, `user:password@` in `dlt_url` and an `api_token`, logging at
//! debug level, serves traffic (batches, requests with a wrong token and with the right
//! one, a request over a limit), loses its ledger, and stops; then `dltsub config` prints
//! the same configuration and refuses broken ones. None of the output holds a secret.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use dltsub_store::Store;
use dltsub_store::testing::{TestBackend, TestDatabase};
use support::process::{Process, free_port, spawn_devnet, wait_for_http};
use support::{batch, list};

const API_TOKEN: &str = "tok-S3cret-8c1f0e7a93b24d55";
const DLT_USER: &str = "ledgeruser";
const DLT_PASSWORD: &str = "dltPass-4b7e19c2aa";
const DB_PASSWORD: &str = "pgPass-5d2a8e61f0c3";

/// The test database's URL with `DB_PASSWORD` as its password, if the server accepts it
/// (a local server trusting 127.0.0.1 accepts any); else the configured URL and its own
/// password. Answers the URL and the text that must not be seen.
async fn database_url_with_a_password(database: &TestDatabase) -> (String, Vec<String>) {
    let dltsub_store::DatabaseUrl::Postgres(raw) = &database.options.url else {
        panic!("a PostgreSQL test database");
    };
    let mut url = url::Url::parse(raw).unwrap();
    url.set_password(Some(DB_PASSWORD)).unwrap();
    let mut options = database.options.clone();
    options.url = url.as_str().parse().unwrap();
    let accepted = match Store::connect(&options).await {
        Ok(store) => store.check_writable().await.is_ok(),
        Err(_) => false,
    };
    if accepted {
        return (url.to_string(), vec![DB_PASSWORD.to_string()]);
    }
    // The server checks passwords: use the configured one, and look for it as a URL
    // carries it (it may be a common word, such as the user's name).
    let original = url::Url::parse(raw).unwrap();
    let password = original.password().unwrap_or_default().to_string();
    eprintln!("the server refused {DB_PASSWORD}; looking for the configured password instead");
    let user = original.username();
    (
        raw.clone(),
        vec![
            format!("{user}:{password}@"),
            format!("password={password}"),
        ],
    )
}

fn secrets(database_secrets: &[String]) -> Vec<String> {
    use std::iter::once;
    // What basic authentication sends: base64("ledgeruser:dltPass-4b7e19c2aa").
    let basic = "bGVkZ2VydXNlcjpkbHRQYXNzLTRiN2UxOWMyYWE=";
    once(API_TOKEN.to_string())
        .chain(once(DLT_PASSWORD.to_string()))
        .chain(once(basic.to_string()))
        .chain(database_secrets.iter().cloned())
        .collect()
}

fn assert_no_secret(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        if let Some(at) = text.find(secret.as_str()) {
            let line = text[..at].lines().count();
            panic!("{what} shows the secret {secret:?} at line {line}:\n{text}");
        }
    }
}

fn read(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_or_config_output() {
    let database = TestDatabase::migrated(TestBackend::Postgres).await;
    let store = database.store().await;
    let (database_url, database_secrets) = database_url_with_a_password(&database).await;
    let secrets = secrets(&database_secrets);
    let logs = tempfile::tempdir().unwrap();

    let devnet_port = free_port();
    let devnet_address = format!("127.0.0.1:{devnet_port}");
    let mut devnet = spawn_devnet(devnet_port, "1h").await;

    let api_port = free_port();
    let metrics_port = free_port();
    let dlt_url = format!("http://{DLT_USER}:{DLT_PASSWORD}@{devnet_address}");
    // Secrets in the environment (as deploy/ has them) and on the command line.
    let configure = |command: &mut Command| {
        command
            .env("DLTSUB_DATABASE_URL", &database_url)
            .env("DLTSUB_API_TOKEN", API_TOKEN)
            .env("DLTSUB_LOG", "debug")
            .args([
                "--dlt-url",
                &dlt_url,
                "--listen",
                &format!("127.0.0.1:{api_port}"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics_port}"),
                "--max-ids-per-query",
                "2",
                "--fast-expiry",
                "3s",
                "--slow-expiry",
                "9s",
                "--renew-interval",
                "1s",
                "--dlt-request-timeout",
                "2s",
                "--status-wait",
                "1s",
                "--status-poll-interval",
                "200ms",
            ]);
    };
    let stderr_path = logs.path().join("run.stderr");
    let stdout_path = logs.path().join("run.stdout");
    let mut command = Command::new(env!("CARGO_BIN_EXE_dltsub"));
    command.arg("run");
    configure(&mut command);
    let mut run = Process(
        command
            .stdout(std::fs::File::create(&stdout_path).unwrap())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{api_port}");
    wait_for_http(&format!("{api}/readyz")).await;
    let http = reqwest::Client::new();

    // Batches reach the ledger (with the URL's credentials as basic authentication).
    let response = http
        .post(format!("{api}/scabbard/circ/svc/batches"))
        .header("Content-Type", "application/octet-stream")
        .body(list((1..=5).map(batch).collect()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let deadline = Instant::now() + Duration::from_secs(60);
    // One batch of a service in the ledger's hands at a time (max_in_flight 1); the ledger
    // keeps it pending (commit latency 1h), so it is polled until the outage.
    while store
        .scalar_i64_for_tests(
            "(SELECT COUNT(*) FROM batch_statuses WHERE status IN ('PENDING', 'VALID'))",
        )
        .await
        < 1
    {
        assert!(
            Instant::now() < deadline,
            "the batches never reached the ledger:\n{}",
            read(&stderr_path)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Failing and passing authentication.
    let pause = format!("{api}/api/v1/services/circ::svc/pause");
    for token in [
        Some("wrong-token-000000000000"),
        None,
        Some(&API_TOKEN[1..]),
    ] {
        let mut request = http.post(&pause);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(request.send().await.unwrap().status().as_u16(), 401);
    }
    let response = http
        .post(&pause)
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let response = http
        .post(format!("{api}/api/v1/services/circ::svc/resume"))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let response = http
        .get(format!("{api}/console/api/overview"))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    // Over a limit: refused, and counted.
    let ids: Vec<String> = (1..=3).map(|n| batch(n).header_signature).collect();
    let response = http
        .get(format!("{api}/api/v1/batches?ids={}", ids.join(",")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let metrics = http
        .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("dltsub_api_limited_total{limit=\"ids_per_query\"} 1"),
        "{metrics}"
    );

    // The ledger goes away: its status polls and new POSTs fail, and the failures, which
    // quote the ledger's URLs, are logged.
    let _ = devnet.0.kill();
    let _ = devnet.0.wait();
    let response = http
        .post(format!("{api}/scabbard/circ/svc2/batches"))
        .header("Content-Type", "application/octet-stream")
        .body(list(vec![batch(6)]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !read(&stderr_path)
        .lines()
        .any(|line| line.contains(" WARN ") && line.contains(&devnet_address))
    {
        assert!(
            Instant::now() < deadline,
            "no warning quoting the ledger's address:\n{}",
            read(&stderr_path)
                .lines()
                .filter(|line| !line.contains("tokio_postgres"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let pid = run.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while run.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let log = read(&stderr_path) + &read(&stdout_path);
    // The logs are there, at the level that would show the secrets, and quote both URLs.
    assert!(log.lines().count() > 20, "{log}");
    assert!(log.contains(" DEBUG "), "logging at debug level:\n{log}");
    assert!(log.contains("dltsub instance"), "{log}");
    assert_no_secret("the instance's log", &log, &secrets);
    assert!(
        log.contains(&format!("{DLT_USER}:***@")),
        "the ledger URL, redacted:\n{log}"
    );
    assert!(log.contains("shutdown complete"), "{log}");

    // `dltsub config` with the same configuration.
    let mut command = Command::new(env!("CARGO_BIN_EXE_dltsub"));
    command.arg("config");
    configure(&mut command);
    let output = command.output().unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("dlt_url = \"http://ledgeruser:***@"),
        "{text}"
    );
    assert!(text.contains("api_token = \"<redacted>\""), "{text}");
    assert!(text.contains("database_url = \"postgres://"), "{text}");
    assert_no_secret("dltsub config", &text, &secrets);

    // Refused configurations name the key, not the secret.
    for (key, value) in [
        (
            "DLTSUB_DATABASE_URL",
            format!("postgres://dltsub:{DB_PASSWORD}@db:notaport/dltsub"),
        ),
        (
            "DLTSUB_DLT_URL",
            format!("ftp://{DLT_USER}:{DLT_PASSWORD}@ledger:8008"),
        ),
        ("DLTSUB_API_TOKEN", format!("{API_TOKEN} with spaces")),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
            .arg("config")
            .env(key, &value)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{key}");
        let text = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        let name = key.trim_start_matches("DLTSUB_").to_ascii_lowercase();
        assert!(text.contains(&name), "{key}: {text}");
        assert_no_secret(
            &format!("dltsub config with a bad {key}"),
            &text,
            &[DB_PASSWORD.into(), DLT_PASSWORD.into(), API_TOKEN.into()],
        );
    }
}
