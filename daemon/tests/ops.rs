//! The operator commands as an operator runs them: a real `dltsub run` (with a bearer
//! token) in front of the simulated ledger, and `dltsub submit | status | services | claims
//! | instances | pause | resume | cancel | requeue | max-in-flight | pin` as separate processes,
//! checked by their output and exit codes. Both backends.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dltsub_devnet::{Devnet, DevnetConfig, Dialect, Latency};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use support::process::{Process, free_port};

const TOKEN: &str = "ops-test-token-0123456789";

fn batch_list(n: u64, payload: &str) -> Vec<u8> {
    BatchList {
        batches: vec![Batch {
            header: vec![n as u8],
            header_signature: id(n),
            transactions: vec![Transaction {
                header: vec![2],
                header_signature: format!("{:0>128}", format!("{n:x}c")),
                payload: payload.as_bytes().to_vec(),
            }],
            trace: false,
        }],
    }
    .encode_to_vec()
}

fn id(n: u64) -> String {
    format!("{:0>128}", format!("{n:x}b"))
}

struct Ops {
    _database: TestDatabase,
    _devnet: Devnet,
    _run: Process,
    url: String,
    dir: tempfile::TempDir,
}

impl Ops {
    async fn start(backend: TestBackend) -> Self {
        let database = TestDatabase::migrated(backend).await;
        let mut devnet_config = DevnetConfig::new(Dialect::Scabbard);
        devnet_config.faults.commit_latency = Latency::fixed(Duration::from_millis(20));
        let devnet = Devnet::spawn(devnet_config).await.unwrap();
        let database_url = match &database.options.url {
            dltsub_store::DatabaseUrl::Postgres(url) => url.clone(),
            dltsub_store::DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        };
        let api_port = free_port();
        let run = Process(
            Command::new(env!("CARGO_BIN_EXE_dltsub"))
                .args(["run", "--database-url", &database_url, "--dlt-url"])
                .arg(devnet.base_url())
                .args(["--listen", &format!("127.0.0.1:{api_port}")])
                .args(["--metrics-listen", "127.0.0.1:0"])
                .args(["--fast-expiry", "3s", "--slow-expiry", "9s"])
                .args(["--renew-interval", "1s", "--dlt-request-timeout", "2s"])
                .args(["--status-wait", "1s", "--status-poll-interval", "100ms"])
                .env("DLTSUB_API_TOKEN", TOKEN)
                .env_remove("DLTSUB_URL")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let url = format!("http://127.0.0.1:{api_port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reqwest::get(format!("{url}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(Instant::now() < deadline, "dltsub run did not become ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            _database: database,
            _devnet: devnet,
            _run: run,
            url,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs `dltsub ARGS --url … ` with the token (or `token`), off the async runtime.
    async fn run(&self, args: &[&str], token: Option<&str>) -> (u8, String, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dltsub"));
        command.args(args).env("DLTSUB_URL", &self.url);
        match token {
            Some(token) => command.env("DLTSUB_API_TOKEN", token),
            None => command.env_remove("DLTSUB_API_TOKEN"),
        };
        let output: Output = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        (
            output.status.code().unwrap_or(-1) as u8,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    async fn ops(&self, args: &[&str]) -> (u8, String, String) {
        self.run(args, Some(TOKEN)).await
    }

    fn file(&self, name: &str, bytes: Vec<u8>) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.display().to_string()
    }
}

async fn operator_commands_end_to_end(backend: TestBackend) {
    let ops = Ops::start(backend).await;

    // Submit and wait: committed, exit 0.
    let good = ops.file("good.bin", batch_list(1, "hello"));
    let (code, out, err) = ops
        .ops(&["submit", &good, "--service", "circ::svc", "--wait", "20s"])
        .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("submit circ::svc: executed"), "{out}");
    assert!(out.contains("COMMITTED"), "{out}");

    // A batch the ledger rejects: exit 5.
    let bad = ops.file("bad.bin", batch_list(2, "invalid: on purpose"));
    let (code, out, _) = ops
        .ops(&["submit", &bad, "--service", "circ::svc", "--wait", "20s"])
        .await;
    assert_eq!(code, 5, "{out}");
    assert!(out.contains("INVALID"), "{out}");

    // One id: the batch with its history; --json is the server's JSON.
    let (code, out, _) = ops.ops(&["status", &id(1)]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("status   COMMITTED"), "{out}");
    assert!(out.contains("QUEUED      SUBMITTING"), "{out}");
    let (code, out, _) = ops.ops(&["status", &id(1), &id(2), "--json"]).await;
    assert_eq!(code, 5, "one of the two is INVALID: {out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["batches"].as_array().unwrap().len(), 2);
    let (code, _, err) = ops.ops(&["status", &id(99)]).await;
    assert_eq!(code, 2);
    assert!(err.contains("unknown_batch"), "{err}");

    // Tables of services, claims, instances.
    let (code, out, _) = ops.ops(&["services"]).await;
    assert_eq!(code, 0);
    let line = out.lines().find(|l| l.starts_with("circ::svc")).unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cells[2..],
        ["1", "false", "1", "0", "0", "1", "1", "0"],
        "{out}"
    );
    let (code, out, _) = ops.ops(&["claims"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(" held "), "{out}");
    let (code, out, _) = ops.ops(&["instances"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(" running "), "{out}");
    // Admin reads need the token.
    let (code, _, err) = ops.run(&["claims"], None).await;
    assert_eq!(code, 2);
    assert!(err.contains("unauthorized"), "{err}");

    // Paused: a submission is not final within its wait (exit 4), can be cancelled
    // (exit 0), and stays cancelled after resume; requeue of a final batch is denied.
    let (code, out, _) = ops.ops(&["pause", "circ::svc"]).await;
    assert_eq!((code, out.trim()), (0, "pause circ::svc: executed"));
    let third = ops.file("third.bin", batch_list(3, "later"));
    let (code, out, _) = ops
        .ops(&["submit", &third, "--service", "circ::svc", "--wait", "1s"])
        .await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("postponed"), "{out}");
    let (code, out, err) = ops.ops(&["cancel", &id(98), &id(3)]).await;
    assert_eq!(code, 2, "one id is unknown: {out}{err}");
    assert!(
        out.contains("CANCELLED"),
        "the known one was cancelled: {out}"
    );
    assert!(err.contains("unknown_batch"), "{err}");
    let (code, _, _) = ops.ops(&["resume", "circ::svc"]).await;
    assert_eq!(code, 0);
    let (code, out, _) = ops
        .ops(&["requeue", &id(1), "--service", "circ::svc"])
        .await;
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("denied (batch"), "{out}");
    let (code, out, _) = ops.ops(&["max-in-flight", "circ::svc", "4"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = ops.ops(&["max-in-flight", "circ::svc", "0"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("max_in_flight"), "{err}");
    let (code, out, _) = ops
        .ops(&["pin", "circ::svc", "--label", "gpu", "--exclude", "eu"])
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("only instances labelled \"gpu\" and not \"eu\""),
        "{out}"
    );
    let (code, _, err) = ops.ops(&["pin", "circ::svc", "--label", "GPU"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("pin_label"), "{err}");
    let (code, out, _) = ops.ops(&["pin", "circ::svc"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("any instance may hold"), "{out}");
    let (code, _, err) = ops.ops(&["pause", "no::such"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("unknown_service"), "{err}");

    // No server: exit 1.
    let (code, _, err) = ops
        .ops(&[
            "services",
            "--url",
            &format!("http://127.0.0.1:{}", free_port()),
        ])
        .await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach dltsub"), "{err}");
    let (code, _, err) = ops
        .ops(&["submit", "/no/such/file", "--service", "s"])
        .await;
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /no/such/file"), "{err}");
}

dltsub_store::backend_tests!(operator_commands_end_to_end);
