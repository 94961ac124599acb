//! `dltsub run` and `dltsub devnet` as real processes: batches reach the simulated ledger,
//! `/metrics` shows what happened, and SIGTERM hands the claims back and exits 0.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dltsub_store::NewBatch;
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use support::process::{Process, free_port, spawn_devnet, wait_for_http};

fn batch(n: u64) -> NewBatch {
    let batch_id = format!("{:0>128}", format!("{n:x}a"));
    let list = BatchList {
        batches: vec![Batch {
            header: vec![1],
            header_signature: batch_id.clone(),
            transactions: vec![Transaction {
                header: vec![2],
                header_signature: format!("{:0>128}", format!("{n:x}c")),
                payload: format!("payload {n}").into_bytes(),
            }],
            trace: false,
        }],
    };
    NewBatch {
        batch_id,
        serialized_batch: list.encode_to_vec(),
    }
}

/// A real `dltsub run` against a real `dltsub devnet`: 30 batches over 3 services, sent to
/// dltsub's API as a scabbard client would send them to the ledger, are committed;
/// `/metrics` carries the submission counters and the scrape-time backlog gauges; SIGTERM
/// makes it release its claims and exit 0 within the drain bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_submits_serves_metrics_and_stops_on_sigterm() {
    let database = TestDatabase::migrated(TestBackend::Sqlite).await;
    let store = database.store().await;
    for service in 0..3u64 {
        let batches: Vec<NewBatch> = (0..10).map(|n| batch(service * 100 + n)).collect();
        store
            .enqueue(&format!("circ::svc{service}"), &batches)
            .await
            .unwrap();
    }
    let devnet_port = free_port();
    let _devnet = spawn_devnet(devnet_port, "10ms").await;

    let metrics_port = free_port();
    let api_port = free_port();
    let database_url = match &database.options.url {
        dltsub_store::DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        other => panic!("{other:?}"),
    };
    let mut run = Process(
        Command::new(env!("CARGO_BIN_EXE_dltsub"))
            .args([
                "run",
                "--database-url",
                &database_url,
                "--dlt-url",
                &format!("http://127.0.0.1:{devnet_port}"),
                "--listen",
                &format!("127.0.0.1:{api_port}"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics_port}"),
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
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    wait_for_http(&format!("http://127.0.0.1:{api_port}/readyz")).await;
    let http = reqwest::Client::new();
    for service in 0..3u64 {
        let batches = (0..10)
            .map(|n| batch(service * 100 + n))
            .collect::<Vec<_>>();
        // One BatchList per POST, as a ledger client sends them.
        for new_batch in batches {
            let response = http
                .post(format!(
                    "http://127.0.0.1:{api_port}/scabbard/circ/svc{service}/batches"
                ))
                .header("Content-Type", "application/octet-stream")
                .body(new_batch.serialized_batch)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 202);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = store
            .scalar_i64_for_tests(
                "(SELECT COUNT(*) FROM batch_statuses WHERE status = 'COMMITTED')",
            )
            .await;
        if committed == 30 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {committed} of 30 committed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ledger = wait_for_http(&format!("http://127.0.0.1:{devnet_port}/_devnet/ledger")).await;
    assert!(
        ledger.contains(&batch(209).batch_id),
        "the last batch of svc2 is on the ledger"
    );

    let metrics = wait_for_http(&format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    for expected in [
        "dltsub_submissions_total{outcome=\"accepted\"} 30",
        "dltsub_batches{status=\"QUEUED\"} 0",
        "dltsub_batches{status=\"PENDING\"} 0",
        "dltsub_claims_held 3",
        "dltsub_dlt_post_seconds_bucket",
        "# HELP dltsub_claims_acquired_total",
    ] {
        assert!(
            metrics.contains(expected),
            "/metrics lacks {expected:?}:\n{metrics}"
        );
    }

    let pid = run.0.id().to_string();
    let sent = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = loop {
        if let Some(status) = run.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(15),
            "no exit within the drain bound"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    let still_held = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM service_id_claims WHERE claimant IS NOT NULL)")
        .await;
    assert_eq!(still_held, 0, "SIGTERM released every claim");
}
