//! The checker can fail: each invariant it guards is broken on purpose (in the database or
//! on the ledger) and it reports exactly that; a clean run reports nothing. Both backends.

use std::time::{Duration, Instant};

use chaos::check;
use dltsub_devnet::{Devnet, DevnetConfig, Dialect, Latency};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{NewBatch, Store};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;

fn batch(n: u64) -> Batch {
    Batch {
        header: vec![n as u8],
        header_signature: format!("{n:0128x}"),
        transactions: vec![Transaction {
            header: vec![1],
            header_signature: format!("{:0128x}", n + 100),
            payload: b"ok".to_vec(),
        }],
        trace: false,
    }
}

fn list(ns: &[u64]) -> Vec<u8> {
    BatchList {
        batches: ns.iter().map(|n| batch(*n)).collect(),
    }
    .encode_to_vec()
}

struct World {
    _database: TestDatabase,
    store: Store,
    ledger: Devnet,
    http: reqwest::Client,
}

impl World {
    /// Three batches accepted by dltsub for `c::s`, nothing on the ledger yet.
    async fn new(backend: TestBackend) -> Self {
        let database = TestDatabase::migrated(backend).await;
        let store = database.store().await;
        let batches: Vec<NewBatch> = (1..=3)
            .map(|n| NewBatch {
                batch_id: format!("{n:0128x}"),
                serialized_batch: list(&[n]),
            })
            .collect();
        store.enqueue("c::s", &batches).await.unwrap();
        let mut config = DevnetConfig::new(Dialect::Scabbard);
        config.faults.commit_latency = Latency::fixed(Duration::from_millis(5));
        let ledger = Devnet::spawn(config).await.unwrap();
        Self {
            _database: database,
            store,
            ledger,
            http: reqwest::Client::new(),
        }
    }

    /// POSTs the batches to the ledger as dltsub would, one list per POST, and waits until
    /// the ledger has committed them all.
    async fn post(&self, order: &[u64]) {
        for n in order {
            let response = self
                .http
                .post(format!("{}/scabbard/c/s/batches", self.ledger.base_url()))
                .header("Content-Type", "application/octet-stream")
                .body(list(&[*n]))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 202);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.ledger.control().stats().ledgers["c::s"].in_flight > 0 {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn set_all(&self, status: &str) {
        self.store
            .execute_for_tests(&format!("UPDATE batch_statuses SET status = '{status}'"))
            .await;
    }
}

/// Committed once each, in order, recorded COMMITTED: nothing to report.
async fn a_clean_run_reports_nothing(backend: TestBackend) {
    let world = World::new(backend).await;
    world.post(&[1, 2, 3]).await;
    world.set_all("COMMITTED").await;
    let findings = check(&world.store, &world.ledger).await.unwrap();
    assert!(findings.invariants_hold(), "{findings:?}");
    assert_eq!(findings.batches, 3);
    assert_eq!(findings.duplicate_batches, 0);
    assert_eq!(findings.posts_per_batch.get(&1), Some(&3));
}

/// Batches left QUEUED are lost.
async fn unfinished_batches_are_lost(backend: TestBackend) {
    let world = World::new(backend).await;
    let findings = check(&world.store, &world.ledger).await.unwrap();
    assert_eq!(findings.lost, 3);
    assert!(!findings.invariants_hold());
}

/// COMMITTED in dltsub but never on the ledger, and INVALID but on the ledger: both
/// disagree.
async fn database_and_ledger_must_agree(backend: TestBackend) {
    let world = World::new(backend).await;
    world.post(&[1]).await;
    world.set_all("COMMITTED").await;
    world
        .store
        .execute_for_tests(&format!(
            "UPDATE batch_statuses SET status = 'INVALID' WHERE seq = \
             (SELECT seq FROM batches WHERE batch_id = '{:0128x}')",
            1
        ))
        .await;
    let findings = check(&world.store, &world.ledger).await.unwrap();
    // Batch 1: INVALID yet on the ledger; batches 2 and 3: COMMITTED yet absent.
    assert_eq!(findings.disagreements, 3, "{findings:?}");
}

/// The ledger's order must be the acceptance order; a batch POSTed twice is a duplicate.
async fn order_and_duplicates_are_caught(backend: TestBackend) {
    let world = World::new(backend).await;
    world.post(&[2, 1, 3, 3]).await;
    world.set_all("COMMITTED").await;
    let findings = check(&world.store, &world.ledger).await.unwrap();
    assert_eq!(findings.order_violations, 1, "{findings:?}");
    assert_eq!(findings.duplicate_batches, 1);
    assert_eq!(findings.posts_per_batch.get(&2), Some(&1));
}

/// A write with an older epoch after a newer one is a stale write that was accepted.
async fn stale_epochs_are_caught(backend: TestBackend) {
    let world = World::new(backend).await;
    world.post(&[1, 2, 3]).await;
    world.set_all("COMMITTED").await;
    for epoch in [2, 1] {
        world
            .store
            .execute_for_tests(&format!(
                "INSERT INTO batch_events (seq, old_status, new_status, epoch, instance_id, detail, at_us) \
                 SELECT seq, 'QUEUED', 'SUBMITTING', {epoch}, 'someone', NULL, 0 FROM batches \
                 WHERE batch_id = '{:0128x}'",
                1
            ))
            .await;
    }
    let findings = check(&world.store, &world.ledger).await.unwrap();
    assert_eq!(findings.stale_writes, 1, "{findings:?}");
}

dltsub_store::backend_tests!(
    a_clean_run_reports_nothing,
    unfinished_batches_are_lost,
    database_and_ledger_must_agree,
    order_and_duplicates_are_caught,
    stale_epochs_are_caught,
);
