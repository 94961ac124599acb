//! Operator reads and moves (services, batches with history, pause, max_in_flight,
//! cancel, requeue) and the per-service queue cap, on both backends.

use std::time::Duration;

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{
    BatchMoveKind, BatchStatus, ClaimTiming, HeldClaim, InstanceInfo, InstanceState, NewBatch,
    Store, StoreError, TickPlan, Transition, backend_tests,
};

const TIMING: ClaimTiming = ClaimTiming {
    fast_expiry: Duration::from_secs(10),
    slow_expiry: Duration::from_secs(60),
    instance_stale_after: Duration::from_secs(6),
};

fn batches(range: std::ops::Range<u64>) -> Vec<NewBatch> {
    range
        .map(|n| NewBatch {
            batch_id: format!("{n:0128x}"),
            serialized_batch: vec![n as u8, 1],
        })
        .collect()
}

async fn take_all(store: &Store, name: &str) -> Vec<HeldClaim> {
    let me = InstanceInfo {
        instance_id: name.to_string(),
        hostname: "host".into(),
        pid: 1,
        version: "test".into(),
        capacity: 1,
        session_tag: None,
        labels: Vec::new(),
    };
    store
        .claim_tick(&me, InstanceState::Running, TIMING, |_| {
            TickPlan::unpinned(usize::MAX >> 1)
        })
        .await
        .unwrap()
        .held
}

async fn enqueue(store: &Store, service: &str, range: std::ops::Range<u64>) -> Vec<i64> {
    store
        .enqueue(service, &batches(range))
        .await
        .unwrap()
        .iter()
        .map(|b| b.seq)
        .collect()
}

/// The service list has every service once, in id order, with its holder, its settings
/// and a count for every status; `only` narrows it to one service or none.
async fn services_show_counts_holders_and_settings(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let a = enqueue(&store, "b-second", 0..3).await;
    enqueue(&store, "a-first", 10..11).await;
    store
        .move_batch(a[2], BatchMoveKind::Cancel)
        .await
        .unwrap()
        .unwrap();
    take_all(&store, "holder").await;

    let services = store.services(None).await.unwrap();
    let ids: Vec<&str> = services.iter().map(|s| s.service_id.as_str()).collect();
    assert_eq!(ids, ["a-first", "b-second"]);
    let second = &services[1];
    assert_eq!(second.counts.len(), BatchStatus::ALL.len());
    assert_eq!(second.counts[&BatchStatus::Queued], 2);
    assert_eq!(second.counts[&BatchStatus::Cancelled], 1);
    assert_eq!(second.counts[&BatchStatus::Committed], 0);
    assert_eq!(second.claimant.as_deref(), Some("holder"));
    assert_eq!(second.epoch, 1);
    assert!(!second.paused);
    assert_eq!(second.max_in_flight, 1);
    assert_eq!(services[0].counts[&BatchStatus::Queued], 1);

    let only = store.services(Some("a-first")).await.unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].counts[&BatchStatus::Queued], 1);
    assert_eq!(only[0].counts[&BatchStatus::Cancelled], 0);
    assert!(store.services(Some("nope")).await.unwrap().is_empty());
}

/// A paused service yields nothing to submit until it is resumed; max_in_flight lets
/// more of its batches go at once; unknown services and out-of-range values are refused.
async fn pause_and_max_in_flight_steer_selection(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    enqueue(&store, "svc", 0..5).await;
    take_all(&store, "me").await;
    assert_eq!(store.select_submittable("me", 100).await.unwrap().len(), 1);

    assert!(store.set_service_paused("svc", true).await.unwrap());
    assert!(store.services(Some("svc")).await.unwrap()[0].paused);
    assert!(
        store
            .select_submittable("me", 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.set_service_paused("svc", false).await.unwrap());
    assert_eq!(store.select_submittable("me", 100).await.unwrap().len(), 1);

    assert!(store.set_service_max_in_flight("svc", 3).await.unwrap());
    assert_eq!(store.select_submittable("me", 100).await.unwrap().len(), 3);

    assert!(!store.set_service_paused("nope", true).await.unwrap());
    assert!(!store.set_service_max_in_flight("nope", 2).await.unwrap());
    for bad in [0, -1, 1_001] {
        match store.set_service_max_in_flight("svc", bad).await {
            Err(StoreError::InvalidInput { field, .. }) => assert_eq!(field, "max_in_flight"),
            other => panic!("max_in_flight {bad}: {other:?}"),
        }
    }
    assert_eq!(
        store.services(Some("svc")).await.unwrap()[0].max_in_flight,
        3
    );
}

/// Cancel applies to QUEUED only, requeue to QUEUED and IN_DOUBT; everything else is
/// refused and left as it was; each change leaves a history event naming the operator.
async fn cancel_and_requeue_follow_the_status(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let seqs = enqueue(&store, "svc", 0..4).await;
    let claim = take_all(&store, "me").await.remove(0);

    // seqs[0] SUBMITTING, seqs[1] IN_DOUBT, seqs[2] COMMITTED, seqs[3] QUEUED.
    store
        .mark_submitting("me", &[(claim.clone(), seqs[0..3].to_vec())])
        .await
        .unwrap();
    store
        .apply_transitions(
            "me",
            &[(
                claim.clone(),
                vec![
                    Transition::new(seqs[1], BatchStatus::Submitting, BatchStatus::InDoubt),
                    Transition::new(seqs[2], BatchStatus::Submitting, BatchStatus::Committed),
                ],
            )],
        )
        .await
        .unwrap();

    let refused_cancel = [
        (seqs[0], BatchStatus::Submitting),
        (seqs[1], BatchStatus::InDoubt),
        (seqs[2], BatchStatus::Committed),
    ];
    for (seq, status) in refused_cancel {
        let moved = store
            .move_batch(seq, BatchMoveKind::Cancel)
            .await
            .unwrap()
            .unwrap();
        assert!(!moved.changed, "cancel of {status} was applied");
        assert_eq!(moved.before, status);
        assert_eq!(moved.batch.status, status.as_str());
    }
    for (seq, status) in [
        (seqs[0], BatchStatus::Submitting),
        (seqs[2], BatchStatus::Committed),
    ] {
        let moved = store
            .move_batch(seq, BatchMoveKind::Requeue)
            .await
            .unwrap()
            .unwrap();
        assert!(!moved.changed, "requeue of {status} was applied");
        assert_eq!(moved.batch.status, status.as_str());
    }

    let requeued = store
        .move_batch(seqs[1], BatchMoveKind::Requeue)
        .await
        .unwrap()
        .unwrap();
    assert!(requeued.changed);
    assert_eq!(requeued.before, BatchStatus::InDoubt);
    assert_eq!(requeued.batch.status, "QUEUED");

    let cancelled = store
        .move_batch(seqs[3], BatchMoveKind::Cancel)
        .await
        .unwrap()
        .unwrap();
    assert!(cancelled.changed);
    assert_eq!(cancelled.batch.status, "CANCELLED");
    // Cancelled is terminal: neither move applies again.
    for kind in [BatchMoveKind::Cancel, BatchMoveKind::Requeue] {
        let again = store.move_batch(seqs[3], kind).await.unwrap().unwrap();
        assert!(!again.changed);
        assert_eq!(again.before, BatchStatus::Cancelled);
    }
    assert!(
        store
            .move_batch(i64::MAX, BatchMoveKind::Cancel)
            .await
            .unwrap()
            .is_none()
    );

    let history = store.batch_history(seqs[1]).await.unwrap();
    let steps: Vec<(Option<&str>, &str)> = history
        .iter()
        .map(|e| (e.old_status.as_deref(), e.new_status.as_str()))
        .collect();
    assert_eq!(
        steps,
        [
            (None, "QUEUED"),
            (Some("QUEUED"), "SUBMITTING"),
            (Some("SUBMITTING"), "IN_DOUBT"),
            (Some("IN_DOUBT"), "QUEUED"),
        ]
    );
    assert_eq!(
        history[3].detail.as_deref(),
        Some("requeued by an operator")
    );
    assert!(history.windows(2).all(|w| w[0].at_us <= w[1].at_us));
}

/// A fenced write that saw a batch QUEUED cannot win against an operator's cancel that
/// came first: the submitter marks nothing, the batch stays CANCELLED.
async fn cancel_wins_over_a_later_mark_submitting(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let seqs = enqueue(&store, "svc", 0..2).await;
    let claim = take_all(&store, "me").await.remove(0);
    let selected = store.select_submittable("me", 10).await.unwrap();
    assert_eq!(selected.len(), 1);
    store
        .move_batch(seqs[0], BatchMoveKind::Cancel)
        .await
        .unwrap()
        .unwrap();
    let marked = store
        .mark_submitting("me", &[(claim, vec![seqs[0]])])
        .await
        .unwrap();
    assert!(marked.applied.is_empty());
    let found = store
        .find_batches(Some("svc"), &[&format!("{:0128x}", 0)])
        .await;
    assert_eq!(found.unwrap()[0].status, "CANCELLED");
    // The next batch is not held up by the cancelled one.
    let next = store.select_submittable("me", 10).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].seq, seqs[1]);
}

/// find_batches narrows by service; an id stored under two services comes back twice.
async fn find_batches_by_id_and_service(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    enqueue(&store, "one", 0..2).await;
    enqueue(&store, "two", 1..2).await;
    let id = format!("{:0128x}", 1);
    let everywhere = store.find_batches(None, &[&id]).await.unwrap();
    let services: Vec<&str> = everywhere.iter().map(|b| b.service_id.as_str()).collect();
    assert_eq!(services, ["one", "two"]);
    let one = store.find_batches(Some("two"), &[&id]).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].status, "QUEUED");
    assert_eq!(one[0].attempts, 0);
    assert!(
        store
            .find_batches(None, &[&format!("{:0128x}", 99)])
            .await
            .unwrap()
            .is_empty()
    );
}

/// The queue cap refuses a request that would take a service over it, writing nothing;
/// other services, idempotent repeats and requests after the backlog drained go through.
async fn queue_cap_refuses_and_writes_nothing(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let cap = Some(3);
    store
        .enqueue_limited("svc", &batches(0..2), cap)
        .await
        .unwrap();
    let rows_before = store.count_rows_for_tests("batches").await;
    match store.enqueue_limited("svc", &batches(2..4), cap).await {
        Err(StoreError::QueueFull {
            service_id,
            unfinished,
            limit,
        }) => {
            assert_eq!(service_id, "svc");
            assert_eq!(unfinished, 2);
            assert_eq!(limit, 3);
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(store.count_rows_for_tests("batches").await, rows_before);
    assert_eq!(
        store.count_rows_for_tests("batch_events").await,
        rows_before
    );
    // Repeating accepted batches adds nothing, so it is never refused.
    store
        .enqueue_limited("svc", &batches(0..2), Some(1))
        .await
        .unwrap();
    store
        .enqueue_limited("svc", &batches(2..3), cap)
        .await
        .unwrap();
    store
        .enqueue_limited("other", &batches(0..3), cap)
        .await
        .unwrap();
    // Finished batches no longer count.
    let seqs = store
        .find_batches(Some("svc"), &[&format!("{:0128x}", 0)])
        .await;
    store
        .move_batch(seqs.unwrap()[0].seq, BatchMoveKind::Cancel)
        .await
        .unwrap();
    store
        .enqueue_limited("svc", &batches(3..4), cap)
        .await
        .unwrap();
}

backend_tests!(
    services_show_counts_holders_and_settings,
    pause_and_max_in_flight_steer_selection,
    cancel_and_requeue_follow_the_status,
    cancel_wins_over_a_later_mark_submitting,
    find_batches_by_id_and_service,
    queue_cap_refuses_and_writes_nothing,
);
