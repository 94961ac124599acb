//! The claim protocol on both backends (`postgres::…`, `sqlite::…`). Time moves by
//! advancing the database clock shared by every instance of a test, never by sleeping.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use dltsub_queuer::{Queuer, QueuerConfig};
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{HeldClaim, InstanceInfo, NewBatch, Pin, Store, backend_tests};

const FAST: Duration = Duration::from_secs(10);
const SLOW: Duration = Duration::from_secs(60);
const RENEW: Duration = Duration::from_secs(2);

fn instance(name: &str) -> InstanceInfo {
    InstanceInfo {
        instance_id: format!("{name}:1:00000000"),
        hostname: name.to_string(),
        pid: 1,
        version: "test".into(),
        capacity: 1,
        session_tag: None,
        labels: Vec::new(),
    }
}

fn queuer(store: &Store, name: &str) -> Queuer {
    Queuer::new(
        store.clone(),
        instance(name),
        QueuerConfig::from_timings(FAST, SLOW, RENEW),
    )
}

fn batch(n: u64) -> NewBatch {
    NewBatch {
        batch_id: format!("{n:0128x}"),
        serialized_batch: format!("batch {n}").into_bytes(),
    }
}

/// Creates `count` services with one queued batch each; returns their ids.
async fn services(store: &Store, count: u64) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..count {
        let service = format!("svc-{n:05}");
        store.enqueue(&service, &[batch(n)]).await.unwrap();
        ids.push(service);
    }
    ids
}

/// service → (claimant, epoch), as the database says.
async fn claim_table(store: &Store) -> BTreeMap<String, (Option<String>, i64)> {
    store
        .claims()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.service_id, (c.claimant, c.epoch)))
        .collect()
}

/// Marks the service's first batch SUBMITTING under `holder`'s claim (a POST in flight).
async fn start_submission(holder: &Queuer, service: &str) {
    let epoch = holder.current().epochs[service];
    let seqs: Vec<i64> = holder
        .handle()
        .select_submittable(10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|b| b.service_id == service)
        .map(|b| b.seq)
        .collect();
    assert_eq!(seqs.len(), 1, "one submittable batch of {service}");
    let claim = HeldClaim {
        service_id: service.to_string(),
        epoch,
    };
    let outcome = holder
        .handle()
        .mark_submitting(&[(claim, seqs.clone())])
        .await
        .unwrap();
    assert_eq!(outcome.applied, seqs);
}

/// Acquire takes unclaimed services at epoch 1; renewal keeps epochs; a graceful release
/// lets another instance take everything on its next tick, at epoch 2, without waiting.
async fn acquire_renew_release(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let ids = services(&store, 5).await;
    let mut a = queuer(&store, "a");
    let report = a.tick().await.unwrap();
    assert_eq!(report.acquired.len(), 5);
    assert!(report.acquired.iter().all(|c| c.epoch == 1));
    let before = claim_table(&store).await;
    database
        .options
        .clock_offset
        .advance(Duration::from_secs(1));
    let report = a.tick().await.unwrap();
    assert!(report.acquired.is_empty());
    assert_eq!(report.held, 5);
    assert_eq!(
        claim_table(&store).await,
        before,
        "renewal changes no claimant or epoch"
    );
    let expiry_before = store.claims().await.unwrap()[0].fast_expiry_us;
    database
        .options
        .clock_offset
        .advance(Duration::from_secs(1));
    a.tick().await.unwrap();
    assert!(
        store.claims().await.unwrap()[0].fast_expiry_us > expiry_before,
        "renewal extends"
    );

    let released = a.shutdown().await.unwrap();
    assert_eq!(released.len(), 5);
    let mut b = queuer(&store, "b");
    let report = b.tick().await.unwrap();
    assert_eq!(
        report.acquired.len(),
        5,
        "no waiting for expiry after a release"
    );
    for id in &ids {
        assert_eq!(
            claim_table(&store).await[id],
            (Some("b:1:00000000".into()), 2)
        );
    }
}

/// Past the fast expiry a silent holder's service moves only if nothing of it is
/// SUBMITTING; past the slow expiry it moves regardless. Each takeover bumps the epoch.
async fn fast_and_slow_path_takeover(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    services(&store, 2).await;
    let mut a = queuer(&store, "a");
    a.tick().await.unwrap();
    start_submission(&a, "svc-00000").await;

    let mut b = queuer(&store, "b");
    database.options.clock_offset.advance(FAST / 2);
    let report = b.tick().await.unwrap();
    assert!(
        report.acquired.is_empty(),
        "nothing is takeable before the fast expiry"
    );

    database.options.clock_offset.advance(FAST);
    let report = b.tick().await.unwrap();
    assert_eq!(
        report.acquired,
        vec![HeldClaim {
            service_id: "svc-00001".into(),
            epoch: 2
        }],
        "fast path: only the idle service"
    );
    let claims = claim_table(&store).await;
    assert_eq!(
        claims["svc-00000"],
        (Some("a:1:00000000".into()), 1),
        "mid-submission stays"
    );

    database.options.clock_offset.advance(SLOW);
    let report = b.tick().await.unwrap();
    assert_eq!(
        report.acquired,
        vec![HeldClaim {
            service_id: "svc-00000".into(),
            epoch: 2
        }],
        "slow path: taken regardless"
    );

    // The old holder learns it on its next tick and stops.
    let report = a.tick().await.unwrap();
    assert_eq!(report.lost.len(), 2);
    assert!(a.current().is_empty());
}

/// A holder that dies with a batch mid-submission loses its service at the fast expiry,
/// not the slow one — but only once its process is really gone: while it lives (its
/// PostgreSQL sessions open, its process present on this host) the service waits.
async fn gone_holder_loses_its_services_at_the_fast_expiry(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    services(&store, 2).await;

    // Holder `a` as `dltsub run` makes it: a session tag on its sessions, and a process
    // on this host (a child standing in for it, so the test can kill it).
    let mut process = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let pid = process.id();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let me = InstanceInfo {
        instance_id: format!("{hostname}:{pid}:aaaaaaaa"),
        hostname: hostname.clone(),
        pid: i64::from(pid),
        version: "test".into(),
        capacity: 1,
        session_tag: Some(format!("dltsub:{pid}:aaaaaaaa")),
        labels: Vec::new(),
    };
    let mut options = database.options.clone();
    options.application_name = me.session_tag.clone();
    let a_store = Store::connect(&options).await.unwrap();
    let mut a = Queuer::new(
        a_store.clone(),
        me.clone(),
        QueuerConfig::from_timings(FAST, SLOW, RENEW),
    );
    a.tick().await.unwrap();
    start_submission(&a, "svc-00000").await;
    let claim_of_svc0 = |claims: Vec<dltsub_store::ClaimRecord>| {
        claims
            .into_iter()
            .find(|c| c.service_id == "svc-00000")
            .unwrap()
    };
    let held_by_a = claim_of_svc0(store.claims().await.unwrap());

    let mut b = Queuer::new(
        store.clone(),
        InstanceInfo {
            instance_id: format!("{hostname}:1:bbbbbbbb"),
            hostname,
            pid: 1,
            version: "test".into(),
            capacity: 1,
            session_tag: Some("dltsub:1:bbbbbbbb".into()),
            labels: Vec::new(),
        },
        QueuerConfig::from_timings(FAST, SLOW, RENEW),
    );
    database.options.clock_offset.advance(FAST + RENEW);
    let report = b.tick().await.unwrap();
    assert_eq!(
        report.acquired,
        vec![HeldClaim {
            service_id: "svc-00001".into(),
            epoch: 2
        }],
        "a live holder keeps its service mid-submission past the fast expiry"
    );
    assert!(report.gone_holders.is_empty());

    // `a` dies: its process ends and its sessions close.
    process.kill().unwrap();
    process.wait().unwrap();
    drop(a);
    drop(a_store);
    // PostgreSQL ends a closed session's backend soon, not at once: tick until it has.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let report = loop {
        let report = b.tick().await.unwrap();
        if !report.acquired.is_empty() || std::time::Instant::now() > deadline {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        report.acquired,
        vec![HeldClaim {
            service_id: "svc-00000".into(),
            epoch: 2
        }],
        "a gone holder's service moves before its slow expiry"
    );
    assert_eq!(report.gone_holders, vec![me.instance_id.clone()]);
    assert_eq!(
        report.in_doubt.len(),
        1,
        "its SUBMITTING batch turns IN_DOUBT"
    );
    let taken = claim_of_svc0(store.claims().await.unwrap());
    assert!(
        taken.claimed_at_us.unwrap() < held_by_a.slow_expiry_us,
        "taken before a's slow expiry"
    );
}

/// A write fenced with a stale epoch changes nothing and reports the claim lost; so does
/// one by the right holder once its fast expiry has passed.
async fn stale_epoch_write_is_refused(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    services(&store, 1).await;
    let mut a = queuer(&store, "a");
    a.tick().await.unwrap();
    let stale = HeldClaim {
        service_id: "svc-00000".into(),
        epoch: 1,
    };
    let seq = a.handle().select_submittable(10).await.unwrap()[0].seq;

    database.options.clock_offset.advance(SLOW + FAST);
    let mut b = queuer(&store, "b");
    assert_eq!(b.tick().await.unwrap().acquired.len(), 1);
    let events_before = store.count_rows_for_tests("batch_events").await;

    let outcome = store
        .mark_submitting("a:1:00000000", &[(stale.clone(), vec![seq])])
        .await
        .unwrap();
    assert!(outcome.applied.is_empty());
    assert_eq!(outcome.lost, vec![stale]);
    assert_eq!(
        store
            .scalar_i64_for_tests("(SELECT COUNT(*) FROM batch_statuses WHERE status = 'QUEUED')")
            .await,
        1
    );
    assert_eq!(
        store.count_rows_for_tests("batch_events").await,
        events_before
    );

    // The rightful holder, but past its fast expiry: refused too.
    database.options.clock_offset.advance(FAST);
    let current = HeldClaim {
        service_id: "svc-00000".into(),
        epoch: 2,
    };
    let outcome = store
        .mark_submitting("b:1:00000000", &[(current.clone(), vec![seq])])
        .await
        .unwrap();
    assert_eq!(outcome.lost, vec![current]);
    assert!(outcome.applied.is_empty());
}

/// 3 instances tick concurrently over 1,000 services for 50 rounds, while instances
/// stall (skip ticks) and time jumps past expiries. After every round no service is held
/// by two instances that just ticked, and every service's epoch only grows.
async fn concurrent_ticks_never_share_a_service(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let ids: Vec<String> = (0..1_000).map(|n| format!("svc-{n:05}")).collect();
    for chunk in ids.chunks(100) {
        for (n, id) in chunk.iter().enumerate() {
            store.enqueue(id, &[batch(n as u64)]).await.unwrap();
        }
    }
    // Each instance with a pool of its own, as separate processes would have.
    let mut queuers: Vec<Queuer> = Vec::new();
    for name in ["a", "b", "c"] {
        queuers.push(queuer(&database.store().await, name));
    }
    let mut last_epochs: HashMap<String, i64> = HashMap::new();
    let mut takeovers = 0;
    for round in 0..50u64 {
        // Instance `round % 3` stalls for rounds 10..15 and 30..35; time jumps past the
        // slow expiry during those stalls so its claims are taken.
        let stalled = ((10..15).contains(&round) || (30..35).contains(&round))
            .then_some((round / 20) as usize % 3);
        let ticking: Vec<usize> = (0..3).filter(|i| Some(*i) != stalled).collect();
        let ticks = queuers
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| ticking.contains(i))
            .map(|(_, q)| q.tick());
        for result in futures::future::join_all(ticks).await {
            result.expect("tick");
        }
        let mut owner: HashMap<String, usize> = HashMap::new();
        for i in &ticking {
            for service in queuers[*i].current().epochs.keys() {
                if let Some(other) = owner.insert(service.clone(), *i) {
                    panic!("round {round}: {service} held by instances {other} and {i}");
                }
            }
        }
        for (service, (_, epoch)) in claim_table(&store).await {
            let last = last_epochs.insert(service.clone(), epoch).unwrap_or(0);
            assert!(epoch >= last, "round {round}: epoch of {service} went back");
            if epoch > last && last > 0 {
                takeovers += 1;
            }
        }
        let jump = if stalled.is_some() { SLOW / 4 } else { RENEW };
        database.options.clock_offset.advance(jump);
    }
    assert!(
        takeovers > 0,
        "the stalls caused takeovers, so the race was exercised"
    );
    let held: usize = queuers.iter().map(|q| q.current().len()).sum();
    assert_eq!(held, 1_000, "every service ends up held");
}

/// 3 instances and 300 services converge to 100 ± 1 each within 5 rounds; a 4th joins
/// and all converge to 75 ± 1 within 5 more, without moving any claim that has a batch
/// mid-submission.
async fn fair_share_converges_and_rebalances(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    services(&store, 300).await;
    let mut queuers: Vec<Queuer> = ["a", "b", "c"].iter().map(|n| queuer(&store, n)).collect();
    // Everyone registers first, as instances started together do.
    for q in &mut queuers {
        q.tick().await.unwrap();
    }
    for _ in 0..4 {
        for q in &mut queuers {
            q.tick().await.unwrap();
        }
        database.options.clock_offset.advance(RENEW);
    }
    let counts: Vec<usize> = queuers.iter().map(|q| q.current().len()).collect();
    assert!(
        counts.iter().all(|c| (99..=101).contains(c)),
        "3 instances: {counts:?}"
    );

    // Three services of each instance get a batch mid-submission.
    let mut busy: BTreeMap<String, (Option<String>, i64)> = BTreeMap::new();
    for q in &queuers {
        let services: Vec<String> = q.current().epochs.keys().take(3).cloned().collect();
        for service in services {
            start_submission(q, &service).await;
            busy.insert(service, (None, 0));
        }
    }
    let table = claim_table(&store).await;
    for (service, state) in busy.iter_mut() {
        *state = table[service].clone();
    }

    queuers.push(queuer(&store, "d"));
    for _ in 0..5 {
        for q in &mut queuers {
            q.tick().await.unwrap();
        }
        database.options.clock_offset.advance(RENEW);
    }
    let counts: Vec<usize> = queuers.iter().map(|q| q.current().len()).collect();
    assert!(
        counts.iter().all(|c| (74..=76).contains(c)),
        "4 instances: {counts:?}"
    );
    assert_eq!(counts.iter().sum::<usize>(), 300);
    let table = claim_table(&store).await;
    for (service, state) in &busy {
        assert_eq!(
            &table[service], state,
            "{service} was mid-submission and must not move"
        );
    }
}

/// One leader at a time; the lease moves after it expires, with a new epoch; a silent
/// instance is pruned by the leader's chores.
async fn leader_lease_and_pruning(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let mut a = queuer(&store, "a");
    let mut b = queuer(&store, "b");
    assert!(a.tick().await.unwrap().leader);
    assert!(!b.tick().await.unwrap().leader);
    assert_eq!(
        store
            .try_lease("leader", "a:1:00000000", FAST)
            .await
            .unwrap(),
        Some(1)
    );

    // a falls silent: after its lease expires b leads, and later prunes a.
    database.options.clock_offset.advance(SLOW * 2);
    let report = b.tick().await.unwrap();
    assert!(report.leader);
    assert_eq!(
        store
            .try_lease("leader", "b:1:00000000", FAST)
            .await
            .unwrap(),
        Some(2)
    );
    for _ in 0..10 {
        b.tick().await.unwrap();
    }
    let ids: Vec<String> = store
        .instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.instance_id)
        .collect();
    assert_eq!(ids, vec!["b:1:00000000".to_string()], "a was pruned");
}

/// Selection: only held services, not paused, in seq order, within max_in_flight.
async fn selection_follows_order_and_limits(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    store
        .enqueue("one", &[batch(1), batch(2), batch(3)])
        .await
        .unwrap();
    store.enqueue("other", &[batch(4)]).await.unwrap();
    let mut a = queuer(&store, "a");
    a.tick().await.unwrap();
    let selected = a.handle().select_submittable(100).await.unwrap();
    let ids: Vec<(&str, String)> = selected
        .iter()
        .map(|b| (b.service_id.as_str(), b.batch_id.clone()))
        .collect();
    assert_eq!(
        ids,
        vec![("one", batch(1).batch_id), ("other", batch(4).batch_id)]
    );
    assert_eq!(
        a.handle().select_submittable(1).await.unwrap().len(),
        1,
        "instance limit"
    );

    // With the first batch of "one" in flight, nothing more of "one" is submittable.
    start_submission(&a, "one").await;
    let selected: Vec<String> = a
        .handle()
        .select_submittable(100)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.service_id)
        .collect();
    assert_eq!(selected, vec!["other".to_string()]);

    // Another instance holds nothing and selects nothing.
    let b = queuer(&store, "b");
    assert!(b.handle().select_submittable(100).await.unwrap().is_empty());
}

/// A steady tick sends the same number of statements with 10 services as with 500: the
/// claim protocol works on sets, never row by row.
async fn statements_per_tick_do_not_grow_with_services(backend: TestBackend) {
    let mut per_tick = Vec::new();
    for count in [10, 500] {
        let database = TestDatabase::migrated(backend).await;
        let store = database.store().await;
        services(&store, count).await;
        let mut a = queuer(&store, "a");
        a.tick().await.unwrap();
        let before = store.round_trips();
        let report = a.tick().await.unwrap();
        per_tick.push(store.round_trips() - before);
        assert_eq!(report.held, count as usize);
    }
    assert_eq!(
        per_tick[0], per_tick[1],
        "round trips per tick: {per_tick:?}"
    );
    assert!(
        per_tick[0] <= 8,
        "one transaction of a few statements: {per_tick:?}"
    );
}

/// Pinning: services pinned to "gpu" go only to the instance labelled gpu, services
/// excluding "gpu" only to the other, unpinned ones are shared evenly by both, and a
/// service pinned to a label nobody has stays unclaimed and is counted unserved. A new pin
/// moves a service at the holder's next tick; an instance with the label picks up the
/// unserved one. Fair share is per group, so the steady state never thrashes.
async fn pinned_services_follow_labels(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    let pin = |pin: Option<&str>, exclude: Option<&str>| Pin {
        pin_label: pin.map(Into::into),
        exclude_label: exclude.map(Into::into),
    };
    let ids = services(&store, 13).await;
    // svc 0-5 unpinned, 6-9 pinned to gpu, 10-11 excluding gpu, 12 pinned to arm.
    for id in &ids[6..10] {
        assert!(
            store
                .set_service_pin(id, &pin(Some("gpu"), None))
                .await
                .unwrap()
        );
    }
    for id in &ids[10..12] {
        assert!(
            store
                .set_service_pin(id, &pin(None, Some("gpu")))
                .await
                .unwrap()
        );
    }
    assert!(
        store
            .set_service_pin(&ids[12], &pin(Some("arm"), None))
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_service_pin("nope", &Pin::default())
            .await
            .unwrap()
    );
    assert!(
        store
            .set_service_pin(&ids[0], &pin(Some("gpu"), Some("gpu")))
            .await
            .is_err(),
        "pinned to the label it excludes"
    );

    let labelled = |name: &str, labels: &[&str]| {
        let mut me = instance(name);
        me.labels = labels.iter().map(ToString::to_string).collect();
        Queuer::new(
            store.clone(),
            me,
            QueuerConfig::from_timings(FAST, SLOW, RENEW),
        )
    };
    let mut a = labelled("a", &["gpu", "eu"]);
    let mut b = labelled("b", &["eu"]);
    for _ in 0..3 {
        a.tick().await.unwrap();
        b.tick().await.unwrap();
        database
            .options
            .clock_offset
            .advance(Duration::from_secs(1));
    }
    let holders = |claims: &BTreeMap<String, (Option<String>, i64)>,
                   range: std::ops::Range<usize>| {
        ids[range]
            .iter()
            .map(|id| claims[id].0.clone())
            .collect::<Vec<_>>()
    };
    let a_id = Some("a:1:00000000".to_string());
    let b_id = Some("b:1:00000000".to_string());
    let claims = claim_table(&store).await;
    assert_eq!(
        holders(&claims, 6..10),
        vec![a_id.clone(); 4],
        "pinned to gpu"
    );
    assert_eq!(
        holders(&claims, 10..12),
        vec![b_id.clone(); 2],
        "excluding gpu"
    );
    assert_eq!(
        holders(&claims, 12..13),
        vec![None],
        "pinned to a label nobody has"
    );
    let unpinned = holders(&claims, 0..6);
    assert_eq!(
        unpinned.iter().filter(|h| **h == a_id).count(),
        3,
        "unpinned services shared evenly: {unpinned:?}"
    );
    assert_eq!(unpinned.iter().filter(|h| **h == b_id).count(), 3);
    assert_eq!(store.unserved_services(RENEW * 3).await.unwrap(), 1);

    // Steady: another round changes nothing.
    let report_a = a.tick().await.unwrap();
    let report_b = b.tick().await.unwrap();
    assert!(report_a.acquired.is_empty() && report_a.released.is_empty());
    assert!(report_b.acquired.is_empty() && report_b.released.is_empty());

    // Re-pin a gpu service away from gpu: a hands it over, b takes it.
    store
        .set_service_pin(&ids[6], &pin(None, Some("gpu")))
        .await
        .unwrap();
    let report = a.tick().await.unwrap();
    assert_eq!(report.released, vec![ids[6].clone()]);
    let report = b.tick().await.unwrap();
    assert_eq!(report.acquired.len(), 1);
    assert_eq!(report.acquired[0].service_id, ids[6]);

    // An instance labelled arm joins: the unserved service is served.
    let mut c = labelled("c", &["arm"]);
    let report = c.tick().await.unwrap();
    assert!(
        report
            .acquired
            .iter()
            .any(|claim| claim.service_id == ids[12]),
        "{report:?}"
    );
    assert_eq!(store.unserved_services(RENEW * 3).await.unwrap(), 0);

    // The arm instance goes silent: the service is unserved again once it is stale.
    database.options.clock_offset.advance(RENEW * 4);
    a.tick().await.unwrap();
    b.tick().await.unwrap();
    assert_eq!(store.unserved_services(RENEW * 3).await.unwrap(), 1);
}

backend_tests!(
    statements_per_tick_do_not_grow_with_services,
    pinned_services_follow_labels,
    acquire_renew_release,
    fast_and_slow_path_takeover,
    gone_holder_loses_its_services_at_the_fast_expiry,
    stale_epoch_write_is_refused,
    concurrent_ticks_never_share_a_service,
    fair_share_converges_and_rebalances,
    leader_lease_and_pruning,
    selection_follows_order_and_limits,
);
