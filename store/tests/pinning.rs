//! Pinning in the store on both backends: the tick reports the pin groups, acquisition and
//! release stay inside the group a plan names, instances' labels are registered, and the
//! unserved count follows the live instances' labels on the database clock.

use std::time::Duration;

use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_store::{
    ClaimTiming, GroupPlan, InstanceInfo, InstanceState, NewBatch, Pin, ServiceGroup, Store,
    StoreError, TickPlan, backend_tests,
};

const TIMING: ClaimTiming = ClaimTiming {
    fast_expiry: Duration::from_secs(10),
    slow_expiry: Duration::from_secs(60),
    instance_stale_after: Duration::from_secs(6),
};

fn me(name: &str, labels: &[&str]) -> InstanceInfo {
    InstanceInfo {
        instance_id: format!("{name}:1:00000000"),
        hostname: name.into(),
        pid: 1,
        version: "test".into(),
        capacity: 1,
        session_tag: None,
        labels: labels.iter().map(ToString::to_string).collect(),
    }
}

fn pin(pin: Option<&str>, exclude: Option<&str>) -> Pin {
    Pin {
        pin_label: pin.map(Into::into),
        exclude_label: exclude.map(Into::into),
    }
}

async fn service(store: &Store, id: &str, n: u64, with: Pin) {
    store
        .enqueue(
            id,
            &[NewBatch {
                batch_id: format!("{n:0128x}"),
                serialized_batch: vec![n as u8],
            }],
        )
        .await
        .unwrap();
    assert!(store.set_service_pin(id, &with).await.unwrap());
}

/// The tick sees each group with its size and my holdings, and a plan for one group
/// acquires and releases only that group's services.
async fn tick_acquires_and_releases_within_a_group(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    for n in 0..3 {
        service(&store, &format!("free-{n}"), n, Pin::default()).await;
    }
    for n in 0..2 {
        service(&store, &format!("gpu-{n}"), 10 + n, pin(Some("gpu"), None)).await;
    }
    let gpu = pin(Some("gpu"), None);
    let plan_gpu = gpu.clone();
    let outcome = store
        .claim_tick(
            &me("a", &["gpu"]),
            InstanceState::Running,
            TIMING,
            move |view| {
                let mut groups: Vec<ServiceGroup> = view.groups.to_vec();
                groups.sort_by(|x, y| x.pin.cmp(&y.pin));
                assert_eq!(
                    groups,
                    vec![
                        ServiceGroup {
                            pin: Pin::default(),
                            services: 3,
                            held: 0
                        },
                        ServiceGroup {
                            pin: plan_gpu.clone(),
                            services: 2,
                            held: 0
                        },
                    ]
                );
                assert_eq!(view.claimable_services, 5);
                assert_eq!(view.live[0].labels, vec!["gpu".to_string()]);
                TickPlan {
                    groups: vec![GroupPlan {
                        pin: plan_gpu,
                        acquire: 100,
                        ..GroupPlan::default()
                    }],
                }
            },
        )
        .await
        .unwrap();
    let acquired: Vec<&str> = outcome
        .acquired
        .iter()
        .map(|c| c.service_id.as_str())
        .collect();
    assert_eq!(acquired, vec!["gpu-0", "gpu-1"], "only the planned group");

    // Releasing in the unpinned group releases nothing of the gpu group.
    let outcome = store
        .claim_tick(&me("a", &["gpu"]), InstanceState::Running, TIMING, |view| {
            let held: i64 = view.groups.iter().map(|g| g.held).sum();
            assert_eq!(held, 2);
            TickPlan {
                groups: vec![GroupPlan {
                    release: 5,
                    ..GroupPlan::default()
                }],
            }
        })
        .await
        .unwrap();
    assert!(outcome.released.is_empty());
    assert_eq!(outcome.held.len(), 2);
    let gpu_plan = gpu.clone();
    let outcome = store
        .claim_tick(
            &me("a", &["gpu"]),
            InstanceState::Running,
            TIMING,
            move |_| TickPlan {
                groups: vec![GroupPlan {
                    pin: gpu_plan,
                    release: 1,
                    ..GroupPlan::default()
                }],
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.released.len(), 1);
    assert_eq!(outcome.held.len(), 1);

    let instances = store.instances().await.unwrap();
    assert_eq!(instances[0].labels, "gpu");
}

/// Invalid pins are refused and write nothing.
async fn invalid_pins_are_refused(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    service(&store, "s", 1, Pin::default()).await;
    for bad in [
        pin(Some("GPU"), None),
        pin(Some("a%"), None),
        pin(None, Some("a,b")),
        pin(Some("x"), Some("x")),
    ] {
        let error = store.set_service_pin("s", &bad).await.unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput { .. }),
            "{bad:?}: {error}"
        );
    }
    // LIKE wildcards cannot reach the database: "g_u" would match "gpu".
    assert!(!dltsub_store::is_label("g_u"));
}

/// Unserved: pinned or excluding services that no live instance may hold.
async fn unserved_follows_live_labels(backend: TestBackend) {
    let database = TestDatabase::migrated(backend).await;
    let store = database.store().await;
    service(&store, "free", 1, Pin::default()).await;
    service(&store, "gpu", 2, pin(Some("gpu"), None)).await;
    service(&store, "not-gpu", 3, pin(None, Some("gpu"))).await;
    service(&store, "arm", 4, pin(Some("arm"), None)).await;
    // No instance at all: every restricted service is unserved (the unpinned one is not
    // counted: it is the unclaimed gauge's business).
    assert_eq!(
        store
            .unserved_services(TIMING.instance_stale_after)
            .await
            .unwrap(),
        3
    );

    let register = |name: &'static str, labels: &'static [&'static str]| {
        let store = store.clone();
        async move {
            store
                .claim_tick(&me(name, labels), InstanceState::Running, TIMING, |_| {
                    TickPlan::default()
                })
                .await
                .unwrap();
        }
    };
    register("a", &["gpu"]).await;
    assert_eq!(
        store
            .unserved_services(TIMING.instance_stale_after)
            .await
            .unwrap(),
        2,
        "not-gpu and arm"
    );
    // A label that merely contains another is not it: "arm64" does not serve "arm".
    register("b", &["arm64"]).await;
    assert_eq!(
        store
            .unserved_services(TIMING.instance_stale_after)
            .await
            .unwrap(),
        1,
        "arm"
    );
    // Once both are silent past the stale threshold, everything restricted is unserved.
    let later = store.with_clock_offset(Duration::from_secs(7));
    assert_eq!(
        later
            .unserved_services(TIMING.instance_stale_after)
            .await
            .unwrap(),
        3
    );
}

backend_tests!(
    tick_acquires_and_releases_within_a_group,
    invalid_pins_are_refused,
    unserved_follows_live_labels,
);
