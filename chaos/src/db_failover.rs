//! The database fails over under load: dltsub instances on a pg_auto_failover cluster
//! (primary + synchronous standby + monitor, see [`crate::pg_cluster`]) while a client
//! submits batches through their APIs; mid-run the primary node dies (SIGKILL of its
//! keeper, postmaster and backends). The standby is promoted, the instances reconnect
//! through their multi-host URL, and the checker then demands: every batch a client was
//! told was accepted (2xx) is in the database and final, the ledger agrees with the
//! database, per-service order holds, and no batch reached the ledger twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use dltsub_store::{Store, StoreOptions};
use tokio::sync::Mutex;

use crate::check::Findings;
use crate::cluster::Cluster;
use crate::pg_cluster::AutoFailoverCluster;
use crate::scenario::{Drained, batch, drain_and_check, unfinished};

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct FailoverRun {
    pub instances: usize,
    pub services: u64,
    pub batches_per_service: u64,
    /// Pause between one service's submissions (the client's pace).
    pub pace: Duration,
}

impl FailoverRun {
    /// What the test command runs: about half a minute.
    pub fn short() -> Self {
        Self {
            instances: 3,
            services: 6,
            batches_per_service: 30,
            pace: Duration::from_millis(40),
        }
    }
}

/// What one run measured and found.
#[derive(Debug)]
pub struct FailoverReport {
    /// `synchronous_standby_names` of the primary before the kill.
    pub synchronous_standby_names: String,
    pub old_primary: String,
    pub new_primary: Option<String>,
    /// From the kill until the monitor reports the standby as primary.
    pub promoted_after: Option<Duration>,
    /// From the kill until an API answered 2xx to a submission sent after it.
    pub first_accept_after: Option<Duration>,
    /// From the kill until the first batch reached the ledger (a POST answered 202) after
    /// the self-fencing deadline: the first submission that needed the new primary.
    pub first_submission_after: Option<Duration>,
    /// From the kill until every accepted batch was final.
    pub caught_up_after: Option<Duration>,
    /// From the client's last accepted batch until every batch was final: the backlog
    /// left when the submissions stopped, drained.
    pub drained_after_last_accept: Option<Duration>,
    /// Batches clients were told were accepted: before the kill, after it.
    pub accepted_before: u64,
    pub accepted_after: u64,
    /// Submissions the client had to retry (errors, 5xx) during the run.
    pub client_retries: u64,
    /// From the kill until instance 0's `/readyz` answered 503, and until it answered
    /// 200 again.
    pub unready_after: Option<Duration>,
    pub ready_again_after: Option<Duration>,
    /// POSTs that reached the ledger after the self-fencing deadline while no primary
    /// took writes (must be 0).
    pub posts_while_fenced: u64,
    /// Accepted (2xx) batches missing from the database or not final.
    pub lost_accepted: u64,
    pub findings: Findings,
    pub stale_rejected: u64,
    pub problems: Vec<String>,
    pub elapsed: Duration,
    /// Where the logs are kept when it failed.
    pub kept: Option<std::path::PathBuf>,
}

impl FailoverReport {
    /// The fault happened as planned: the old primary is dead, another node took over,
    /// and batches were accepted on both sides of the kill.
    pub fn fired(&self) -> bool {
        self.new_primary
            .as_ref()
            .is_some_and(|new| *new != self.old_primary)
            && self.accepted_before > 0
            && self.accepted_after > 0
    }

    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.fired()
    }

    pub fn print(&self) {
        let secs = |value: Option<Duration>| {
            value.map_or_else(
                || "never".to_string(),
                |d| format!("{:.2} s", d.as_secs_f64()),
            )
        };
        println!(
            "synchronous replication: synchronous_standby_names = {:?}",
            self.synchronous_standby_names
        );
        println!(
            "primary {} killed (keeper, postmaster, backends: SIGKILL); new primary: {}",
            self.old_primary,
            self.new_primary.as_deref().unwrap_or("none")
        );
        println!(
            "  standby promoted after        {}",
            secs(self.promoted_after)
        );
        println!(
            "  first batch accepted after    {}",
            secs(self.first_accept_after)
        );
        println!(
            "  first ledger submission after {}",
            secs(self.first_submission_after)
        );
        println!(
            "  every batch final after       {} ({} after the client's last batch)",
            secs(self.caught_up_after),
            secs(self.drained_after_last_accept)
        );
        println!(
            "  /readyz 503 after {}, 200 again after {}",
            secs(self.unready_after),
            secs(self.ready_again_after)
        );
        println!(
            "  POSTs past the self-fencing deadline with no primary: {}",
            self.posts_while_fenced
        );
        println!(
            "batches accepted: {} before the kill, {} after; client retries {}",
            self.accepted_before, self.accepted_after, self.client_retries
        );
        let duplicates = self.findings.duplicate_batches;
        println!(
            "lost (accepted, not final): {}; lost (checker): {}; disagreements {}; order violations {}; stale writes accepted {} (rejected {}); duplicates {}",
            self.lost_accepted,
            self.findings.lost,
            self.findings.disagreements,
            self.findings.order_violations,
            self.findings.stale_writes,
            self.stale_rejected,
            duplicates
        );
        for problem in &self.problems {
            println!("PROBLEM: {problem}");
        }
        if let Some(kept) = &self.kept {
            println!("logs kept in {}", kept.display());
        }
        println!(
            "{} in {:.1} s",
            if self.passed() { "ok" } else { "FAILED" },
            self.elapsed.as_secs_f64()
        );
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One accepted submission, as the client saw it.
struct Accepted {
    batch_id: String,
    /// When the request that was accepted was sent, and when its answer came.
    sent: Instant,
    at: Instant,
}

/// Runs the failover scenario; `Err` only when the setup itself failed.
pub async fn run_db_failover(run: FailoverRun) -> anyhow::Result<FailoverReport> {
    let started = Instant::now();
    let mut pg = AutoFailoverCluster::start(Duration::from_secs(180))
        .await
        .context("cannot build the pg_auto_failover cluster")?;
    let database_url = pg.database_url();
    let options = StoreOptions::new(database_url.parse().map_err(anyhow::Error::msg)?);
    dltsub_store::run_migrations(&options).await?;
    let store = Store::connect(&options).await?;
    let mut cluster = Cluster::start_on(database_url, store).await?;
    for _ in 0..run.instances {
        let index = cluster.add_instance("")?;
        cluster.wait_registered(index).await?;
    }
    let api_ports: Arc<Vec<u16>> = Arc::new(cluster.instances.iter().map(|i| i.api_port).collect());

    // The client: one task per service, each submitting its batches in order, each to the
    // next instance (as a load balancer would), retrying a failed submission elsewhere.
    let accepted: Arc<Mutex<Vec<Accepted>>> = Arc::default();
    let retries = Arc::new(AtomicU64::new(0));
    let next_instance = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut clients = tokio::task::JoinSet::new();
    for service in 0..run.services {
        let (accepted, retries, next_instance, http, api_ports) = (
            accepted.clone(),
            retries.clone(),
            next_instance.clone(),
            http.clone(),
            api_ports.clone(),
        );
        clients.spawn(async move {
            for n in 0..run.batches_per_service {
                let new = batch(service, n);
                let give_up = Instant::now() + Duration::from_secs(90);
                loop {
                    let port =
                        api_ports[next_instance.fetch_add(1, Ordering::Relaxed) % api_ports.len()];
                    let url = format!(
                        "http://127.0.0.1:{port}/api/v1/services/chaos::svc{service}/batches"
                    );
                    let sent = Instant::now();
                    let answer = http
                        .post(&url)
                        .header("content-type", "application/octet-stream")
                        .body(new.serialized_batch.clone())
                        .send()
                        .await;
                    if answer.as_ref().is_ok_and(|r| r.status().is_success()) {
                        accepted.lock().await.push(Accepted {
                            batch_id: new.batch_id.clone(),
                            sent,
                            at: Instant::now(),
                        });
                        break;
                    }
                    retries.fetch_add(1, Ordering::Relaxed);
                    if Instant::now() > give_up {
                        bail!("batch {n} of service {service} was refused for 90 s");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(run.pace).await;
            }
            Ok::<_, anyhow::Error>(())
        });
    }

    // Kill the primary once a third of the work is accepted (and some of it submitted).
    let total = run.services * run.batches_per_service;
    cluster
        .wait_until(
            "a third of the batches to be accepted",
            Duration::from_secs(60),
            || {
                let accepted = accepted.clone();
                async move { Ok(accepted.lock().await.len() as u64 >= total / 3) }
            },
        )
        .await?;
    let old = pg.primary().await?.context("no primary before the kill")?;
    let synchronous_standby_names = pg.synchronous_standby_names(old.port).await?;
    pg.kill_node(&old.name).await?;
    // SIGKILL is delivered asynchronously: the times count from when the postmaster is
    // seen gone (or a zombie).
    let mut problems = Vec::new();
    let signalled = Instant::now();
    while pg.node_alive(&old.name) {
        if signalled.elapsed() > Duration::from_secs(5) {
            problems.push(format!("{} still runs 5 s after SIGKILL", old.name));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = Instant::now();
    let killed_at_us = now_us();
    // What a load balancer's health check sees meanwhile: instance 0's /readyz.
    let readiness = tokio::spawn(watch_readiness(http.clone(), api_ports[0], killed_at));

    // Promotion, as the monitor reports it.
    let mut promoted_after = None;
    let mut new_primary = None;
    while killed_at.elapsed() < Duration::from_secs(60) {
        // The monitor goes on listing the dead node as it last reported; look for the
        // other one.
        let states = pg.states().await.unwrap_or_default();
        if let Some(primary) = states
            .iter()
            .find(|node| node.name != old.name && node.is_primary())
        {
            promoted_after = Some(killed_at.elapsed());
            new_primary = Some(primary.name.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if new_primary.is_none() {
        problems.push("the standby was not promoted within 60 s".into());
    }

    while let Some(result) = clients.join_next().await {
        if let Err(error) = result? {
            problems.push(format!("client: {error}"));
        }
    }
    let caught_up = cluster
        .wait_until(
            "every batch to be final",
            Duration::from_secs(90),
            || async { Ok(unfinished(&cluster).await? == 0) },
        )
        .await;
    let caught_up_at = Instant::now();
    let caught_up_after = caught_up.is_ok().then(|| caught_up_at - killed_at);

    // POSTs started before the kill may still finish within the self-fencing deadline;
    // the first after that deadline is the first of the new primary's era.
    let fenced_from_us = killed_at_us + crate::cluster::FAST_EXPIRY.as_micros() as u64;
    // Every batch is final: the ledger's POST log is complete for both questions below.
    let posts = cluster.ledger.control().posts().entries;
    let first_submission_after = posts
        .iter()
        .filter(|post| post.time_us > fenced_from_us && post.status == Some(202))
        .map(|post| post.time_us)
        .min()
        .map(|at| Duration::from_micros(at - killed_at_us));
    let accepted = std::mem::take(&mut *accepted.lock().await);
    let accepted_before = accepted.iter().filter(|a| a.at < killed_at).count() as u64;
    let accepted_after = accepted.len() as u64 - accepted_before;
    // Of requests sent after the kill: one in flight at the kill may still succeed.
    let drained_after_last_accept = caught_up_after.and_then(|_| {
        let last = accepted.iter().map(|a| a.at).max()?;
        Some(caught_up_at.saturating_duration_since(last))
    });
    let first_accept_after = accepted
        .iter()
        .filter(|a| a.sent > killed_at)
        .map(|a| a.at - killed_at)
        .min();

    // Every batch the client was told was accepted must be in the database, and final.
    let ids: Vec<&str> = accepted.iter().map(|a| a.batch_id.as_str()).collect();
    let found = cluster.store.find_batches(None, &ids).await?;
    let final_ids: std::collections::HashSet<&str> = found
        .iter()
        .filter(|record| {
            record
                .status
                .parse::<dltsub_store::BatchStatus>()
                .is_ok_and(dltsub_store::BatchStatus::is_terminal)
        })
        .map(|record| record.batch_id.as_str())
        .collect();
    let lost_accepted = ids.iter().filter(|id| !final_ids.contains(*id)).count() as u64;
    if lost_accepted > 0 {
        problems.push(format!(
            "{lost_accepted} batches answered 2xx are missing or not final"
        ));
    }
    if accepted.len() as u64 != total {
        problems.push(format!(
            "the client got {} of {total} batches accepted",
            accepted.len()
        ));
    }

    let readiness = readiness.await?;
    if readiness.unready_after.is_none() {
        problems.push("/readyz never answered 503 while there was no primary".into());
    }
    if readiness.ready_again_after.is_none() {
        problems.push("/readyz did not answer 200 again after the promotion".into());
    }
    // No POST may leave an instance once its self-fencing deadline has passed with the
    // database gone (it cannot renew): from the kill plus the fast expiry until the new
    // primary took writes, the ledger must hear nothing.
    let writable_again_us =
        killed_at_us + first_accept_after.map_or(u64::MAX / 2, |d| d.as_micros() as u64);
    let posts_while_fenced = posts
        .iter()
        .filter(|post| post.time_us > fenced_from_us && post.time_us < writable_again_us)
        .count() as u64;
    if posts_while_fenced > 0 {
        problems.push(format!(
            "{posts_while_fenced} POSTs reached the ledger past the self-fencing deadline while no primary was reachable"
        ));
    }

    let Drained {
        findings,
        problems: more,
        stale_rejected,
    } = drain_and_check(&mut cluster, false).await?;
    problems.extend(more);
    if let Err(error) = caught_up {
        problems.push(error.to_string());
    }
    let mut report = FailoverReport {
        synchronous_standby_names,
        old_primary: old.name,
        new_primary,
        promoted_after,
        first_accept_after,
        first_submission_after,
        caught_up_after,
        drained_after_last_accept,
        accepted_before,
        accepted_after,
        client_retries: retries.load(Ordering::Relaxed),
        unready_after: readiness.unready_after,
        ready_again_after: readiness.ready_again_after,
        posts_while_fenced,
        lost_accepted,
        findings,
        stale_rejected,
        problems,
        elapsed: started.elapsed(),
        kept: None,
    };
    if !report.passed() {
        // Keep the instances' and the database nodes' logs.
        let kept = cluster.keep();
        let pg_logs = kept.join("postgres");
        let _ = std::fs::create_dir_all(&pg_logs);
        if let Ok(entries) = std::fs::read_dir(pg.dir()) {
            for entry in entries.flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(entry.path(), pg_logs.join(entry.file_name()));
                }
            }
        }
        report.kept = Some(kept);
    }
    Ok(report)
}

struct Readiness {
    unready_after: Option<Duration>,
    ready_again_after: Option<Duration>,
}

/// Polls `/readyz` every 100 ms from the kill: when did it first answer 503 (or not
/// answer), and when 200 again after that. Gives up after 60 s.
async fn watch_readiness(http: reqwest::Client, port: u16, killed_at: Instant) -> Readiness {
    let url = format!("http://127.0.0.1:{port}/readyz");
    let mut readiness = Readiness {
        unready_after: None,
        ready_again_after: None,
    };
    while killed_at.elapsed() < Duration::from_secs(60) {
        let ready = http
            .get(&url)
            .timeout(Duration::from_secs(3))
            .send()
            .await
            .is_ok_and(|answer| answer.status().is_success());
        match (ready, readiness.unready_after) {
            (false, None) => readiness.unready_after = Some(killed_at.elapsed()),
            (true, Some(_)) => {
                readiness.ready_again_after = Some(killed_at.elapsed());
                break;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    readiness
}
