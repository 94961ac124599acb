//! The console's JSON on both backends: it needs the token like `/api/v1/claims`, its
//! service list is paged and filtered in the database, and with 10,000 services a page
//! stays small and fast (the figures are printed: response time and size per query).

mod support;

use std::time::{Duration, Instant};

use dltsub_store::testing::TestBackend;
use dltsub_store::{NewBatch, Pin, backend_tests};
use support::{Api, TOKEN, api};

const SERVICES: u64 = 10_000;
const WRITERS: u64 = 8;

fn service_id(n: u64) -> String {
    format!("scale::svc{n:05}")
}

/// Creates the services, one batch each, from several writers at once.
async fn create_services(api: &Api) {
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = api.store.clone();
            tokio::spawn(async move {
                for n in (writer..SERVICES).step_by(WRITERS as usize) {
                    let batch = NewBatch {
                        batch_id: format!("{n:0128x}"),
                        serialized_batch: vec![n as u8],
                    };
                    store.enqueue(&service_id(n), &[batch]).await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// Median time and the size of the answer of `GET path`, over five requests.
async fn measure(api: &Api, path: &str) -> (Duration, usize, serde_json::Value) {
    let mut times = Vec::new();
    let mut size = 0;
    let mut body = serde_json::Value::Null;
    for _ in 0..5 {
        let started = Instant::now();
        let response = api
            .http
            .get(format!("{}{path}", api.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let bytes = response.bytes().await.unwrap();
        times.push(started.elapsed());
        size = bytes.len();
        body = serde_json::from_slice(&bytes).unwrap();
    }
    times.sort();
    (times[2], size, body)
}

async fn console_pages_ten_thousand_services(backend: TestBackend) {
    let api = api(backend).await;
    let started = Instant::now();
    create_services(&api).await;
    let created = started.elapsed();
    for n in (0..SERVICES).step_by(100) {
        let pin = Pin {
            pin_label: Some("nobody".into()),
            exclude_label: None,
        };
        assert!(
            api.store
                .set_service_pin(&service_id(n), &pin)
                .await
                .unwrap()
        );
    }
    api.store
        .set_service_paused(&service_id(42), true)
        .await
        .unwrap();

    // The JSON needs the token; the page itself does not.
    let (status, _) = api.get("/console/api/services").await;
    assert_eq!(status, 401);
    let page = api
        .http
        .get(format!("{}/console/", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("console.js"));

    // A thousand of them committed 50 ms after acceptance: the overview's series counts
    // them, first read whole, then from its cache plus the last two intervals.
    api.store
        .execute_for_tests(
            "INSERT INTO batch_events (seq, old_status, new_status, at_us) \
             SELECT seq, 'PENDING', 'COMMITTED', created_at_us + 50000 FROM batches \
              WHERE seq % 10 = 0",
        )
        .await;
    for _ in 0..2 {
        let (status, overview) = api.get_with_token("/console/api/overview").await;
        assert_eq!(status, 200);
        let series = overview["commits"]["series"].as_array().unwrap();
        let committed: i64 = series
            .iter()
            .map(|b| b["committed"].as_i64().unwrap())
            .sum();
        assert_eq!(committed, 1_000, "{series:?}");
        for bucket in series {
            assert!((bucket["latency_mean_ms"].as_f64().unwrap() - 50.0).abs() < 0.01);
        }
    }

    let queries = [
        ("first page of 50", "/console/api/services?limit=50"),
        (
            "last page of 50",
            "/console/api/services?offset=9950&limit=50",
        ),
        ("page of 500", "/console/api/services?limit=500"),
        ("id filter", "/console/api/services?q=svc0999&limit=50"),
        ("paused filter", "/console/api/services?only=paused"),
        (
            "unserved filter",
            "/console/api/services?only=unserved&limit=50",
        ),
        (
            "backlog filter",
            "/console/api/services?only=backlog&limit=50",
        ),
        ("one service", "/console/api/services/scale::svc05000"),
        ("overview", "/console/api/overview"),
    ];
    let mut figures = Vec::new();
    for (what, path) in queries {
        let (time, size, body) = measure(&api, path).await;
        figures.push(format!(
            "{what}: {:.1} ms, {size} bytes",
            time.as_secs_f64() * 1e3
        ));
        match what {
            "first page of 50" => {
                assert_eq!(body["total"], SERVICES);
                assert_eq!(body["services"].as_array().unwrap().len(), 50);
                assert_eq!(body["services"][0]["service_id"], "scale::svc00000");
                assert_eq!(body["services"][0]["counts"]["QUEUED"], 1);
            }
            "last page of 50" => {
                assert_eq!(body["services"][49]["service_id"], "scale::svc09999")
            }
            "id filter" => assert_eq!(body["total"], 10, "svc09990..svc09999"),
            "paused filter" => {
                assert_eq!(body["total"], 1);
                assert_eq!(body["services"][0]["service_id"], "scale::svc00042");
            }
            "unserved filter" => assert_eq!(body["total"], SERVICES / 100),
            "backlog filter" => assert_eq!(body["total"], SERVICES),
            "overview" => {
                assert_eq!(body["totals"]["services"], SERVICES);
                assert_eq!(body["totals"]["unserved"], SERVICES / 100);
            }
            _ => {}
        }
        // A page is bounded by its size, not by the number of services.
        assert!(size < 512 * 1024, "{what}: {size} bytes");
        assert!(time < Duration::from_secs(2), "{what}: {time:?}");
    }
    eprintln!(
        "{backend:?}, {SERVICES} services (created in {:.1} s): {}",
        created.as_secs_f64(),
        figures.join("; ")
    );

    let (status, body) = api.get_with_token("/console/api/services?limit=501").await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = api
        .get_with_token("/console/api/services?only=nonsense")
        .await;
    assert_eq!(status, 400);
    let (status, _) = api.get_with_token("/console/api/services/nope").await;
    assert_eq!(status, 404);
}

impl Api {
    async fn get_with_token(&self, path: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::GET, path, Some(TOKEN), None)
            .await
    }
}

backend_tests!(console_pages_ten_thousand_services);
