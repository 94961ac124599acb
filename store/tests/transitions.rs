//! Fenced status transitions after the ledger answered, on both backends.

use std::time::Duration;

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{
    BatchStatus, ClaimTiming, HeldClaim, InstanceInfo, InstanceState, NewBatch, Store, TickPlan,
    Transition, UnknownSince, backend_tests,
};

const TIMING: ClaimTiming = ClaimTiming {
    fast_expiry: Duration::from_secs(10),
    slow_expiry: Duration::from_secs(60),
    instance_stale_after: Duration::from_secs(6),
};

fn me(name: &str) -> InstanceInfo {
    InstanceInfo {
        instance_id: name.to_string(),
        hostname: "host".into(),
        pid: 1,
        version: "test".into(),
        capacity: 1,
        session_tag: None,
        labels: Vec::new(),
    }
}

/// Acquires every service for `name` and returns its claims.
async fn take_all(store: &Store, name: &str) -> Vec<HeldClaim> {
    let outcome = store
        .claim_tick(&me(name), InstanceState::Running, TIMING, |_| {
            TickPlan::unpinned(usize::MAX >> 1)
        })
        .await
        .unwrap();
    outcome.held
}

async fn status_of(store: &Store, seq: i64) -> String {
    let code = store
        .scalar_i64_for_tests(&format!(
            "(SELECT CAST(CASE status WHEN 'QUEUED' THEN 1 WHEN 'SUBMITTING' THEN 2 WHEN 'PENDING' THEN 3 \
              WHEN 'COMMITTED' THEN 4 WHEN 'INVALID' THEN 5 WHEN 'IN_DOUBT' THEN 6 ELSE 0 END AS BIGINT) \
              FROM batch_statuses WHERE seq = {seq})"
        ))
        .await;
    [
        "?",
        "QUEUED",
        "SUBMITTING",
        "PENDING",
        "COMMITTED",
        "INVALID",
        "IN_DOUBT",
    ][code as usize]
        .to_string()
}

async fn setup(backend: TestBackend) -> (TestDatabase, Store, HeldClaim, Vec<i64>) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let batches: Vec<NewBatch> = (0..3)
        .map(|n| NewBatch {
            batch_id: format!("{n:0128x}"),
            serialized_batch: vec![n as u8 + 1],
        })
        .collect();
    let seqs: Vec<i64> = store
        .enqueue("svc", &batches)
        .await
        .unwrap()
        .iter()
        .map(|b| b.seq)
        .collect();
    let claim = take_all(&store, "a").await.remove(0);
    let marked = store
        .mark_submitting("a", &[(claim.clone(), seqs.clone())])
        .await
        .unwrap();
    assert_eq!(marked.applied, seqs);
    (database, store, claim, seqs)
}

/// A poll's transitions land in one call: the ledger's message is kept, backoff sets the
/// next attempt, and every change is in the history.
async fn transitions_apply_with_message_and_backoff(backend: TestBackend) {
    let (_database, store, claim, seqs) = setup(backend).await;
    let mut pending = Transition::new(seqs[0], BatchStatus::Submitting, BatchStatus::Pending);
    pending.dlt_message = Some("{\"link\":\"/x\"}".into());
    let mut invalid = Transition::new(seqs[1], BatchStatus::Submitting, BatchStatus::Invalid);
    invalid.dlt_message = Some("{\"error_message\":\"bad payload\"}".into());
    let mut retry = Transition::new(seqs[2], BatchStatus::Submitting, BatchStatus::Queued);
    retry.retry_after = Some(Duration::from_secs(30));
    retry.last_error = Some("429 Too Many Requests".into());
    let outcome = store
        .apply_transitions("a", &[(claim.clone(), vec![pending, invalid, retry])])
        .await
        .unwrap();
    assert_eq!(outcome.applied, seqs);
    assert!(outcome.lost.is_empty());
    assert_eq!(status_of(&store, seqs[0]).await, "PENDING");
    assert_eq!(status_of(&store, seqs[1]).await, "INVALID");
    assert_eq!(status_of(&store, seqs[2]).await, "QUEUED");
    let message_kept = store
        .scalar_i64_for_tests(&format!(
            "(SELECT COUNT(*) FROM batch_statuses WHERE seq = {} AND dlt_message LIKE '%bad payload%')",
            seqs[1]
        ))
        .await;
    assert_eq!(message_kept, 1);
    let backoff_us = store
        .scalar_i64_for_tests(&format!(
            "(SELECT next_attempt_at_us - updated_at_us FROM batch_statuses WHERE seq = {})",
            seqs[2]
        ))
        .await;
    assert_eq!(backoff_us, 30_000_000);
    // 3 accepted + 3 submitting + 3 transitions.
    assert_eq!(store.count_rows_for_tests("batch_events").await, 9);
}

/// A transition whose batch is no longer in its `from` status does nothing.
async fn transition_guarded_by_current_status(backend: TestBackend) {
    let (_database, store, claim, seqs) = setup(backend).await;
    let wrong = Transition::new(seqs[0], BatchStatus::Pending, BatchStatus::Committed);
    let outcome = store
        .apply_transitions("a", &[(claim, vec![wrong])])
        .await
        .unwrap();
    assert!(outcome.applied.is_empty());
    assert_eq!(status_of(&store, seqs[0]).await, "SUBMITTING");
}

/// After a takeover the old holder's transitions are refused and change nothing; the
/// new holder's tick has turned its SUBMITTING batches IN_DOUBT.
async fn transitions_of_a_lost_claim_are_refused(backend: TestBackend) {
    let (database, store, claim, seqs) = setup(backend).await;
    database
        .options
        .clock_offset
        .advance(Duration::from_secs(61));
    let taken = take_all(&store, "b").await;
    assert_eq!(taken[0].epoch, claim.epoch + 1);
    let events_before = store.count_rows_for_tests("batch_events").await;
    let late = Transition::new(seqs[0], BatchStatus::Submitting, BatchStatus::Pending);
    let outcome = store
        .apply_transitions("a", &[(claim.clone(), vec![late])])
        .await
        .unwrap();
    assert_eq!(outcome.lost, vec![claim]);
    assert!(outcome.applied.is_empty());
    assert_eq!(status_of(&store, seqs[0]).await, "IN_DOUBT");
    assert_eq!(
        store.count_rows_for_tests("batch_events").await,
        events_before
    );
}

/// The Unknown marker starts once and is kept while Unknown lasts; clearing ends it.
async fn unknown_marker_starts_once(backend: TestBackend) {
    let (database, store, claim, seqs) = setup(backend).await;
    let mut to_pending = Transition::new(seqs[0], BatchStatus::Submitting, BatchStatus::Pending);
    to_pending.unknown_since = UnknownSince::Clear;
    store
        .apply_transitions("a", &[(claim.clone(), vec![to_pending])])
        .await
        .unwrap();
    let mut unknown = Transition::new(seqs[0], BatchStatus::Pending, BatchStatus::Pending);
    unknown.unknown_since = UnknownSince::Mark;
    store
        .apply_transitions("a", &[(claim.clone(), vec![unknown.clone()])])
        .await
        .unwrap();
    let first = store
        .scalar_i64_for_tests(&format!(
            "(SELECT unknown_since_us FROM batch_statuses WHERE seq = {})",
            seqs[0]
        ))
        .await;
    database
        .options
        .clock_offset
        .advance(Duration::from_secs(2));
    store
        .apply_transitions("a", &[(claim.clone(), vec![unknown])])
        .await
        .unwrap();
    let second = store
        .scalar_i64_for_tests(&format!(
            "(SELECT unknown_since_us FROM batch_statuses WHERE seq = {})",
            seqs[0]
        ))
        .await;
    assert_eq!(first, second, "a run of Unknown keeps its start");
    let pollable = store.pollable_batches("a", 10).await.unwrap();
    assert_eq!(pollable.len(), 1);
    assert_eq!(pollable[0].unknown_since_us, Some(first));
    let mut known = Transition::new(seqs[0], BatchStatus::Pending, BatchStatus::Committed);
    known.unknown_since = UnknownSince::Clear;
    store
        .apply_transitions("a", &[(claim, vec![known])])
        .await
        .unwrap();
    let cleared = store
        .scalar_i64_for_tests(&format!(
            "(SELECT COUNT(*) FROM batch_statuses WHERE seq = {} AND unknown_since_us IS NULL)",
            seqs[0]
        ))
        .await;
    assert_eq!(cleared, 1);
    assert!(store.pollable_batches("a", 10).await.unwrap().is_empty());
}

/// 2,000 transitions over 200 services go through in one call.
async fn many_transitions_in_one_call(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    for service in 0..200 {
        let batches: Vec<NewBatch> = (0..10)
            .map(|n| NewBatch {
                batch_id: format!("{:0128x}", service * 100 + n),
                serialized_batch: vec![1],
            })
            .collect();
        store
            .enqueue(&format!("svc-{service:03}"), &batches)
            .await
            .unwrap();
    }
    let claims = take_all(&store, "a").await;
    store
        .execute_for_tests("UPDATE batch_statuses SET status = 'PENDING'")
        .await;
    let mut work = Vec::new();
    for claim in &claims {
        let seqs: Vec<i64> = store
            .pollable_batches("a", 100_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|b| b.service_id == claim.service_id)
            .map(|b| b.seq)
            .collect();
        let transitions = seqs
            .into_iter()
            .map(|seq| Transition::new(seq, BatchStatus::Pending, BatchStatus::Committed))
            .collect();
        work.push((claim.clone(), transitions));
    }
    let before = store.round_trips();
    let outcome = store.apply_transitions("a", &work).await.unwrap();
    let round_trips = store.round_trips() - before;
    assert_eq!(outcome.applied.len(), 2_000);
    assert_eq!(
        store
            .scalar_i64_for_tests(
                "(SELECT COUNT(*) FROM batch_statuses WHERE status = 'COMMITTED')"
            )
            .await,
        2_000
    );
    assert!(
        round_trips <= 12,
        "set-based, not per batch: {round_trips} round trips"
    );
}

/// A SUBMITTING batch its instance lost track of is turned IN_DOUBT once old enough —
/// unless the instance still has it in flight, or no longer holds the service.
async fn stranded_submitting_is_swept(backend: TestBackend) {
    let (database, store, _claim, seqs) = setup(backend).await;
    let threshold = Duration::from_secs(20);
    let swept = store
        .sweep_stranded_submitting("a", threshold, &[])
        .await
        .unwrap();
    assert!(swept.is_empty(), "too young to be stranded");
    database
        .options
        .clock_offset
        .advance(Duration::from_secs(21));
    // Keep the claim (renew), as a live instance does.
    take_all(&store, "a").await;
    let swept = store
        .sweep_stranded_submitting("a", threshold, &[seqs[0]])
        .await
        .unwrap();
    assert_eq!(
        swept,
        vec![seqs[1], seqs[2]],
        "the one still in flight is left alone"
    );
    assert_eq!(status_of(&store, seqs[0]).await, "SUBMITTING");
    assert_eq!(status_of(&store, seqs[1]).await, "IN_DOUBT");
    let other = store
        .sweep_stranded_submitting("b", threshold, &[])
        .await
        .unwrap();
    assert!(
        other.is_empty(),
        "only the submitting instance sweeps its own batches"
    );
}

backend_tests!(
    stranded_submitting_is_swept,
    transitions_apply_with_message_and_backoff,
    transition_guarded_by_current_status,
    transitions_of_a_lost_claim_are_refused,
    unknown_marker_starts_once,
    many_transitions_in_one_call,
);
