#![doc = include_str!("../README.md")]

//! The harness: a database of the test's own, a simulated ledger, and dltsub instances that
//! each run on a runtime of their own, so that killing one (dropping its runtime) aborts
//! every task of it at once, like SIGKILL, without releasing its claims.

use std::future::Future;
use std::time::Duration;

use dltsub::config::{Config, ConfigArgs};
use dltsub_devnet::{Devnet, DevnetConfig, Dialect};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{NewBatch, Store};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use tokio_util::sync::CancellationToken;

/// Claim timings short enough for tests, long enough for a loaded 2-core machine.
pub const FAST_EXPIRY: &str = "2s";
pub const SLOW_EXPIRY: &str = "6s";

/// A database, a simulated ledger (scabbard dialect) and the configuration instances get.
pub struct Cluster {
    pub database: TestDatabase,
    pub store: Store,
    pub devnet: Devnet,
    overrides: Vec<(&'static str, String)>,
}

impl Cluster {
    pub async fn start(backend: TestBackend, devnet: DevnetConfig) -> Self {
        let database = TestDatabase::migrated(backend).await;
        let store = database.store().await;
        let devnet = Devnet::spawn(devnet).await.expect("start devnet");
        Self {
            database,
            store,
            devnet,
            overrides: Vec::new(),
        }
    }

    pub async fn scabbard(backend: TestBackend) -> Self {
        Self::start(backend, DevnetConfig::new(Dialect::Scabbard)).await
    }

    /// A Sawtooth devnet, and instances configured for it.
    pub async fn sawtooth(backend: TestBackend) -> Self {
        let mut cluster = Self::start(backend, DevnetConfig::new(Dialect::Sawtooth)).await;
        cluster.set("dlt_dialect", "sawtooth");
        cluster
    }

    /// Overrides one configuration key for instances started after this call.
    pub fn set(&mut self, key: &'static str, value: &str) {
        self.overrides.push((key, value.to_string()));
    }

    pub fn config(&self) -> Config {
        let url = match &self.database.options.url {
            dltsub_store::DatabaseUrl::Postgres(url) => url.clone(),
            dltsub_store::DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        };
        let mut pairs: Vec<(&str, String)> = vec![
            ("database_url", url),
            ("migrate_on_start", "false".into()),
            ("dlt_url", self.devnet.base_url().to_string()),
            ("dlt_dialect", "scabbard".into()),
            ("fast_expiry", FAST_EXPIRY.into()),
            ("slow_expiry", SLOW_EXPIRY.into()),
            ("renew_interval", "500ms".into()),
            ("dlt_request_timeout", "2s".into()),
            ("submit_poll_interval", "50ms".into()),
            ("status_poll_interval", "100ms".into()),
            ("status_wait", "1s".into()),
            ("unknown_grace", "2s".into()),
            ("retry_backoff_base", "20ms".into()),
            ("retry_backoff_max", "500ms".into()),
            ("shutdown_timeout", "3s".into()),
            // Several instances in one process: any free port for each API.
            ("listen", "127.0.0.1:0".into()),
        ];
        for (key, value) in &self.overrides {
            pairs.retain(|(k, _)| k != key);
            pairs.push((key, value.clone()));
        }
        let args = ConfigArgs::from_pairs(&pairs).expect("test configuration keys");
        Config::load_from(&args, Vec::new()).expect("valid test configuration")
    }

    pub fn start_instance(&self) -> Instance {
        Instance::start(self.config())
    }

    /// Accepts `count` batches for `service` (a `circuit::service` id); returns their ids in
    /// acceptance order. Batches whose number is in `invalid` carry a payload the ledger
    /// rejects.
    pub async fn enqueue(
        &self,
        service: &str,
        first: u64,
        count: u64,
        invalid: &[u64],
    ) -> Vec<String> {
        let batches: Vec<NewBatch> = (first..first + count)
            .map(|n| batch(n, invalid.contains(&n)))
            .collect();
        let ids = batches.iter().map(|b| b.batch_id.clone()).collect();
        self.store
            .enqueue(service, &batches)
            .await
            .expect("enqueue");
        ids
    }

    /// Sets the simulated ledger's commit latency (e.g. "5ms", "10ms..50ms").
    pub fn set_commit_latency(&self, latency: &str) {
        self.devnet
            .control()
            .update_faults(&dltsub_devnet::FaultsPatch {
                commit_latency: Some(latency.parse().expect("a latency")),
                ..dltsub_devnet::FaultsPatch::default()
            })
            .expect("devnet accepts the latency");
    }

    /// The instances that hold at least one claim.
    pub async fn claim_holders(&self) -> std::collections::HashSet<String> {
        let claims = self.store.claims().await.expect("read claims");
        claims.into_iter().filter_map(|c| c.claimant).collect()
    }

    /// Services with no holder.
    pub async fn unclaimed_services(&self) -> i64 {
        self.store
            .scalar_i64_for_tests("(SELECT COUNT(*) FROM service_id_claims WHERE claimant IS NULL)")
            .await
    }

    pub async fn count_status(&self, status: &str) -> i64 {
        self.store
            .scalar_i64_for_tests(&format!(
                "(SELECT COUNT(*) FROM batch_statuses WHERE status = '{status}')"
            ))
            .await
    }

    /// Waits until every accepted batch is COMMITTED or INVALID, or panics after `limit`.
    pub async fn wait_until_final(&self, limit: Duration) {
        let total = self.store.count_rows_for_tests("batches").await;
        let finished = wait_for(limit, || async {
            self.count_status("COMMITTED").await + self.count_status("INVALID").await == total
        })
        .await;
        if finished.is_err() {
            panic!(
                "not every one of {total} batches became final within {limit:?}: {}",
                self.status_counts().await
            );
        }
    }

    /// `STATUS=count` for every status present, for failure messages.
    pub async fn status_counts(&self) -> String {
        let mut parts = Vec::new();
        for status in dltsub_store::BatchStatus::ALL {
            let count = self.count_status(status.as_str()).await;
            if count > 0 {
                parts.push(format!("{status}={count}"));
            }
        }
        parts.join(" ")
    }
}

/// A batch numbered `n`: a BatchList of one batch with one transaction, ids derived from
/// `n` (128 hex characters), and a payload devnet rejects when `invalid`.
pub fn batch(n: u64, invalid: bool) -> NewBatch {
    let batch_id = format!("{:0>128}", format!("{n:x}b"));
    let payload = if invalid {
        format!("invalid transaction {n}").into_bytes()
    } else {
        format!("transaction {n}").into_bytes()
    };
    let list = BatchList {
        batches: vec![Batch {
            header: format!("header {n}").into_bytes(),
            header_signature: batch_id.clone(),
            transactions: vec![Transaction {
                header: format!("txn header {n}").into_bytes(),
                header_signature: format!("{:0>128}", format!("{n:x}f")),
                payload,
            }],
            trace: false,
        }],
    };
    NewBatch {
        batch_id,
        serialized_batch: list.encode_to_vec(),
    }
}

/// Polls `condition` every 50 ms until it holds (Ok) or `limit` passes (Err).
pub async fn wait_for<F, Fut>(limit: Duration, mut condition: F) -> Result<(), ()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One dltsub instance on a runtime of its own.
pub struct Instance {
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    finished: Option<tokio::sync::oneshot::Receiver<Result<(), String>>>,
}

impl Instance {
    pub fn start(config: Config) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("instance runtime");
        let stop = CancellationToken::new();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        runtime.spawn(async move {
            let result = dltsub::run::run(&config, token, None)
                .await
                .map_err(|e| format!("{e:#}"));
            let _ = done_tx.send(result);
        });
        Self {
            runtime: Some(runtime),
            stop,
            finished: Some(done_rx),
        }
    }

    /// Like SIGKILL: every task stops where it is; nothing is released.
    pub fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Like SIGTERM: graceful shutdown; returns once the instance has finished.
    pub async fn stop(&mut self) {
        self.stop.cancel();
        if let Some(finished) = self.finished.take() {
            match tokio::time::timeout(Duration::from_secs(20), finished).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => panic!("instance failed: {error}"),
                Ok(Err(_)) => panic!("instance task vanished"),
                Err(_) => panic!("instance did not stop within 20 s"),
            }
        }
        self.kill();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}
