//! The scrape-time gauges (`Store::backlog_gauges`) on both backends: the backlog by
//! status with the age of its oldest batch, and the services with a backlog but no live
//! claim, on the database clock.

use std::time::Duration;

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{BatchStatus, NewBatch, backend_tests};

fn batches(range: std::ops::Range<u64>) -> Vec<NewBatch> {
    range
        .map(|n| NewBatch {
            batch_id: format!("{n:0128x}"),
            serialized_batch: vec![n as u8, 1],
        })
        .collect()
}

/// Two services with queued batches and nobody holding them; then one is held by a live
/// claim, and later its claim passes its fast expiry.
async fn gauges_count_the_backlog_and_the_unclaimed_services(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let empty = store.backlog_gauges().await.unwrap();
    assert!(empty.by_status.is_empty());
    assert_eq!(empty.unclaimed_services, 0);
    assert_eq!(empty.unclaimed_oldest_age_us, 0);

    store.enqueue("c::a", &batches(0..3)).await.unwrap();
    store.enqueue("c::b", &batches(10..12)).await.unwrap();
    // Seen a minute later on the database clock.
    let later = store.with_clock_offset(Duration::from_secs(60));
    let gauges = later.backlog_gauges().await.unwrap();
    let queued = gauges.by_status[&BatchStatus::Queued];
    assert_eq!(queued.count, 5);
    assert!(
        (60_000_000..70_000_000).contains(&queued.oldest_age_us),
        "{queued:?}"
    );
    assert_eq!(gauges.by_status.len(), 1, "{gauges:?}");
    assert_eq!(gauges.unclaimed_services, 2);
    assert!((60_000_000..70_000_000).contains(&gauges.unclaimed_oldest_age_us));

    // c::a held by a claim live for another 10 s of database time: only c::b is unclaimed.
    let now = store.database_now_us().await.unwrap();
    store
        .execute_for_tests(&format!(
            "UPDATE service_id_claims SET claimant = 'x', epoch = 1, \
             fast_expiry_us = {}, slow_expiry_us = {} WHERE service_id = 'c::a'",
            now + 10_000_000,
            now + 60_000_000
        ))
        .await;
    let gauges = store.backlog_gauges().await.unwrap();
    assert_eq!(gauges.unclaimed_services, 1);
    // 30 s later the claim is 20 s past its fast expiry: c::a counts again, and since its
    // expiry (not since its batches were queued); c::b's wait is the longest.
    let gauges = store
        .with_clock_offset(Duration::from_secs(30))
        .backlog_gauges()
        .await
        .unwrap();
    assert_eq!(gauges.unclaimed_services, 2);
    assert!((30_000_000..40_000_000).contains(&gauges.unclaimed_oldest_age_us));
    store
        .execute_for_tests("DELETE FROM service_id_claims WHERE service_id = 'c::b'")
        .await;
    let gauges = store
        .with_clock_offset(Duration::from_secs(30))
        .backlog_gauges()
        .await
        .unwrap();
    assert_eq!(gauges.unclaimed_services, 1);
    assert!(
        (20_000_000..30_000_000).contains(&gauges.unclaimed_oldest_age_us),
        "{gauges:?}"
    );
}

backend_tests!(gauges_count_the_backlog_and_the_unclaimed_services);
