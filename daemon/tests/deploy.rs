//! The production topology of `deploy/`, run for real: HAProxy (with
//! `deploy/haproxy/haproxy.cfg`) in front of three `dltsub run` processes on PostgreSQL,
//! `dltsub devnet` as the ledger behind them, and Prometheus (with
//! `deploy/prometheus/rules/dltsub.rules.yml`, its `for:` shortened) scraping them every
//! second.
//!
//! A client submits only through HAProxy — half the services on the scabbard route, half
//! on the native JSON API — and reads statuses back through it. Mid-run the instance
//! holding the most services is SIGKILLed and another gets SIGTERM. Then: every batch is
//! COMMITTED, on the ledger once and in order; the client saw no error a retry of its own
//! would not cure; HAProxy took the draining instance out of rotation (its /readyz check,
//! not a refused connection) before it exited, and sent it nothing after; and Prometheus
//! shows the targets up, the claims held summing to the services claimed, the submission
//! counters equal to the batches committed, and DltsubInstanceDown firing for the killed
//! instance.
//!
//! haproxy and prometheus come from Debian packages that `scripts/setup-deploy-tools`
//! installs (`scripts/test` calls it); they run as children of the test on free loopback
//! ports with their configuration in a temporary directory, and are killed when it ends.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dltsub_store::Store;
use dltsub_store::testing::{TestBackend, TestDatabase};
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use serde_json::Value;
use support::process::{Process, free_port};

/// Services, half submitted through the scabbard route and half through `/api/v1`.
const SERVICES: usize = 12;
/// Batches per service before the faults (the exact metric checks run after them)…
const WARMUP: usize = 10;
/// …while one instance is killed and another drained…
const DURING: usize = 40;
/// …and after, when one instance is left.
const AFTER: usize = 5;
/// Between two submissions of one service, so the load spans the faults.
const PACE: Duration = Duration::from_millis(150);
const TOKEN: &str = "deploy-test-token-0123456789";
/// The draining instance keeps serving this long with /readyz failing; HAProxy's checks
/// (inter 1s, fastinter 500ms, fall 2) take under 3s to notice on an idle machine.
const SHUTDOWN_DELAY: &str = "5s";
/// Generous bound for anything that should take seconds.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_and_prometheus_in_front_of_three_instances_through_a_kill_and_a_drain() {
    let started = Instant::now();
    let work = Workdir::new();
    let database = TestDatabase::migrated(TestBackend::Postgres).await;
    let store = database.store().await;
    let database_url = match &database.options.url {
        dltsub_store::DatabaseUrl::Postgres(url) => url.clone(),
        other => panic!("{other:?}"),
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // The ledger.
    let devnet_port = free_port();
    let _devnet = work.spawn(
        "devnet",
        Command::new(env!("CARGO_BIN_EXE_dltsub")).args([
            "devnet",
            "--listen",
            &format!("127.0.0.1:{devnet_port}"),
            "--commit-latency",
            "20ms",
        ]),
    );
    let devnet = format!("http://127.0.0.1:{devnet_port}");
    wait_http_ok(&http, &format!("{devnet}/_devnet/stats")).await;

    // Three instances.
    let mut instances: Vec<Instance> = (1..=3)
        .map(|n| Instance::start(&work, n, &database_url, &devnet))
        .collect();
    for instance in &instances {
        wait_http_ok(&http, &format!("http://127.0.0.1:{}/readyz", instance.api)).await;
    }

    // HAProxy with the deploy configuration, pointed at them.
    let lb_port = free_port();
    let stats_port = free_port();
    let servers: Vec<(String, u16)> = instances.iter().map(|i| (i.name.clone(), i.api)).collect();
    let haproxy_cfg = work.path("haproxy.cfg");
    std::fs::write(
        &haproxy_cfg,
        haproxy_config(
            &read(&deploy("haproxy/haproxy.cfg")),
            lb_port,
            stats_port,
            &servers,
        ),
    )
    .unwrap();
    let _haproxy = work.spawn(
        "haproxy",
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&haproxy_cfg),
    );
    let lb = format!("http://127.0.0.1:{lb_port}");
    let stats = format!("http://127.0.0.1:{stats_port}/stats;csv");
    poll(
        PATIENCE,
        "HAProxy to see all three instances UP",
        || async {
            let rows = haproxy_servers(&http, &stats).await?;
            (rows.len() == 3 && rows.values().all(|row| row.status == "UP")).then_some(())
        },
    )
    .await;
    let watcher = StatsWatcher::spawn(http.clone(), stats.clone());

    // Prometheus with the deploy rules, scraping every second.
    let prometheus_port = free_port();
    let targets: Vec<String> = instances
        .iter()
        .map(|i| format!("127.0.0.1:{}", i.metrics))
        .collect();
    std::fs::write(
        work.path("dltsub.rules.yml"),
        shorten_for(&read(&deploy("prometheus/rules/dltsub.rules.yml"))),
    )
    .unwrap();
    std::fs::write(
        work.path("prometheus.yml"),
        prometheus_config(&targets, stats_port),
    )
    .unwrap();
    let _prometheus = work.spawn(
        "prometheus",
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                work.path("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.path("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .arg("--log.level=warn"),
    );
    let prometheus = Prometheus {
        http: http.clone(),
        base: format!("http://127.0.0.1:{prometheus_port}"),
    };
    wait_http_ok(&http, &format!("{}/-/ready", prometheus.base)).await;
    poll(
        PATIENCE,
        "Prometheus to see three dltsub targets up",
        || async { (prometheus.value("sum(up{job=\"dltsub\"})").await? == 3.0).then_some(()) },
    )
    .await;
    let setup = started.elapsed();

    // Phase 1: load through HAProxy, everything committed, and the counters exact.
    let client = Client::new(http.clone(), lb.clone());
    client.submit_all(0..WARMUP).await;
    client.wait_all_committed(0..WARMUP).await;
    let committed = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batch_statuses WHERE status = 'COMMITTED')")
        .await as f64;
    assert_eq!(committed, (SERVICES * WARMUP) as f64);
    for query in [
        "sum(dltsub_submitted_batches_total{outcome=\"accepted\"})",
        "sum(dltsub_status_transitions_total{status=\"COMMITTED\"})",
    ] {
        prometheus.wait_equal(query, committed).await;
    }
    prometheus
        .wait_equal("max(job:dltsub_backlog:max)", 0.0)
        .await;
    let claimed = live_claims(&store).await as f64;
    assert_eq!(claimed, SERVICES as f64, "every service is claimed");
    prometheus
        .wait_equal("sum(dltsub_claims_held)", claimed)
        .await;
    prometheus
        .wait_equal("sum(job:dltsub_claims_held:sum)", claimed)
        .await;

    // Phase 2: load on, kill the instance with the most services, then drain another.
    let load = {
        let client = client.clone();
        tokio::spawn(async move { client.submit_all(WARMUP..WARMUP + DURING).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let holders = claim_holders(&store).await;
    let most = holders.values().map(Vec::len).max().unwrap_or(0);
    let victim = instances
        .iter()
        .position(|i| {
            holders
                .iter()
                .any(|((_, pid), services)| *pid == i.pid() && services.len() == most)
        })
        .expect("an instance holds services");
    let mut killed = instances.remove(victim);
    let (killed_id, killed_services) = holders
        .iter()
        .find(|((_, pid), _)| *pid == killed.pid())
        .map(|((id, _), services)| (id.clone(), services.clone()))
        .unwrap();
    let killed_at = Instant::now();
    killed.signal("KILL");
    let _ = killed.process.0.wait();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut drained = instances.remove(0);
    let survivor = instances.remove(0);
    let drained_at = Instant::now();
    let stot_at_term = watcher.last_before(&drained.name, drained_at);
    drained.signal("TERM");
    let drained_name = drained.name.clone();
    let drain = tokio::spawn(async move {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = drained.process.0.try_wait().unwrap() {
                return (status, Instant::now(), drained);
            }
            assert!(
                Instant::now() < deadline,
                "the drained instance did not exit"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });

    // The killed instance's services move to the others.
    let moved_after = poll(
        PATIENCE,
        "the killed instance's services to move",
        || async {
            let still = store
                .claims()
                .await
                .unwrap()
                .iter()
                .filter(|claim| claim.claimant.as_deref() == Some(killed_id.as_str()))
                .count();
            (still == 0).then(|| killed_at.elapsed())
        },
    )
    .await;
    let killed_down_after = poll(PATIENCE, "HAProxy to mark the killed instance DOWN", || {
        let watcher = &watcher;
        let name = killed.name.clone();
        async move {
            watcher
                .down_since(&name, killed_at)
                .map(|(at, _)| at - killed_at)
        }
    })
    .await;

    let (exit, exited_at, drained) = drain.await.unwrap();
    assert!(exit.success(), "the drained instance exits 0: {exit:?}");
    load.await.unwrap();
    client.wait_all_committed(WARMUP..WARMUP + DURING).await;

    // Phase 3: one instance left; its counters move by exactly what it commits.
    let survivor_target = format!("127.0.0.1:{}", survivor.metrics);
    let accepted_query = format!(
        "sum(dltsub_submitted_batches_total{{outcome=\"accepted\", instance=\"{survivor_target}\"}})"
    );
    let committed_query = format!(
        "sum(dltsub_status_transitions_total{{status=\"COMMITTED\", instance=\"{survivor_target}\"}})"
    );
    let accepted_before = prometheus.settled(&accepted_query).await;
    let committed_before = prometheus.settled(&committed_query).await;
    let total = SERVICES * (WARMUP + DURING + AFTER);
    client
        .submit_all(WARMUP + DURING..WARMUP + DURING + AFTER)
        .await;
    client
        .wait_all_committed(WARMUP + DURING..WARMUP + DURING + AFTER)
        .await;
    let phase3 = (SERVICES * AFTER) as f64;
    prometheus
        .wait_equal(&accepted_query, accepted_before + phase3)
        .await;
    prometheus
        .wait_equal(&committed_query, committed_before + phase3)
        .await;

    // Nothing lost, nothing duplicated, every service in order, in the database and on
    // the ledger.
    let committed = store
        .scalar_i64_for_tests("(SELECT COUNT(*) FROM batch_statuses WHERE status = 'COMMITTED')")
        .await;
    assert_eq!(store.count_rows_for_tests("batches").await, total as i64);
    assert_eq!(committed, total as i64, "every batch COMMITTED");
    let ledger: Value = get_json(&http, &format!("{devnet}/_devnet/ledger")).await;
    for service in 0..SERVICES {
        let on_ledger: Vec<&str> = ledger["ledgers"][service_id(service)]["committed"]
            .as_array()
            .unwrap_or_else(|| panic!("no ledger for {}", service_id(service)))
            .iter()
            .map(|id| id.as_str().unwrap())
            .collect();
        let expected: Vec<String> = (0..WARMUP + DURING + AFTER)
            .map(|n| batch_id(service, n))
            .collect();
        assert_eq!(
            on_ledger,
            expected.iter().map(String::as_str).collect::<Vec<_>>(),
            "{}: every batch once, in acceptance order",
            service_id(service)
        );
    }

    // The client saw no error that its own retry did not cure.
    let report = client.report();
    assert!(
        report.fatal.is_empty(),
        "errors a retry would not cure: {:?}",
        report.fatal
    );

    // HAProxy took the draining instance out through its /readyz check before it exited,
    // and sent it nothing afterwards.
    let (drained_down_at, stot_at_down) = watcher
        .down_since(&drained_name, drained_at)
        .expect("HAProxy marked the draining instance DOWN");
    assert!(
        drained_down_at < exited_at,
        "HAProxy marked {drained_name} DOWN {:?} after SIGTERM, but it exited after {:?}",
        drained_down_at - drained_at,
        exited_at - drained_at
    );
    let rows = haproxy_servers(&http, &stats).await.unwrap();
    assert_eq!(
        rows[&drained_name].stot, stot_at_down,
        "HAProxy sent {drained_name} no request after marking it DOWN"
    );
    let haproxy_log = read(&work.path("haproxy.log")) + &read(&work.path("haproxy.err"));
    let drained_line = haproxy_log
        .lines()
        .find(|line| line.contains(&format!("dltsub/{drained_name} is DOWN")))
        .unwrap_or_else(|| panic!("no DOWN line for {drained_name} in HAProxy's log"));
    assert!(
        drained_line.contains("Layer7 wrong status") && drained_line.contains("503"),
        "HAProxy took {drained_name} out because /readyz answered 503: {drained_line}"
    );
    let killed_line = haproxy_log
        .lines()
        .find(|line| line.contains(&format!("dltsub/{} is DOWN", killed.name)))
        .unwrap_or("(none)")
        .to_string();
    let sent_while_draining = stot_at_down - stot_at_term;

    // Prometheus: the targets, the claims, the alert.
    let up = prometheus.vector("up{job=\"dltsub\"}").await;
    let up_of = |target: &str| {
        up.iter()
            .find(|sample| sample["metric"]["instance"] == target)
            .map(|sample| sample["value"][1].as_str().unwrap().to_string())
    };
    assert_eq!(up_of(&survivor_target).as_deref(), Some("1"));
    let killed_target = format!("127.0.0.1:{}", killed.metrics);
    assert_eq!(up_of(&killed_target).as_deref(), Some("0"));
    let claimed = live_claims(&store).await as f64;
    assert_eq!(claimed, SERVICES as f64);
    prometheus
        .wait_equal("sum(dltsub_claims_held)", claimed)
        .await;
    poll(
        PATIENCE,
        "DltsubInstanceDown to fire for the killed instance",
        || {
            let prometheus = &prometheus;
            let killed_target = killed_target.clone();
            async move {
                let alerts: Value = prometheus.get("/api/v1/alerts", &[]).await?;
                alerts["data"]["alerts"]
                    .as_array()?
                    .iter()
                    .any(|alert| {
                        alert["labels"]["alertname"] == "DltsubInstanceDown"
                            && alert["labels"]["instance"] == killed_target.as_str()
                            && alert["state"] == "firing"
                    })
                    .then_some(())
            }
        },
    )
    .await;

    // Every dltsub metric family the instances export is in the catalogue the rules are
    // checked against, and every dashboard query is valid PromQL on real data.
    let names: Value = prometheus
        .get(
            "/api/v1/label/__name__/values",
            &[("match[]", "{job=\"dltsub\"}")],
        )
        .await
        .unwrap();
    let catalogue = dltsub::metrics::catalogue();
    for name in names["data"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        if !name.starts_with("dltsub_") {
            continue;
        }
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|base| catalogue.iter().any(|f| f.name == *base))
            .unwrap_or(name);
        assert!(
            catalogue.iter().any(|family| family.name == base),
            "{name} is exported but missing from dltsub::metrics::catalogue()"
        );
    }
    let dashboard: Value = serde_json::from_str(&read(&deploy("grafana/dltsub.json"))).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let answer: Value = prometheus
                .get("/api/v1/query", &[("query", expr)])
                .await
                .unwrap_or_else(|| panic!("dashboard query {expr:?} failed"));
            assert_eq!(answer["status"], "success", "{expr}");
        }
    }
    assert!(
        prometheus
            .value("sum(haproxy_backend_active_servers{proxy=\"dltsub\"})")
            .await
            .is_some(),
        "Prometheus scrapes HAProxy's exporter"
    );

    let frontend = haproxy_frontend_requests(&http, &stats).await;
    println!(
        "deploy end-to-end figures\n\
         \x20 batches (services x batches)          {total} ({SERVICES} x {})\n\
         \x20 client requests through HAProxy        {} (HAProxy frontend counted {frontend})\n\
         \x20 errors seen by the client              {} retried and cured, {} not {:?}\n\
         \x20 HAProxy retries / redispatches         {} / {}\n\
         \x20 killed instance ({})            marked DOWN by HAProxy after {:.2}s; its {} services moved after {:.2}s\n\
         \x20 drained instance ({})           marked DOWN after {:.2}s, exited 0 after {:.2}s; HAProxy sent it {} requests while it drained, none after DOWN\n\
         \x20 HAProxy log: {}\n\
         \x20 HAProxy log: {}\n\
         \x20 setup {:.1}s, total {:.1}s",
        WARMUP + DURING + AFTER,
        report.requests,
        report.retried.len(),
        report.fatal.len(),
        report.retried.iter().take(5).collect::<Vec<_>>(),
        rows.values().map(|r| r.wretr).sum::<u64>(),
        rows.values().map(|r| r.wredis).sum::<u64>(),
        killed.name,
        killed_down_after.as_secs_f64(),
        killed_services.len(),
        moved_after.as_secs_f64(),
        drained.name,
        (drained_down_at - drained_at).as_secs_f64(),
        (exited_at - drained_at).as_secs_f64(),
        sent_while_draining,
        killed_line.trim(),
        drained_line.trim(),
        setup.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    work.succeeded();
}

// ---------------------------------------------------------------------------------------
// The processes

/// A temporary directory for configurations and logs. Kept, with the tail of every log
/// printed, when the test fails.
struct Workdir {
    dir: Option<tempfile::TempDir>,
    ok: Mutex<bool>,
}

impl Workdir {
    fn new() -> Self {
        Self {
            dir: Some(
                tempfile::Builder::new()
                    .prefix("dltsub-deploy-")
                    .tempdir()
                    .unwrap(),
            ),
            ok: Mutex::new(false),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.as_ref().unwrap().path().join(name)
    }

    /// Starts a child with stdout and stderr in `{name}.log` / `{name}.err`.
    fn spawn(&self, name: &str, command: &mut Command) -> Process {
        let stdout = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        let stderr = std::fs::File::create(self.path(&format!("{name}.err"))).unwrap();
        let program = command.get_program().to_string_lossy().to_string();
        Process(
            command
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .env_remove("DLTSUB_CONFIG")
                .spawn()
                .unwrap_or_else(|error| {
                    panic!("cannot start {program} ({error}); scripts/setup-deploy-tools installs haproxy and prometheus")
                }),
        )
    }

    fn succeeded(&self) {
        *self.ok.lock().unwrap() = true;
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        if *self.ok.lock().unwrap() {
            if std::env::var_os("DEPLOY_TEST_KEEP").is_some() {
                let dir = self.dir.take().unwrap().keep();
                eprintln!("configurations and logs kept in {}", dir.display());
            }
            return;
        }
        let dir = self.dir.take().unwrap().keep();
        eprintln!(
            "deploy test failed; configurations and logs kept in {}",
            dir.display()
        );
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        logs.sort();
        for log in logs.iter().filter(|p| p.is_file()) {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            if !tail.is_empty() {
                eprintln!("--- {} (last {} lines)", log.display(), tail.len());
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }
}

struct Instance {
    name: String,
    api: u16,
    metrics: u16,
    process: Process,
}

impl Instance {
    fn start(work: &Workdir, n: usize, database_url: &str, devnet: &str) -> Self {
        let name = format!("dltsub{n}");
        let api = free_port();
        let metrics = free_port();
        let process = work.spawn(
            &name,
            Command::new(env!("CARGO_BIN_EXE_dltsub"))
                .args(["run", "--config"])
                .arg(deploy("dltsub.toml"))
                .args(["--database-url", database_url])
                .args(["--migrate-on-start", "false"])
                .args(["--dlt-url", devnet])
                .args(["--listen", &format!("127.0.0.1:{api}")])
                .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
                .args(["--api-token", TOKEN])
                .args(["--fast-expiry", "3s", "--slow-expiry", "9s"])
                .args(["--renew-interval", "500ms"])
                .args(["--dlt-request-timeout", "2s"])
                .args(["--status-wait", "1s", "--unknown-grace", "2s"])
                .args(["--submit-poll-interval", "50ms"])
                .args(["--shutdown-delay", SHUTDOWN_DELAY])
                .args(["--shutdown-timeout", "5s"])
                .env("DLTSUB_LOG", "info"),
        );
        Self {
            name,
            api,
            metrics,
            process,
        }
    }

    fn pid(&self) -> i64 {
        i64::from(self.process.0.id())
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.process.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }
}

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The deploy HAProxy configuration on loopback: the same defaults, checks and retries,
/// with the test's instances as servers, its own ports, logging to stdout and no
/// chroot, user or daemon mode (it runs as a child of the test).
fn haproxy_config(deployed: &str, lb: u16, stats: u16, servers: &[(String, u16)]) -> String {
    let mut out = String::new();
    let mut section = String::new();
    let mut servers_written = false;
    for line in deployed.lines() {
        let trimmed = line.trim();
        if !line.starts_with(' ') && !trimmed.is_empty() && !trimmed.starts_with('#') {
            section = trimmed.to_string();
            writeln!(out, "{line}").unwrap();
            if section == "global" {
                // A child of the test: its stdout is the log, and it stays within the
                // file-descriptor limit a test process may have.
                writeln!(out, "    log stdout format raw local0").unwrap();
                writeln!(out, "    maxconn 2000").unwrap();
            }
            continue;
        }
        let host_only = [
            "log ",
            "chroot ",
            "stats socket ",
            "user ",
            "group ",
            "daemon",
        ];
        if section == "global" && host_only.iter().any(|p| trimmed.starts_with(p)) {
            continue;
        }
        if trimmed.starts_with("bind ") {
            let port = if section.starts_with("listen stats") {
                stats
            } else {
                lb
            };
            writeln!(out, "    bind 127.0.0.1:{port}").unwrap();
        } else if trimmed.starts_with("server ") {
            if section == "backend dltsub" && !servers_written {
                for (name, port) in servers {
                    writeln!(out, "    server {name} 127.0.0.1:{port}").unwrap();
                }
                servers_written = true;
            }
        } else {
            writeln!(out, "{line}").unwrap();
        }
    }
    assert!(
        servers_written,
        "deploy/haproxy/haproxy.cfg has a backend dltsub"
    );
    assert!(out.contains("uri /readyz"), "the health check asks /readyz");
    out
}

/// The deploy rules with every `for:` at 2s, so alerts fire within a test.
fn shorten_for(rules: &str) -> String {
    rules
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for:") {
            Some(_) => format!("{}for: 2s", &line[..line.len() - line.trim_start().len()]),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn prometheus_config(targets: &[String], haproxy_stats: u16) -> String {
    let targets = targets
        .iter()
        .map(|t| format!("\"{t}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - dltsub.rules.yml\n\
         scrape_configs:\n\
         \x20 - job_name: dltsub\n    scrape_timeout: 900ms\n    static_configs:\n      - targets: [{targets}]\n\
         \x20 - job_name: haproxy\n    static_configs:\n      - targets: [\"127.0.0.1:{haproxy_stats}\"]\n"
    )
}

// ---------------------------------------------------------------------------------------
// The client: submits through HAProxy and reads statuses back through it

/// Even services are submitted on the scabbard route, odd ones on `/api/v1`.
fn on_scabbard(service: usize) -> bool {
    service.is_multiple_of(2)
}

fn service_id(service: usize) -> String {
    format!("deploy::svc{service:02}")
}

fn batch_id(service: usize, n: usize) -> String {
    format!("{:0>128}", format!("{service:02x}{n:06x}b"))
}

fn batch_bytes(service: usize, n: usize) -> Vec<u8> {
    BatchList {
        batches: vec![Batch {
            header: vec![service as u8, n as u8],
            header_signature: batch_id(service, n),
            transactions: vec![Transaction {
                header: vec![1],
                header_signature: format!("{:0>128}", format!("{service:02x}{n:06x}c")),
                payload: format!("svc {service} batch {n}").into_bytes(),
            }],
            trace: false,
        }],
    }
    .encode_to_vec()
}

#[derive(Default, Clone)]
struct ClientReport {
    requests: u64,
    /// Errors a retry cured (connection refused or reset, 502, 503, 504, 429).
    retried: Vec<String>,
    /// Anything else.
    fatal: Vec<String>,
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    lb: String,
    report: Arc<Mutex<ClientReport>>,
}

impl Client {
    fn new(http: reqwest::Client, lb: String) -> Self {
        Self {
            http,
            lb,
            report: Arc::default(),
        }
    }

    fn report(&self) -> ClientReport {
        self.report.lock().unwrap().clone()
    }

    /// Even services on the scabbard route, odd ones on `/api/v1`; one batch per request,
    /// in order per service, all services at once.
    async fn submit_all(&self, range: std::ops::Range<usize>) {
        let tasks: Vec<_> = (0..SERVICES)
            .map(|service| {
                let client = self.clone();
                let range = range.clone();
                tokio::spawn(async move {
                    for n in range {
                        client.submit(service, n).await;
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }

    async fn submit(&self, service: usize, n: usize) {
        let body = batch_bytes(service, n);
        let id = service_id(service);
        let (circuit, name) = id.split_once("::").unwrap();
        let answer = self
            .with_retries(&format!("submit {id} #{n}"), || {
                let request = if on_scabbard(service) {
                    self.http
                        .post(format!("{}/scabbard/{circuit}/{name}/batches", self.lb))
                        .header("Content-Type", "octet-stream")
                } else {
                    self.http
                        .post(format!("{}/api/v1/services/{id}/batches", self.lb))
                        .header("Content-Type", "application/octet-stream")
                        .bearer_auth(TOKEN)
                };
                request.body(body.clone()).send()
            })
            .await;
        if let Some((status, body)) = answer {
            let ok = if on_scabbard(service) {
                status == 202 && body["link"].is_string()
            } else {
                matches!(status, 200 | 202)
                    && matches!(body["state"].as_str(), Some("executed" | "postponed"))
            };
            if !ok {
                self.fatal(format!("submit {id} #{n}: {status} {body}"));
            }
        }
    }

    /// Polls statuses through HAProxy (scabbard's and the native API's status routes)
    /// until every batch of the range reads committed.
    async fn wait_all_committed(&self, range: std::ops::Range<usize>) {
        let deadline = Instant::now() + PATIENCE;
        for service in 0..SERVICES {
            let id = service_id(service);
            let (circuit, name) = id.split_once("::").unwrap();
            let ids: Vec<String> = range.clone().map(|n| batch_id(service, n)).collect();
            for chunk in ids.chunks(20) {
                loop {
                    let joined = chunk.join(",");
                    let answer = self
                        .with_retries(&format!("statuses of {id}"), || {
                            if on_scabbard(service) {
                                self.http
                                    .get(format!(
                                        "{}/scabbard/{circuit}/{name}/batch_statuses?ids={joined}&wait=2",
                                        self.lb
                                    ))
                                    .send()
                            } else {
                                self.http
                                    .get(format!(
                                        "{}/api/v1/batches?ids={joined}&service_id={id}&wait=2s",
                                        self.lb
                                    ))
                                    .send()
                            }
                        })
                        .await;
                    let committed = answer.is_some_and(|(status, body)| {
                        status == 200
                            && if on_scabbard(service) {
                                body.as_array().is_some_and(|statuses| {
                                    statuses.len() == chunk.len()
                                        && statuses
                                            .iter()
                                            .all(|s| s["status"]["statusType"] == "Committed")
                                })
                            } else {
                                body["batches"].as_array().is_some_and(|batches| {
                                    batches.len() == chunk.len()
                                        && batches.iter().all(|b| b["status"] == "COMMITTED")
                                })
                            }
                    });
                    if committed {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{id}: batches {range:?} not all committed through HAProxy"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Sends until an answer other than a retryable failure; records every failure. `None`
    /// after too many attempts (recorded as fatal).
    async fn with_retries<F, Fut>(&self, what: &str, send: F) -> Option<(u16, Value)>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
    {
        for _ in 0..50 {
            self.report.lock().unwrap().requests += 1;
            let failure = match send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    if matches!(status, 429 | 502 | 503 | 504) {
                        format!("{what}: HTTP {status}")
                    } else {
                        let body = response.json().await.unwrap_or(Value::Null);
                        return Some((status, body));
                    }
                }
                Err(error) => format!("{what}: {error}"),
            };
            self.report.lock().unwrap().retried.push(failure);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.fatal(format!("{what}: still failing after 50 attempts"));
        None
    }

    fn fatal(&self, error: String) {
        self.report.lock().unwrap().fatal.push(error);
    }
}

// ---------------------------------------------------------------------------------------
// HAProxy's statistics

#[derive(Debug, Clone)]
struct ServerRow {
    status: String,
    /// Sessions (connections) HAProxy ever opened to this server.
    stot: u64,
    wretr: u64,
    wredis: u64,
}

async fn stats_csv(http: &reqwest::Client, url: &str) -> Option<Vec<HashMap<String, String>>> {
    let text = http.get(url).send().await.ok()?.text().await.ok()?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    Some(
        lines
            .filter(|line| !line.is_empty())
            .map(|line| {
                header
                    .iter()
                    .zip(line.split(','))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect(),
    )
}

/// The servers of `backend dltsub` by name.
async fn haproxy_servers(http: &reqwest::Client, url: &str) -> Option<BTreeMap<String, ServerRow>> {
    let number = |row: &HashMap<String, String>, key: &str| {
        row.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    Some(
        stats_csv(http, url)
            .await?
            .into_iter()
            .filter(|row| {
                row["pxname"] == "dltsub"
                    && !["BACKEND", "FRONTEND"].contains(&row["svname"].as_str())
            })
            .map(|row| {
                (
                    row["svname"].clone(),
                    ServerRow {
                        status: row["status"].clone(),
                        stot: number(&row, "stot"),
                        wretr: number(&row, "wretr"),
                        wredis: number(&row, "wredis"),
                    },
                )
            })
            .collect(),
    )
}

async fn haproxy_frontend_requests(http: &reqwest::Client, url: &str) -> u64 {
    stats_csv(http, url)
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|row| row["pxname"] == "dltsub_api" && row["svname"] == "FRONTEND")
        .and_then(|row| row.get("req_tot").and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Polls HAProxy's statistics every 50 ms and remembers when each server was seen DOWN
/// and how many sessions it had been sent by then.
/// Every poll of every server: when, its name, its status, its sessions so far.
type Seen = Arc<Mutex<Vec<(Instant, String, String, u64)>>>;

struct StatsWatcher {
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl StatsWatcher {
    fn spawn(http: reqwest::Client, url: String) -> Self {
        let seen: Seen = Arc::default();
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    if let Some(rows) = haproxy_servers(&http, &url).await {
                        let now = Instant::now();
                        let mut seen = seen.lock().unwrap();
                        for (name, row) in rows {
                            seen.push((now, name, row.status, row.stot));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        Self { seen, task }
    }

    /// The sessions `server` had been sent at the last poll before `at`.
    fn last_before(&self, server: &str, at: Instant) -> u64 {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(seen, name, _, _)| *seen < at && name == server)
            .map_or(0, |(_, _, _, stot)| *stot)
    }

    /// The first time after `since` that `server` read DOWN, and its sessions then.
    fn down_since(&self, server: &str, since: Instant) -> Option<(Instant, u64)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .find(|(at, name, status, _)| {
                *at >= since && name == server && status.starts_with("DOWN")
            })
            .map(|(at, _, _, stot)| (*at, *stot))
    }
}

impl Drop for StatsWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------
// Prometheus's HTTP API

struct Prometheus {
    http: reqwest::Client,
    base: String,
}

impl Prometheus {
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let url = url::Url::parse_with_params(&format!("{}{path}", self.base), query).ok()?;
        let response = self.http.get(url).send().await.ok()?;
        response.json().await.ok()
    }

    async fn vector(&self, query: &str) -> Vec<Value> {
        self.get("/api/v1/query", &[("query", query)])
            .await
            .and_then(|answer| answer["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The value of a one-sample instant query; `None` for an empty result.
    async fn value(&self, query: &str) -> Option<f64> {
        let result = self.vector(query).await;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `query` reads `expected` (scrapes lag behind by a second or two).
    async fn wait_equal(&self, query: &str, expected: f64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.value(query).await;
            if value == Some(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus: {query} = {value:?}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The value of `query` once it has stopped changing for three scrapes.
    async fn settled(&self, query: &str) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        let mut last = None;
        let mut since = Instant::now();
        loop {
            let value = self.value(query).await;
            if value != last {
                last = value;
                since = Instant::now();
            } else if let Some(value) = value
                && since.elapsed() > Duration::from_secs(3)
            {
                return value;
            }
            assert!(Instant::now() < deadline, "{query} never settled");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

async fn wait_http_ok(http: &reqwest::Client, url: &str) {
    poll(PATIENCE, url, || async {
        let response = http.get(url).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;
}

/// Polls `condition` every 50 ms until it yields a value; fails after `limit`.
async fn poll<T, F, Fut>(limit: Duration, what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Services held by each registered instance, keyed by its id and pid.
async fn claim_holders(store: &Store) -> HashMap<(String, i64), Vec<String>> {
    let instances = store.instances().await.unwrap();
    let pid_of: HashMap<String, i64> = instances
        .into_iter()
        .map(|i| (i.instance_id, i.pid))
        .collect();
    let mut holders: HashMap<(String, i64), Vec<String>> = HashMap::new();
    for claim in store.claims().await.unwrap() {
        if let Some(claimant) = claim.claimant
            && let Some(pid) = pid_of.get(&claimant)
        {
            holders
                .entry((claimant, *pid))
                .or_default()
                .push(claim.service_id);
        }
    }
    holders
}

/// Services whose claim is held and inside its fast expiry (database clock).
async fn live_claims(store: &Store) -> i64 {
    let now = store.database_now_us().await.unwrap();
    store
        .claims()
        .await
        .unwrap()
        .iter()
        .filter(|claim| claim.claimant.is_some() && claim.fast_expiry_us > now)
        .count() as i64
}
