//! The storage behaviour suite: every case runs against PostgreSQL and SQLite
//! (`postgres::…` and `sqlite::…` in the test names).

use std::time::Duration;

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{
    BatchMoveKind, BatchStatus, NewBatch, StoreError, backend_tests, known_migrations,
};

const TABLES: [&str; 6] = [
    "instances",
    "services",
    "service_id_claims",
    "batches",
    "batch_statuses",
    "batch_events",
];

fn batch_id(n: u64) -> String {
    // A header signature is 128 hex characters; make distinct ones from a counter.
    format!("{:0128x}", n)
}

fn new_batch(n: u64, bytes: &[u8]) -> NewBatch {
    NewBatch {
        batch_id: batch_id(n),
        serialized_batch: bytes.to_vec(),
    }
}

async fn table_counts(store: &dltsub_store::Store) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in TABLES {
        counts.push(store.count_rows_for_tests(table).await);
    }
    counts
}

/// Migrating creates every table; a second run applies nothing.
async fn migrations_apply_once(backend: TestBackend) {
    let database = TestDatabase::empty(backend).await;
    let first = database.migrate().await.expect("first migration");
    assert_eq!(first.applied.len(), first.known);
    assert!(first.known >= 1);
    assert_eq!(first.known, known_migrations(&database.options.url).len());
    let second = database.migrate().await.expect("second migration");
    assert!(
        second.applied.is_empty(),
        "re-run applied {:?}",
        second.applied
    );
    let store = database.store().await;
    assert_eq!(table_counts(&store).await, vec![0; TABLES.len()]);
}

/// Instances that start together all migrate: none fails, the schema ends up once.
async fn concurrent_migrations_do_not_race(backend: TestBackend) {
    let database = TestDatabase::empty(backend).await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let options = database.options.clone();
            tokio::spawn(async move { dltsub_store::run_migrations(&options).await })
        })
        .collect();
    let mut applied_total = 0;
    for run in runs {
        let report = run.await.expect("task").expect("concurrent migration");
        applied_total += report.applied.len();
    }
    assert_eq!(applied_total, known_migrations(&database.options.url).len());
}

/// Enqueue writes the batch, its QUEUED status, its service, its claim row and an event.
async fn enqueue_writes_batch_status_service_claim_and_event(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let result = store
        .enqueue(
            "circuit::svc",
            &[new_batch(1, b"one"), new_batch(2, b"two")],
        )
        .await
        .expect("enqueue");
    assert_eq!(result.len(), 2);
    assert!(
        result
            .iter()
            .all(|b| b.newly_accepted && b.status == BatchStatus::Queued)
    );
    assert!(result[0].seq < result[1].seq, "seq follows request order");
    assert_eq!(table_counts(&store).await, vec![0, 1, 1, 2, 2, 2]);
    let claim_epoch = store
        .scalar_i64_for_tests("(SELECT epoch FROM service_id_claims WHERE claimant IS NULL)")
        .await;
    assert_eq!(claim_epoch, 0, "a new claim row is unclaimed at epoch 0");
}

/// The same batch twice gives one row and reports the existing one.
async fn enqueue_same_batch_twice_is_idempotent(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let first = store
        .enqueue("svc", &[new_batch(7, b"bytes")])
        .await
        .unwrap();
    let second = store
        .enqueue("svc", &[new_batch(7, b"bytes")])
        .await
        .unwrap();
    assert!(first[0].newly_accepted);
    assert!(!second[0].newly_accepted);
    assert_eq!(first[0].seq, second[0].seq);
    assert_eq!(second[0].status, BatchStatus::Queued);
    assert_eq!(table_counts(&store).await, vec![0, 1, 1, 1, 1, 1]);
}

/// Different bytes under an accepted id are a conflict, and the whole request writes
/// nothing — not even its other, new batches or a new service.
async fn enqueue_conflicting_bytes_writes_nothing(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let accepted = store
        .enqueue("svc", &[new_batch(1, b"original")])
        .await
        .unwrap();
    let before = table_counts(&store).await;
    let error = store
        .enqueue("svc", &[new_batch(2, b"new"), new_batch(1, b"tampered")])
        .await
        .expect_err("conflict");
    match error {
        StoreError::BatchConflict {
            batch_id,
            existing_seq,
            service_id,
        } => {
            assert_eq!(batch_id, self::batch_id(1));
            assert_eq!(existing_seq, accepted[0].seq);
            assert_eq!(service_id, "svc");
        }
        other => panic!("expected BatchConflict, got {other:?}"),
    }
    assert_eq!(table_counts(&store).await, before);
}

/// Bad input is refused with an error naming the field, and writes nothing.
async fn enqueue_rejects_bad_input(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let short_id = NewBatch {
        batch_id: "abc".into(),
        serialized_batch: b"x".to_vec(),
    };
    let not_hex = NewBatch {
        batch_id: "g".repeat(128),
        serialized_batch: b"x".to_vec(),
    };
    let cases: Vec<(&str, Vec<NewBatch>, &str)> = vec![
        ("svc", vec![short_id], "batch_id"),
        ("svc", vec![not_hex], "batch_id"),
        ("svc", vec![], "batches"),
        ("", vec![new_batch(1, b"x")], "service_id"),
        (
            "svc",
            vec![new_batch(1, b"x"), new_batch(1, b"x")],
            "batch_id",
        ),
        ("svc", vec![new_batch(1, b"")], "serialized_batch"),
    ];
    for (service, batches, expected_field) in cases {
        match store.enqueue(service, &batches).await {
            Err(StoreError::InvalidInput { field, .. }) => assert_eq!(field, expected_field),
            other => panic!("expected InvalidInput({expected_field}), got {other:?}"),
        }
    }
    assert_eq!(table_counts(&store).await, vec![0; TABLES.len()]);
}

/// 10,000 separate enqueue transactions from 8 concurrent writers all succeed, and every
/// batch ends up with exactly one status row and one event.
async fn ten_thousand_enqueues_succeed(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    const WRITERS: u64 = 8;
    const PER_WRITER: u64 = 1_250;
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let n = writer * PER_WRITER + i;
                    let service = format!("svc-{}", n % 50);
                    store
                        .enqueue(&service, &[new_batch(n, format!("batch {n}").as_bytes())])
                        .await
                        .unwrap_or_else(|error| panic!("enqueue {n}: {error}"));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer task");
    }
    let total = (WRITERS * PER_WRITER) as i64;
    assert_eq!(store.count_rows_for_tests("batches").await, total);
    assert_eq!(store.count_rows_for_tests("batch_statuses").await, total);
    assert_eq!(store.count_rows_for_tests("batch_events").await, total);
    assert_eq!(store.count_rows_for_tests("services").await, 50);
    assert_eq!(store.count_rows_for_tests("service_id_claims").await, 50);
}

/// One request may carry many batches (a large BatchList): 10,000 in one transaction.
async fn one_enqueue_of_ten_thousand_batches(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let batches: Vec<NewBatch> = (0..10_000)
        .map(|n| new_batch(n, &n.to_le_bytes()))
        .collect();
    let result = store.enqueue("bulk", &batches).await.expect("bulk enqueue");
    assert_eq!(result.len(), 10_000);
    assert!(result.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert_eq!(store.count_rows_for_tests("batch_statuses").await, 10_000);
}

/// The database clock drives time; an offset moves one handle's view of it, and times
/// past 2038 are stored without overflow.
async fn database_clock_and_offsets(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let now = store.database_now_us().await.unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    assert!(
        (now - wall).abs() < 60_000_000,
        "database clock {now} vs wall clock {wall}"
    );

    let in_2050 = Duration::from_secs(60 * 60 * 24 * 365 * 25);
    let future = store.with_clock_offset(in_2050);
    let shifted = future.database_now_us().await.unwrap();
    assert!(shifted - now >= in_2050.as_micros() as i64);
    future.enqueue("svc", &[new_batch(1, b"x")]).await.unwrap();
    let created = store
        .scalar_i64_for_tests("(SELECT MAX(created_at_us) FROM batches)")
        .await;
    let year_2038_us = 2_147_483_648_i64 * 1_000_000;
    assert!(
        created > year_2038_us,
        "created_at_us {created} should be past 2038"
    );
}

/// Batch ids must be 128 hex characters even when written around the store API.
async fn schema_rejects_truncated_batch_ids(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    store.enqueue("svc", &[new_batch(1, b"x")]).await.unwrap();
    let inserted = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batches WHERE length(batch_id) = 128)")
        .await;
    assert_eq!(inserted, 1, "the full 128-character id is stored");
}

/// A primary (and SQLite, which has no standby) is writable: `/readyz` may say ready.
async fn a_primary_is_writable(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    store.check_writable().await.expect("writable");
}

/// The total of unfinished batches counts every service and leaves out terminal ones
/// (what the API's `max_queued_total` is checked against).
async fn unfinished_total_counts_every_service(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    assert_eq!(store.unfinished_total().await.unwrap(), 0);
    let first = store
        .enqueue(
            "a::x",
            &[new_batch(1, b"1"), new_batch(2, b"2"), new_batch(3, b"3")],
        )
        .await
        .unwrap();
    store
        .enqueue("b::y", &[new_batch(4, b"4"), new_batch(5, b"5")])
        .await
        .unwrap();
    assert_eq!(store.unfinished_total().await.unwrap(), 5);
    let moved = store
        .move_batch(first[0].seq, BatchMoveKind::Cancel)
        .await
        .unwrap()
        .unwrap();
    assert!(moved.changed);
    assert_eq!(store.unfinished_total().await.unwrap(), 4);
}

backend_tests!(
    a_primary_is_writable,
    migrations_apply_once,
    concurrent_migrations_do_not_race,
    enqueue_writes_batch_status_service_claim_and_event,
    enqueue_same_batch_twice_is_idempotent,
    enqueue_conflicting_bytes_writes_nothing,
    enqueue_rejects_bad_input,
    ten_thousand_enqueues_succeed,
    one_enqueue_of_ten_thousand_batches,
    database_clock_and_offsets,
    schema_rejects_truncated_batch_ids,
    retention_deletes_only_old_terminal_batches,
    unfinished_total_counts_every_service,
);

mod postgres_only {
    use super::*;

    /// Every pooled PostgreSQL session carries the timeouts that keep a stalled instance
    /// from blocking the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_have_timeouts() {
        let database = TestDatabase::migrated(TestBackend::Postgres).await;
        let mut options = database.options.clone();
        options.statement_timeout = Duration::from_millis(1_234);
        options.lock_timeout = Duration::from_millis(567);
        options.idle_in_transaction_timeout = Duration::from_millis(8_910);
        let store = dltsub_store::Store::connect(&options).await.unwrap();
        for (name, expected) in [
            ("statement_timeout", 1_234),
            ("lock_timeout", 567),
            ("idle_in_transaction_session_timeout", 8_910),
        ] {
            let value = store
                .scalar_i64_for_tests(&format!(
                    "(SELECT CAST(setting AS BIGINT) FROM pg_settings WHERE name = '{name}')"
                ))
                .await;
            assert_eq!(value, expected, "{name}");
        }
    }
}

mod postgres_read_only {
    use super::*;

    /// Sessions on a server that accepts no writes (here: sessions opened read-only, as on
    /// a standby after a failover) are reported as such and dropped from the pool, so the
    /// next connection looks for the primary again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_only_sessions_are_reported_and_dropped() {
        let database = TestDatabase::migrated(TestBackend::Postgres).await;
        let observer = database.store().await;
        let dltsub_store::DatabaseUrl::Postgres(url) = &database.options.url else {
            unreachable!()
        };
        let mut options = database.options.clone();
        // The test database's URL selects its schema with `options=-csearch_path…`; add
        // a read-only default to the same parameter.
        options.url = format!("{url}%20-cdefault_transaction_read_only%3Don")
            .parse()
            .unwrap();
        let tag = format!("dltsub-ro-{}", unique_suffix());
        options.application_name = Some(tag.clone());
        let read_only = dltsub_store::Store::connect(&options).await.unwrap();
        let sessions =
            format!("(SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = '{tag}')");

        let error = read_only.check_writable().await.unwrap_err();
        assert!(matches!(error, StoreError::ReadOnly), "{error}");
        wait_for_no_sessions(&observer, &sessions).await;

        let result = read_only.enqueue("svc", &[new_batch(1, b"x")]).await;
        assert!(
            dltsub_store::is_read_only_error(&result),
            "an insert on a read-only session: {:?}",
            result.err()
        );
        wait_for_no_sessions(&observer, &sessions).await;
        assert_eq!(observer.count_rows_for_tests("batches").await, 0);

        // Against the same database with default sessions, writes work.
        observer.check_writable().await.unwrap();
        observer
            .enqueue("svc", &[new_batch(1, b"x")])
            .await
            .unwrap();
    }

    async fn wait_for_no_sessions(observer: &dltsub_store::Store, count_sql: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let open = observer.scalar_i64_for_tests(count_sql).await;
            if open == 0 {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{open} read-only sessions still open 5 s after a read-only error"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn unique_suffix() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        format!("{}-{nanos}", std::process::id())
    }
}

mod sqlite_only {
    use super::*;

    /// Every pooled SQLite connection is in WAL mode with a busy timeout, so several
    /// processes can share the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_use_wal_and_busy_timeout() {
        let database = TestDatabase::migrated(TestBackend::Sqlite).await;
        let store = database.store().await;
        let busy = store
            .scalar_i64_for_tests("(SELECT timeout FROM pragma_busy_timeout)")
            .await;
        assert_eq!(busy, 5_000);
        let wal = store
            .scalar_i64_for_tests("(SELECT journal_mode = 'wal' FROM pragma_journal_mode)")
            .await;
        assert_eq!(wal, 1);
    }
}

/// Retention deletes terminal batches past the age, with their statuses and history, and
/// leaves unfinished and recent ones alone.
async fn retention_deletes_only_old_terminal_batches(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    store
        .enqueue(
            "svc",
            &[new_batch(1, b"a"), new_batch(2, b"b"), new_batch(3, b"c")],
        )
        .await
        .unwrap();
    // Batch 1 committed long ago, batch 2 committed just now, batch 3 still queued.
    store
        .execute_for_tests("UPDATE batch_statuses SET status = 'COMMITTED' WHERE seq IN (SELECT seq FROM batches WHERE batch_id LIKE '%1' OR batch_id LIKE '%2')")
        .await;
    store
        .execute_for_tests("UPDATE batch_statuses SET updated_at_us = 0 WHERE seq = (SELECT seq FROM batches WHERE batch_id LIKE '%1')")
        .await;
    let deleted = store
        .delete_terminal_batches(Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(store.count_rows_for_tests("batches").await, 2);
    assert_eq!(store.count_rows_for_tests("batch_statuses").await, 2);
    assert_eq!(store.count_rows_for_tests("batch_events").await, 2);
    let remaining = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batches WHERE batch_id LIKE '%1')")
        .await;
    assert_eq!(remaining, 0, "the old committed batch is the one deleted");
}
