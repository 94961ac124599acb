//! The submission pipeline end to end: dltsub instances, a real database (both backends),
//! the simulated ledger. Each test says what it proves.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use dltsub_devnet::{DevnetConfig, Dialect, FaultsPatch};
use dltsub_store::backend_tests;
use dltsub_store::testing::TestBackend;
use dltsub_tests::{Cluster, wait_for};

/// On a ledger shared by several services (Sawtooth's one ledger), each service's batches
/// appear in the order they were accepted.
fn assert_each_service_in_order(ledger: &[String], accepted: &BTreeMap<String, Vec<String>>) {
    for (service, ids) in accepted {
        let wanted: HashSet<&String> = ids.iter().collect();
        let order: Vec<&String> = ledger.iter().filter(|id| wanted.contains(id)).collect();
        let expected: Vec<&String> = ids.iter().collect();
        assert_eq!(order, expected, "ledger order of {service}");
    }
}

/// How often devnet saw each batch id in a POST (whatever it answered).
fn posts_per_batch(cluster: &Cluster) -> HashMap<String, usize> {
    count_posts(cluster, |_| true)
}

/// How often devnet accepted (202) each batch id.
fn accepted_posts_per_batch(cluster: &Cluster) -> HashMap<String, usize> {
    count_posts(cluster, |status| status == Some(202))
}

fn count_posts(cluster: &Cluster, counted: impl Fn(Option<u16>) -> bool) -> HashMap<String, usize> {
    let log = cluster.devnet.control().posts();
    assert_eq!(log.evicted, 0, "the POST log kept every POST");
    let mut counts = HashMap::new();
    for post in log.entries.into_iter().filter(|post| counted(post.status)) {
        for id in post.batch_ids {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Two instances, 1,000 batches over 50 services: all COMMITTED, each service's ledger
/// order equals its acceptance order, exactly one POST per batch, and both instances
/// submitted (the work was shared, so the order held across claims).
async fn two_instances_commit_everything_in_order_once(backend: TestBackend) {
    let mut cluster = Cluster::scabbard(backend).await;
    // Slow enough that one instance cannot drain everything (20 batches of a service, one
    // after the other) before the second has joined and taken its share.
    cluster.set_commit_latency("50ms");
    let mut accepted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for service in 0..50u64 {
        let id = format!("circuit::svc{service:02}");
        let ids = cluster.enqueue(&id, service * 1_000, 20, &[]).await;
        accepted.insert(id, ids);
    }
    cluster.set("instance_max_in_flight", "64");
    let mut a = cluster.start_instance();
    let mut b = cluster.start_instance();
    cluster.wait_until_final(Duration::from_secs(120)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 1_000);

    for (service, ids) in &accepted {
        assert_eq!(
            &cluster.devnet.control().committed(service),
            ids,
            "ledger order of {service}"
        );
    }
    let posts = posts_per_batch(&cluster);
    assert_eq!(posts.len(), 1_000);
    assert!(posts.values().all(|n| *n == 1), "a batch was POSTed twice");
    let instances: HashSet<String> = cluster
        .devnet
        .control()
        .posts()
        .entries
        .into_iter()
        .filter_map(|post| post.instance)
        .collect();
    assert_eq!(
        instances.len(),
        2,
        "both instances submitted: {instances:?}"
    );
    a.stop().await;
    b.stop().await;
}

/// An invalid batch ends INVALID with the ledger's message; the batches after it in the
/// same service still commit, in order.
async fn invalid_batch_is_recorded_and_the_service_goes_on(backend: TestBackend) {
    let cluster = Cluster::scabbard(backend).await;
    let ids = cluster.enqueue("circuit::svc", 0, 5, &[2]).await;
    let mut a = cluster.start_instance();
    cluster.wait_until_final(Duration::from_secs(60)).await;
    assert_eq!(cluster.count_status("INVALID").await, 1);
    assert_eq!(cluster.count_status("COMMITTED").await, 4);
    let with_message = cluster
        .store
        .scalar_i64_for_tests(&format!(
            "(SELECT COUNT(*) FROM batch_statuses s JOIN batches b ON b.seq = s.seq \
              WHERE b.batch_id = '{}' AND s.status = 'INVALID' AND s.dlt_message LIKE '%invalid%')",
            ids[2]
        ))
        .await;
    assert_eq!(with_message, 1, "the ledger's message is stored");
    let expected: Vec<String> = ids
        .iter()
        .enumerate()
        .filter(|(n, _)| *n != 2)
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(cluster.devnet.control().committed("circuit::svc"), expected);
    a.stop().await;
}

/// A 429 storm — the ledger's back-pressure limit set to 3 batches in flight while 20
/// services want to submit, plus random 503s — slows submission but loses nothing: every
/// batch is committed, exactly once, in order per service.
async fn back_pressure_storm_loses_nothing(backend: TestBackend) {
    let mut devnet = DevnetConfig::new(Dialect::Sawtooth);
    devnet.backpressure_high = 3;
    devnet.backpressure_low = 1;
    devnet.faults.error_503_before = 0.2;
    devnet.faults.commit_latency = "20ms".parse().unwrap();
    let mut cluster = Cluster::start(backend, devnet).await;
    cluster.set("dlt_dialect", "sawtooth");
    let mut accepted = BTreeMap::new();
    for service in 0..20u64 {
        let id = format!("s{service:02}");
        accepted.insert(
            id.clone(),
            cluster.enqueue(&id, service * 100, 5, &[]).await,
        );
    }
    let mut a = cluster.start_instance();
    cluster.wait_until_final(Duration::from_secs(120)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 100);
    let log = cluster.devnet.control().posts();
    let throttled = log.entries.iter().filter(|p| p.status == Some(429)).count();
    let unavailable = log.entries.iter().filter(|p| p.status == Some(503)).count();
    assert!(
        throttled > 10,
        "the 429 storm happened: {throttled} POSTs throttled"
    );
    assert!(unavailable > 0, "503s happened too");
    let ledger = cluster
        .devnet
        .control()
        .committed(dltsub_devnet::SAWTOOTH_LEDGER);
    assert_eq!(ledger.len(), 100, "every batch on the ledger once");
    assert_each_service_in_order(&ledger, &accepted);
    let stats = cluster.devnet.control().stats();
    let duplicates: u64 = stats.ledgers.values().map(|l| l.duplicates).sum();
    assert_eq!(duplicates, 0);
    a.stop().await;
}

/// The ledger commits and then drops the connection without answering: the batch goes
/// IN_DOUBT, the ledger is asked, and it ends COMMITTED with no second POST.
async fn lost_response_is_resolved_without_resubmitting(backend: TestBackend) {
    let cluster = Cluster::scabbard(backend).await;
    cluster
        .devnet
        .control()
        .update_faults(&FaultsPatch {
            drop_after_commit: Some(1.0),
            commit_latency: Some("5ms".parse().unwrap()),
            ..FaultsPatch::default()
        })
        .unwrap();
    let ids = cluster.enqueue("circuit::svc", 0, 3, &[]).await;
    let mut a = cluster.start_instance();
    cluster.wait_until_final(Duration::from_secs(60)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 3);
    let posts = posts_per_batch(&cluster);
    for id in &ids {
        assert_eq!(posts.get(id), Some(&1), "exactly one POST of {id}");
    }
    let went_in_doubt = cluster
        .store
        .scalar_i64_for_tests(
            "(SELECT COUNT(DISTINCT seq) FROM batch_events WHERE new_status = 'IN_DOUBT')",
        )
        .await;
    assert_eq!(went_in_doubt, 3, "every batch went through IN_DOUBT");
    a.stop().await;
}

/// The ledger restarts and forgets its pending batches: they read Unknown, are
/// resubmitted after the grace period, and are on the ledger exactly once.
async fn forgotten_batches_are_resubmitted_after_the_grace(backend: TestBackend) {
    let mut cluster = Cluster::scabbard(backend).await;
    cluster.set_commit_latency("3s");
    cluster.set("instance_max_in_flight", "16");
    for service in 0..4u64 {
        cluster
            .enqueue(&format!("circuit::s{service}"), service * 100, 2, &[])
            .await;
    }
    let mut a = cluster.start_instance();
    // Wait until the first batch of every service is on the ledger's pending list.
    wait_for(Duration::from_secs(30), || async {
        cluster.count_status("PENDING").await == 4
    })
    .await
    .expect("four batches pending");
    let forgotten = cluster.devnet.control().restart();
    assert_eq!(forgotten, 4, "the restart forgot the pending batches");
    cluster.set_commit_latency("5ms");
    cluster.wait_until_final(Duration::from_secs(60)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 8);
    let mut on_ledger = 0;
    for service in 0..4u64 {
        let committed = cluster
            .devnet
            .control()
            .committed(&format!("circuit::s{service}"));
        let unique: HashSet<&String> = committed.iter().collect();
        assert_eq!(
            unique.len(),
            committed.len(),
            "a batch is on the ledger twice"
        );
        on_ledger += committed.len();
    }
    assert_eq!(on_ledger, 8);
    let resubmitted = posts_per_batch(&cluster)
        .values()
        .filter(|n| **n == 2)
        .count();
    assert_eq!(
        resubmitted, 4,
        "the forgotten batches were POSTed again, once"
    );
    a.stop().await;
}

/// One instance stops abruptly mid-run (its tasks aborted, claims not released): the
/// other takes its services over after the expiry and finishes everything; nothing lost.
async fn abrupt_stop_is_taken_over(backend: TestBackend) {
    let mut cluster = Cluster::scabbard(backend).await;
    cluster.set_commit_latency("100ms");
    cluster.set("instance_max_in_flight", "32");
    for service in 0..20u64 {
        cluster
            .enqueue(&format!("circuit::s{service:02}"), service * 100, 15, &[])
            .await;
    }
    let mut a = cluster.start_instance();
    let mut b = cluster.start_instance();
    // Both hold services (the fair share has settled) and work is under way.
    wait_for(Duration::from_secs(30), || async {
        cluster.claim_holders().await.len() == 2
    })
    .await
    .expect("both instances hold services");
    wait_for(Duration::from_secs(60), || async {
        cluster.count_status("COMMITTED").await >= 20
    })
    .await
    .expect("work under way");
    assert!(
        cluster.count_status("COMMITTED").await < 250,
        "the kill comes mid-run"
    );
    a.kill();
    cluster.wait_until_final(Duration::from_secs(120)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 300);
    assert_eq!(
        cluster.unclaimed_services().await,
        0,
        "no service left unclaimed"
    );
    let holders = cluster.claim_holders().await;
    assert_eq!(
        holders.len(),
        1,
        "the survivor holds everything: {holders:?}"
    );
    for service in 0..20u64 {
        let committed = cluster
            .devnet
            .control()
            .committed(&format!("circuit::s{service:02}"));
        let unique: HashSet<&String> = committed.iter().collect();
        assert_eq!(
            unique.len(),
            15,
            "service {service}: every batch on the ledger once"
        );
    }
    b.stop().await;
}

/// The Sawtooth dialect end to end, with `max_in_flight = 20` per service: several batches
/// go in one BatchList POST, statuses of more than 15 ids are asked with Sawtooth's POST
/// `/batch_statuses`, and each service's batches still reach the (single) ledger in
/// acceptance order, once each.
async fn sawtooth_with_many_in_flight_per_service(backend: TestBackend) {
    let cluster = Cluster::sawtooth(backend).await;
    cluster.set_commit_latency("200ms");
    let mut accepted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for service in 0..3u64 {
        let id = format!("s{service}");
        accepted.insert(
            id.clone(),
            cluster.enqueue(&id, service * 1_000, 40, &[]).await,
        );
    }
    cluster
        .store
        .execute_for_tests("UPDATE services SET max_in_flight = 20")
        .await;
    let mut a = cluster.start_instance();
    cluster.wait_until_final(Duration::from_secs(60)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 120);

    let ledger = cluster
        .devnet
        .control()
        .committed(dltsub_devnet::SAWTOOTH_LEDGER);
    assert_eq!(ledger.len(), 120, "every batch on the ledger once");
    assert_each_service_in_order(&ledger, &accepted);
    let posts = cluster.devnet.control().posts();
    let largest = posts
        .entries
        .iter()
        .map(|p| p.batch_ids.len())
        .max()
        .unwrap_or(0);
    assert!(
        largest > 15,
        "several batches per BatchList (largest POST: {largest})"
    );
    let accepted = accepted_posts_per_batch(&cluster);
    assert_eq!(accepted.len(), 120);
    assert!(
        accepted.values().all(|n| *n == 1),
        "a batch was accepted twice"
    );
    a.stop().await;
}

/// SIGTERM under load: the stopping instance finishes within its drain bound, loses
/// nothing, and the other instance takes the released services over on its next tick —
/// seconds before the fast expiry would have let it.
async fn graceful_stop_hands_services_over_at_once(backend: TestBackend) {
    let mut cluster = Cluster::scabbard(backend).await;
    cluster.set_commit_latency("50ms");
    cluster.set("fast_expiry", "8s");
    cluster.set("slow_expiry", "24s");
    cluster.set("renew_interval", "1s");
    for service in 0..10u64 {
        cluster
            .enqueue(&format!("circuit::s{service}"), service * 100, 30, &[])
            .await;
    }
    let mut a = cluster.start_instance();
    let mut b = cluster.start_instance();
    wait_for(Duration::from_secs(30), || async {
        cluster.claim_holders().await.len() == 2
    })
    .await
    .expect("both instances hold services");
    assert!(
        cluster.count_status("COMMITTED").await < 250,
        "the stop comes under load"
    );

    let stopping = std::time::Instant::now();
    a.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(6),
        "stopped within the drain bound"
    );
    let released = std::time::Instant::now();
    wait_for(Duration::from_secs(30), || async {
        cluster.unclaimed_services().await == 0 && cluster.claim_holders().await.len() == 1
    })
    .await
    .expect("the survivor takes every released service");
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "taken over on the next tick ({:?}), not after the 8 s fast expiry",
        released.elapsed()
    );
    cluster.wait_until_final(Duration::from_secs(120)).await;
    assert_eq!(cluster.count_status("COMMITTED").await, 300);
    assert!(accepted_posts_per_batch(&cluster).values().all(|n| *n == 1));
    b.stop().await;
}

backend_tests!(
    graceful_stop_hands_services_over_at_once,
    sawtooth_with_many_in_flight_per_service,
    two_instances_commit_everything_in_order_once,
    invalid_batch_is_recorded_and_the_service_goes_on,
    back_pressure_storm_loses_nothing,
    lost_response_is_resolved_without_resubmitting,
    forgotten_batches_are_resubmitted_after_the_grace,
    abrupt_stop_is_taken_over,
);
