//! Fault knobs, control and inspection routes, the seed, shutdown, and the benchmark; each
//! for both dialects where the dialects differ.

use std::time::{Duration, Instant};

use dltsub_devnet::{
    DevnetBenchArgs, DevnetConfig, Dialect, Latency, SAWTOOTH_LEDGER, run_bench, serve,
};
use serde_json::json;

use crate::harness::*;

const DIALECTS: [Dialect; 2] = [Dialect::Scabbard, Dialect::Sawtooth];

fn ledger_of(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Scabbard => LEDGER,
        Dialect::Sawtooth => SAWTOOTH_LEDGER,
    }
}

#[tokio::test]
async fn errors_before_accepting_accept_nothing() {
    for dialect in DIALECTS {
        let net = start(dialect, |c| c.faults.error_500_before = 1.0).await;
        let answer = net.post_ids(&ids(0, 2)).await;
        assert_eq!(answer.status, 500, "{dialect}");
        match dialect {
            Dialect::Scabbard => assert_eq!(
                answer.json(),
                json!({"code": "500", "message": "The server encountered an error"})
            ),
            Dialect::Sawtooth => assert_eq!(answer.json()["error"]["code"], 10),
        }
        net.put_faults(json!({"error_500_before": 0.0, "error_503_before": 1.0}))
            .await;
        let answer = net.post_ids(&ids(0, 2)).await;
        assert_eq!(answer.status, 503, "{dialect}");
        if dialect == Dialect::Sawtooth {
            assert_eq!(answer.json()["error"]["code"], 18);
        }
        let stats = net.stats().await;
        assert_eq!(stats.ledgers[ledger_of(dialect)].accepted, 0);
        let faults: Vec<_> = net
            .posts()
            .await
            .entries
            .into_iter()
            .map(|p| p.fault)
            .collect();
        assert_eq!(
            faults,
            vec![
                Some("error_500_before".into()),
                Some("error_503_before".into())
            ]
        );
    }
}

#[tokio::test]
async fn a_500_after_commit_comes_once_the_batches_are_in_the_ledger() {
    for dialect in DIALECTS {
        let net = start(dialect, |c| {
            c.faults.error_500_after_commit = 1.0;
            c.faults.commit_latency = Latency::fixed(Duration::from_millis(200));
        })
        .await;
        let two = ids(0, 2);
        let answer = net.post_ids(&two).await;
        assert_eq!(answer.status, 500, "{dialect}");
        // No waiting here: they are committed already.
        assert_eq!(net.committed(ledger_of(dialect)).await, two, "{dialect}");
    }
}

#[tokio::test]
async fn drop_after_commit_closes_the_connection_without_a_response() {
    for dialect in DIALECTS {
        let net = start(dialect, |c| c.faults.drop_after_commit = 1.0).await;
        let two = ids(0, 2);
        let url = match dialect {
            Dialect::Scabbard => format!("{}/batches", net.devnet.scabbard_url(CIRCUIT, SERVICE)),
            Dialect::Sawtooth => net.url("/batches"),
        };
        let result = net
            .http
            .post(url)
            .header("content-type", "application/octet-stream")
            .body(body(&two))
            .send()
            .await;
        let err = result.expect_err("a dropped connection is not a response");
        assert!(!err.is_timeout(), "{dialect}: {err:?}");
        assert_eq!(net.committed(ledger_of(dialect)).await, two, "{dialect}");
        let post = net.posts().await.entries.remove(0);
        assert_eq!(post.status, None);
        assert_eq!(post.fault.as_deref(), Some("drop_after_commit"));
        // The node keeps serving other connections.
        net.put_faults(json!({"drop_after_commit": 0.0})).await;
        assert_eq!(net.post_ids(&ids(5, 6)).await.status, 202);
    }
}

#[tokio::test]
async fn a_pause_holds_requests_and_commits_until_lifted() {
    for dialect in DIALECTS {
        let net = start(dialect, |_| {}).await;
        let first = ids(0, 1);
        assert_eq!(net.post_ids(&first).await.status, 202);
        net.settle(&first).await;
        assert_eq!(net.put_faults(json!({"paused": true})).await.status, 200);
        let held = tokio::time::timeout(Duration::from_millis(400), net.post_ids(&ids(1, 2))).await;
        assert!(held.is_err(), "{dialect}: a paused node answered");
        // Control routes keep working while paused; nothing commits.
        assert_eq!(net.get("/_devnet/faults").await.json()["paused"], true);
        let third = ids(2, 3);
        let post = net.post_ids(&third);
        let resume = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            net.put_faults(json!({"paused": false})).await
        };
        let (answer, resumed) = tokio::join!(post, resume);
        assert_eq!(resumed.status, 200);
        assert_eq!(answer.status, 202, "{dialect}");
        net.settle(&ids(2, 3)).await;
        assert_eq!(net.committed(ledger_of(dialect)).await, vec![id(0), id(2)]);
    }
}

#[tokio::test]
async fn a_pause_stops_commits() {
    let net = start(Dialect::Scabbard, |c| {
        c.faults.commit_latency = Latency::fixed(Duration::from_millis(100));
    })
    .await;
    assert_eq!(net.post_ids(&ids(0, 1)).await.status, 202);
    net.devnet.control().pause();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(net.committed(LEDGER).await.is_empty());
    net.devnet.control().resume();
    net.settle(&ids(0, 1)).await;
    assert_eq!(net.committed(LEDGER).await, ids(0, 1));
}

#[tokio::test]
async fn response_latency_delays_every_ledger_answer() {
    for dialect in DIALECTS {
        let net = start(dialect, |_| {}).await;
        let set = net
            .put_faults(json!({"response_latency": "300ms..400ms"}))
            .await;
        assert_eq!(set.json()["response_latency"], "300ms..400ms");
        let started = Instant::now();
        assert_eq!(net.post_ids(&ids(0, 1)).await.status, 202);
        assert!(started.elapsed() >= Duration::from_millis(300), "{dialect}");
        let started = Instant::now();
        let path = match dialect {
            Dialect::Scabbard => {
                format!("/scabbard/{CIRCUIT}/{SERVICE}/batch_statuses?ids={}", id(0))
            }
            Dialect::Sawtooth => format!("/batch_statuses?id={}", id(0)),
        };
        assert_eq!(net.get(&path).await.status, 200);
        assert!(started.elapsed() >= Duration::from_millis(300), "{dialect}");
        // Control routes are not delayed.
        let started = Instant::now();
        net.get("/_devnet/stats").await;
        assert!(started.elapsed() < Duration::from_millis(250));
    }
}

#[tokio::test]
async fn commit_latency_can_change_at_run_time() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let answer = net.put_faults(json!({"commit_latency": "2s"})).await;
    assert_eq!(answer.json()["commit_latency"], "2s");
    assert_eq!(net.post_ids(&ids(0, 1)).await.status, 202);
    let infos = net.scabbard_statuses(&ids(0, 1), Some("1")).await;
    assert_eq!(infos[0].status.kind(), dltsub_wire::BatchStatus::Valid);
}

#[tokio::test]
async fn faults_are_validated() {
    let net = start(Dialect::Scabbard, |_| {}).await;
    let answer = net.put_faults(json!({"error_500_before": 2.0})).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.json()["error"]
            .as_str()
            .unwrap()
            .contains("error_500_before")
    );
    let answer = net.put_faults(json!({"no_such_knob": 1})).await;
    assert_eq!(answer.status, 400);
    let answer = net.put_faults(json!({"commit_latency": "later"})).await;
    assert_eq!(answer.status, 400);
    // Nothing changed.
    let mut expected = DevnetConfig::new(Dialect::Scabbard).faults;
    expected.commit_latency = Latency::fixed(Duration::from_millis(20));
    assert_eq!(net.devnet.control().faults(), expected);
}

#[tokio::test]
async fn invalid_fraction_makes_batches_invalid_at_random() {
    for dialect in DIALECTS {
        let net = start(dialect, |c| {
            c.faults.invalid_fraction = 0.5;
            c.backpressure_high = 1_000;
        })
        .await;
        let all = ids(0, 100);
        for chunk in all.chunks(20) {
            assert_eq!(net.post_ids(chunk).await.status, 202);
        }
        net.settle(&all).await;
        let stats = &net.stats().await.ledgers[ledger_of(dialect)];
        assert!((25..75).contains(&stats.invalid), "{dialect}: {stats:?}");
        assert_eq!(stats.invalid + stats.committed, 100);
    }
}

/// What a run looked like from outside: each POST's status and the committed ids.
async fn scripted_run(seed: u64) -> (Vec<u16>, Vec<String>) {
    let net = start(Dialect::Scabbard, |c| {
        c.seed = seed;
        c.faults.error_500_before = 0.3;
        c.faults.error_503_before = 0.2;
        c.faults.invalid_fraction = 0.3;
        c.faults.commit_latency =
            Latency::between(Duration::from_millis(1), Duration::from_millis(30));
        c.backpressure_high = 1_000;
    })
    .await;
    let mut statuses = Vec::new();
    for n in 0..30 {
        let list = ids(n * 3, n * 3 + 3);
        statuses.push(net.post_ids(&list).await.status);
    }
    let accepted: Vec<String> = net
        .posts()
        .await
        .entries
        .into_iter()
        .filter(|p| p.status == Some(202))
        .flat_map(|p| p.batch_ids)
        .collect();
    net.settle(&accepted).await;
    (statuses, net.committed(LEDGER).await)
}

#[tokio::test]
async fn the_seed_makes_a_run_reproducible() {
    let (statuses, committed) = scripted_run(11).await;
    assert!(statuses.contains(&202) && statuses.contains(&500) && statuses.contains(&503));
    assert_eq!(
        scripted_run(11).await,
        (statuses.clone(), committed.clone())
    );
    let (other_statuses, other_committed) = scripted_run(12).await;
    assert!(other_statuses != statuses || other_committed != committed);
}

#[tokio::test]
async fn the_post_log_records_ids_times_and_dltsub_headers() {
    for dialect in DIALECTS {
        let net = start(dialect, |c| c.post_log_limit = 3).await;
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        let url = match dialect {
            Dialect::Scabbard => format!("{}/batches", net.devnet.scabbard_url(CIRCUIT, SERVICE)),
            Dialect::Sawtooth => net.url("/batches"),
        };
        let response = net
            .http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .header("X-Dltsub-Instance", "instance-a")
            .header("X-Dltsub-Epoch", "42")
            .body(body(&ids(0, 2)))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let log = net.posts().await;
        let post = &log.entries[0];
        assert_eq!(post.batch_ids, ids(0, 2));
        assert_eq!(post.instance.as_deref(), Some("instance-a"));
        assert_eq!(post.epoch.as_deref(), Some("42"));
        assert_eq!(post.status, Some(202));
        assert_eq!(post.ledger, ledger_of(dialect));
        assert!(post.time_us >= before);
        // Bounded: the last 3 kept, the rest counted.
        for n in 10..14 {
            net.post_ids(&ids(n, n + 1)).await;
        }
        net.post(b"\xff\xff".to_vec()).await;
        let log = net.posts().await;
        assert_eq!((log.total, log.evicted, log.entries.len()), (6, 3, 3));
        let seqs: Vec<_> = log.entries.iter().map(|p| p.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(log.entries[2].status, Some(400));
        assert_eq!(log.entries[2].instance, None);
    }
}

#[tokio::test]
async fn serve_stops_on_shutdown_and_ends_waits() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut config = DevnetConfig::new(Dialect::Scabbard);
    config.faults.commit_latency = Latency::fixed(Duration::from_secs(60));
    let server = tokio::spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    let base = format!("http://{addr}/scabbard/{CIRCUIT}/{SERVICE}");
    let response = http
        .post(format!("{base}/batches"))
        .body(body(&ids(0, 1)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let waiting = tokio::spawn({
        let http = http.clone();
        async move {
            http.get(format!("{base}/batch_statuses?ids={}&wait=60", id(0)))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    stop.send(()).unwrap();
    let statuses = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the wait ended with the server")
        .unwrap();
    assert_eq!(statuses[0]["status"]["statusType"], "Pending");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("serve returned")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still listening"
    );
}

#[tokio::test]
async fn the_benchmark_commits_everything_it_accepted() {
    for dialect in DIALECTS {
        let report = run_bench(&DevnetBenchArgs {
            dialect,
            clients: 4,
            duration: Duration::from_millis(300),
            batches_per_list: 5,
            services: 2,
            ..DevnetBenchArgs::default()
        })
        .await
        .unwrap();
        assert!(report.accepted > 0, "{report}");
        assert_eq!(report.errors, 0, "{report}");
        assert_eq!(report.committed_total, report.accepted, "{report}");
        assert!(report.to_string().contains("batches/s"));
    }
}
