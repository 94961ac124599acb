//! The operator console in a real browser: headless Chromium (Debian's `chromium`) driven
//! by Playwright's `playwright-core` (`tests/console/browser.js`) against two `dltsub run`
//! processes on PostgreSQL and the devnet ledger. The page must list the services; pausing
//! a service on its page must stop its submission (checked through the API); killing an
//! instance must move its claims, with the page showing the new holder within seconds and
//! the service pinned to the dead instance's label as unserved. Screenshots go to the
//! target directory (`console-screenshots/`), or to `docs/console/` with
//! `DLTSUB_UPDATE_SCREENSHOTS=1`.
//!
//! `scripts/setup-browser-tools` (run by `scripts/test`) installs Chromium, Node.js and
//! playwright-core. The test fails when they are missing; it is skipped only when
//! `SKIP_CONSOLE_BROWSER_TEST` is set. `CHROMIUM_PATH` and `PLAYWRIGHT_CORE_DIR` override
//! where they are looked for.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use serde_json::Value;
use support::TOKEN;
use support::process::{Process, free_port};

const SERVICES: usize = 12;
const BUSY: &str = "console::busy";
/// Pinned to the label only the instance that is killed carries.
const PINNED: &str = "console::svc11";

fn service_id(n: usize) -> String {
    format!("console::svc{n:02}")
}

fn batch_list(service: usize, range: std::ops::Range<usize>) -> Vec<u8> {
    BatchList {
        batches: range
            .map(|n| Batch {
                header: vec![service as u8, n as u8],
                header_signature: format!("{:0>128}", format!("{service:02x}{n:06x}b")),
                transactions: vec![Transaction {
                    header: vec![1],
                    header_signature: format!("{:0>128}", format!("{service:02x}{n:06x}c")),
                    payload: format!("svc {service} batch {n}").into_bytes(),
                }],
                trace: false,
            })
            .collect(),
    }
    .encode_to_vec()
}

fn spawn_logged(work: &Path, name: &str, command: &mut Command) -> Process {
    let stdout = std::fs::File::create(work.join(format!("{name}.log"))).unwrap();
    let stderr = std::fs::File::create(work.join(format!("{name}.err"))).unwrap();
    Process(
        command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .env_remove("DLTSUB_CONFIG")
            .spawn()
            .unwrap(),
    )
}

fn start_instance(
    work: &Path,
    name: &str,
    database_url: &str,
    devnet: &str,
    labels: &str,
) -> (Process, String) {
    let api = free_port();
    let process = spawn_logged(
        work,
        name,
        Command::new(env!("CARGO_BIN_EXE_dltsub"))
            .arg("run")
            .args(["--database-url", database_url])
            .args(["--migrate-on-start", "false"])
            .args(["--dlt-url", devnet])
            .args(["--listen", &format!("127.0.0.1:{api}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--api-token", TOKEN])
            .args(["--instance-labels", labels])
            .args(["--fast-expiry", "3s", "--slow-expiry", "9s"])
            .args(["--renew-interval", "500ms"])
            .args(["--dlt-request-timeout", "2s"])
            .args(["--status-wait", "1s", "--unknown-grace", "2s"])
            .args(["--submit-poll-interval", "50ms"])
            .env("DLTSUB_LOG", "info"),
    );
    (process, format!("http://127.0.0.1:{api}"))
}

async fn wait_ok(http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = http.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn tool_paths() -> Option<(PathBuf, PathBuf)> {
    if std::env::var_os("SKIP_CONSOLE_BROWSER_TEST").is_some() {
        eprintln!("SKIP_CONSOLE_BROWSER_TEST is set: the console's browser test is skipped");
        return None;
    }
    let chromium = PathBuf::from(
        std::env::var("CHROMIUM_PATH").unwrap_or_else(|_| "/usr/bin/chromium".into()),
    );
    let playwright = PathBuf::from(
        std::env::var("PLAYWRIGHT_CORE_DIR")
            .unwrap_or_else(|_| "/var/tmp/dltsub-playwright".into()),
    );
    assert!(
        chromium.exists(),
        "no Chromium at {}: run scripts/setup-browser-tools (or set SKIP_CONSOLE_BROWSER_TEST)",
        chromium.display()
    );
    assert!(
        playwright.join("node_modules/playwright-core").exists(),
        "no playwright-core in {}: run scripts/setup-browser-tools (or set SKIP_CONSOLE_BROWSER_TEST)",
        playwright.display()
    );
    Some((chromium, playwright))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_lists_pauses_and_follows_a_takeover() {
    let Some((chromium, playwright)) = tool_paths() else {
        return;
    };
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("dltsub-console-")
        .tempdir()
        .unwrap();
    let database = TestDatabase::migrated(TestBackend::Postgres).await;
    let store = database.store().await;
    let database_url = match &database.options.url {
        dltsub_store::DatabaseUrl::Postgres(url) => url.clone(),
        other => panic!("{other:?}"),
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    let devnet_port = free_port();
    let _devnet = spawn_logged(
        work.path(),
        "devnet",
        Command::new(env!("CARGO_BIN_EXE_dltsub")).args([
            "devnet",
            "--listen",
            &format!("127.0.0.1:{devnet_port}"),
            "--commit-latency",
            "100ms",
        ]),
    );
    let devnet = format!("http://127.0.0.1:{devnet_port}");
    wait_ok(&http, &format!("{devnet}/_devnet/stats")).await;
    let (_a, base_a) = start_instance(work.path(), "a", &database_url, &devnet, "blue");
    let (b, base_b) = start_instance(work.path(), "b", &database_url, &devnet, "green");
    wait_ok(&http, &format!("{base_a}/readyz")).await;
    wait_ok(&http, &format!("{base_b}/readyz")).await;

    // Services with a few batches each, one busy service with a long queue, and one
    // pinned to the label of instance b only.
    let submit = |service: String, body: Vec<u8>| {
        let http = http.clone();
        let url = format!("{base_a}/api/v1/services/{service}/batches");
        async move {
            let response = http
                .post(url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{}", response.status());
        }
    };
    for n in 0..SERVICES {
        submit(service_id(n), batch_list(n, 0..3)).await;
    }
    submit(BUSY.into(), batch_list(99, 0..400)).await;
    let response = http
        .post(format!("{base_a}/api/v1/services/{PINNED}/pin"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"pin_label": "green"}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());

    // Both instances hold claims before the browser starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let claims = store.claims().await.unwrap();
        let holders: std::collections::BTreeSet<_> =
            claims.iter().filter_map(|c| c.claimant.clone()).collect();
        if claims.iter().all(|c| c.claimant.is_some()) && holders.len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "claims never spread: {claims:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Into the target directory, so a test run leaves the checkout clean; into
    // docs/console/ (the README's pictures) when DLTSUB_UPDATE_SCREENSHOTS is set.
    let screenshots = if std::env::var_os("DLTSUB_UPDATE_SCREENSHOTS").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
    };
    std::fs::create_dir_all(&screenshots).unwrap();
    let mut services: Vec<String> = (0..SERVICES).map(service_id).collect();
    services.push(BUSY.into());
    let browser_started = Instant::now();
    let output = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/browser.js"))
        .env("PLAYWRIGHT_CORE_DIR", &playwright)
        .env("CHROMIUM_PATH", &chromium)
        .env("CONSOLE_A", &base_a)
        .env("CONSOLE_B", &base_b)
        .env("CONSOLE_TOKEN", TOKEN)
        .env("CONSOLE_PID_B", b.0.id().to_string())
        .env("CONSOLE_SERVICES", services.join(","))
        .env("CONSOLE_BUSY", BUSY)
        .env("CONSOLE_PINNED", PINNED)
        .env("CONSOLE_SCREENSHOTS", &screenshots)
        .output()
        .expect("cannot run node: run scripts/setup-browser-tools");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stderr}");
    if !output.status.success() {
        let kept = work.keep();
        for name in ["a", "b", "devnet"] {
            let log = std::fs::read_to_string(kept.join(format!("{name}.err"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!("--- {name} (last 20 lines)");
            for line in &lines[lines.len().saturating_sub(20)..] {
                eprintln!("{line}");
            }
        }
        panic!(
            "the browser script failed ({}); logs in {}",
            output.status,
            kept.display()
        );
    }
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    eprintln!(
        "console browser test: {} (browser part {:.1} s, whole test {:.1} s)",
        result,
        browser_started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // What the page did, checked in the database as well.
    assert_eq!(
        result["offsite_requests"],
        serde_json::json!([]),
        "nothing fetched from elsewhere"
    );
    let moved = result["kill"]["service"].as_str().unwrap();
    let survivor = result["kill"]["to"].as_str().unwrap();
    let claims = store.claims().await.unwrap();
    let claim = claims.iter().find(|c| c.service_id == moved).unwrap();
    assert_eq!(claim.claimant.as_deref(), Some(survivor));
    let pinned = claims.iter().find(|c| c.service_id == PINNED).unwrap();
    assert_ne!(pinned.claimant.as_deref(), Some(survivor), "the pin holds");
    assert!(
        result["kill"]["page_shows_new_holder_s"].as_f64().unwrap() < 15.0,
        "{result}"
    );
    for shot in [
        "overview.png",
        "service-paused.png",
        "batch.png",
        "overview-after-kill.png",
    ] {
        assert!(screenshots.join(shot).exists(), "{shot}");
    }
}
