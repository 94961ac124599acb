//! The chaos event points in a real `dltsub run` built with the `chaos` feature: each
//! action (error, stall, stop, kill) fires where the plan says, is reported before it acts,
//! and the system still ends with every batch committed exactly once.
#![cfg(feature = "chaos")]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dltsub_devnet::{Devnet, DevnetConfig, Dialect, Latency};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{NewBatch, Store};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use support::process::{Process, free_port};

fn batch(n: u64) -> NewBatch {
    let batch_id = format!("{:0>128}", format!("{n:x}e"));
    let list = BatchList {
        batches: vec![Batch {
            header: vec![1],
            header_signature: batch_id.clone(),
            transactions: vec![Transaction {
                header: vec![2],
                header_signature: format!("{:0>128}", format!("{n:x}f")),
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

struct Setup {
    database: TestDatabase,
    store: Store,
    devnet: Devnet,
    dir: tempfile::TempDir,
}

impl Setup {
    async fn new(batches: u64) -> Self {
        let database = TestDatabase::migrated(TestBackend::Sqlite).await;
        let store = database.store().await;
        let list: Vec<NewBatch> = (0..batches).map(batch).collect();
        store.enqueue("circ::svc", &list).await.unwrap();
        let mut config = DevnetConfig::new(Dialect::Scabbard);
        config.faults.commit_latency = Latency::fixed(Duration::from_millis(20));
        let devnet = Devnet::spawn(config).await.unwrap();
        Self {
            database,
            store,
            devnet,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn report(&self) -> std::path::PathBuf {
        self.dir.path().join("chaos.jsonl")
    }

    fn start(&self, plan: &str) -> Process {
        let dltsub_store::DatabaseUrl::Sqlite(path) = &self.database.options.url else {
            unreachable!()
        };
        Process(
            Command::new(env!("CARGO_BIN_EXE_dltsub"))
                .args([
                    "run",
                    "--database-url",
                    &format!("sqlite://{}", path.display()),
                ])
                .args(["--dlt-url", self.devnet.base_url()])
                .args(["--listen", &format!("127.0.0.1:{}", free_port())])
                .args(["--metrics-listen", "127.0.0.1:0"])
                .args(["--fast-expiry", "3s", "--slow-expiry", "9s"])
                .args(["--renew-interval", "1s", "--dlt-request-timeout", "2s"])
                .args(["--status-wait", "1s", "--status-poll-interval", "100ms"])
                .env("DLTSUB_CHAOS", plan)
                .env("DLTSUB_CHAOS_REPORT", self.report())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    async fn committed(&self) -> i64 {
        self.store
            .scalar_i64_for_tests(
                "(SELECT COUNT(*) FROM batch_statuses WHERE status = 'COMMITTED')",
            )
            .await
    }

    async fn wait_committed(&self, expected: i64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.committed().await < expected {
            assert!(
                Instant::now() < deadline,
                "only {} of {expected} committed",
                self.committed().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// POSTs per batch id, from the ledger's log.
    fn posts_per_batch(&self) -> std::collections::BTreeMap<String, usize> {
        let mut posts = std::collections::BTreeMap::new();
        for post in self.devnet.control().posts().entries {
            for id in post.batch_ids {
                *posts.entry(id).or_default() += 1;
            }
        }
        posts
    }
}

fn fired(report: &Path) -> Vec<String> {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            value["rule"].as_str().unwrap().to_string()
        })
        .collect()
}

async fn wait_fired(report: &Path, rule: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fired(report).iter().any(|r| r == rule) {
        assert!(
            Instant::now() < deadline,
            "{rule} never fired: {:?}",
            fired(report)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An error after the POST (its answer lost) and an error after recording a status (its
/// acknowledgement lost), plus a stall: all fire, all batches commit, none is POSTed twice
/// — the lost answer is resolved by asking the ledger, not by resubmitting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_and_stalls_fire_and_nothing_is_posted_twice() {
    let setup = Setup::new(5).await;
    let _run = setup.start("E6.after@1=error,E8.after@2=error,E3.before@3=stall:300ms");
    setup.wait_committed(5).await;
    let mut rules = fired(&setup.report());
    rules.sort();
    assert_eq!(
        rules,
        [
            "E3.before@3=stall:300ms",
            "E6.after@1=error",
            "E8.after@2=error"
        ]
    );
    let posts = setup.posts_per_batch();
    assert_eq!(posts.len(), 5);
    assert!(posts.values().all(|n| *n == 1), "{posts:?}");
    // The batch whose answer was lost went through IN_DOUBT to COMMITTED.
    let in_doubt = setup
        .store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batch_events WHERE new_status = 'IN_DOUBT')")
        .await;
    assert_eq!(in_doubt, 1);
}

/// `stop` freezes the whole process (SIGSTOP) after reporting; SIGCONT resumes it and it
/// finishes the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_freezes_the_process_until_sigcont() {
    let setup = Setup::new(3).await;
    let run = setup.start("E5.after@2=stop");
    wait_fired(&setup.report(), "E5.after@2=stop").await;
    let pid = run.0.id();
    let state_of = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The state follows the parenthesised command name.
        stat.rsplit_once(") ").unwrap().1.chars().next().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while state_of() != 'T' {
        assert!(Instant::now() < deadline, "state {}", state_of());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = setup.committed().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        setup.committed().await,
        before,
        "a stopped process does nothing"
    );
    assert!(before < 3);
    Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()
        .unwrap();
    setup.wait_committed(3).await;
}

/// `kill` SIGKILLs the process right after reporting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_the_process_with_sigkill() {
    use std::os::unix::process::ExitStatusExt;
    let setup = Setup::new(2).await;
    let mut run = setup.start("E6.before@1=kill");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = run.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "not killed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert_eq!(fired(&setup.report()), ["E6.before@1=kill"]);
    assert!(setup.posts_per_batch().is_empty(), "killed before its POST");
}

/// A plan that does not parse stops the instance at start with exit 2.
#[test]
fn a_bad_plan_is_refused_at_start() {
    let output = Command::new(env!("CARGO_BIN_EXE_dltsub"))
        .args(["run", "--database-url", "sqlite:///nonexistent/x.db"])
        .env("DLTSUB_CHAOS", "E6.during=stop")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid DLTSUB_CHAOS"), "{stderr}");
}
