//! One scenario: a cluster of two instances, a workload over several services, one fault
//! at one event point of the instance that holds the services, then drain and check.
//!
//! PASS lets the point go by; DELAY stops the whole process there (SIGSTOP) for longer
//! than the slow expiry, then resumes it (SIGCONT), so it carries on with a claim it no
//! longer holds; FAIL kills it there (SIGKILL).

use std::fmt;
use std::time::{Duration, Instant};

use dltsub_chaos_points::{Event, Phase, Point};
use dltsub_store::NewBatch;
use dltsub_store::testing::TestBackend;
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;

use crate::check::{Findings, check};
use crate::cluster::{Cluster, FAST_EXPIRY, RENEW_INTERVAL, SLOW_EXPIRY, fired};

/// What happens at the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Pass,
    Delay,
    Fail,
    /// The caller's failure path at the point (a lost answer, a failed write).
    Error,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Pass => "PASS",
            Fault::Delay => "DELAY",
            Fault::Fail => "FAIL",
            Fault::Error => "ERROR",
        })
    }
}

/// A fault at the `hit`-th time the holder reaches `point`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub point: Point,
    pub hit: u64,
    pub fault: Fault,
}

impl Scenario {
    /// The plan given to the faulted instance.
    pub fn plan(&self) -> String {
        let action = match self.fault {
            Fault::Pass => "pass",
            Fault::Delay => "stop",
            Fault::Fail => "kill",
            Fault::Error => "error",
        };
        format!("{}@{}={action}", self.point, self.hit)
    }

    /// Whether a duplicate POST is possible by design here: only a stall between the
    /// self-fencing check and the socket write (DESIGN.md §3, the one residual window).
    pub fn duplicate_allowed(&self) -> bool {
        self.fault == Fault::Delay
            && self.point.event == Event::E6
            && self.point.phase == Phase::Before
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}@{}", self.fault, self.point, self.hit)
    }
}

/// The single-fault matrix: every event at the phase where a fault bites, × PASS, DELAY,
/// FAIL; plus E6.before, the self-fencing window.
pub fn matrix() -> Vec<Scenario> {
    let points: [(Event, Phase, u64); 10] = [
        (Event::E1, Phase::Before, 2),
        (Event::E2, Phase::After, 1),
        (Event::E3, Phase::After, 3),
        (Event::E4, Phase::After, 3),
        (Event::E5, Phase::After, 3),
        (Event::E6, Phase::Before, 3),
        (Event::E6, Phase::After, 3),
        (Event::E7, Phase::Before, 3),
        (Event::E8, Phase::Before, 3),
        (Event::E9, Phase::Before, 2),
    ];
    let mut scenarios = Vec::new();
    for (event, phase, hit) in points {
        for fault in [Fault::Pass, Fault::Delay, Fault::Fail] {
            scenarios.push(Scenario {
                point: Point { event, phase },
                hit,
                fault,
            });
        }
    }
    scenarios
}

/// One row of the result table.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// What the table calls it, e.g. `DELAY E5.after@3` or `NET ledger: reset`.
    pub name: String,
    /// The command that runs it again.
    pub replay: String,
    /// Whether a duplicate POST is allowed by design (the self-fencing window).
    pub duplicate_allowed: bool,
    /// The rule fired in the faulted instance (coverage).
    pub fired: bool,
    pub findings: Findings,
    /// Writes the instances' fencing refused (`dltsub_fenced_writes_rejected_total` of
    /// the instances alive at the end): stale writes stopped, as opposed to accepted.
    pub stale_rejected: u64,
    /// From the fault until every service the faulted instance held had another holder.
    pub failover: Option<Duration>,
    pub elapsed: Duration,
    /// Why the scenario failed, if it did.
    pub problems: Vec<String>,
    /// Where the logs are kept when it failed.
    pub kept: Option<std::path::PathBuf>,
}

impl Outcome {
    /// No invariant broken and the planned fault fired (coverage).
    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.fired
    }

    /// No invariant broken; the fault may not have been reached (random schedules draw
    /// hits a run may not get to).
    pub fn invariants_held(&self) -> bool {
        self.problems.is_empty()
    }
}

const SERVICES: u64 = 4;
const BATCHES_PER_SERVICE: u64 = 16;
/// How long the drain may take after the fault.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn batch(service: u64, n: u64) -> NewBatch {
    let batch_id = format!("{service:064x}{n:064x}");
    // One batch per service is rejected by the ledger.
    let payload = if n == 5 {
        format!("invalid batch {n}")
    } else {
        format!("batch {n}")
    };
    let list = BatchList {
        batches: vec![Batch {
            header: vec![service as u8, n as u8],
            header_signature: batch_id.clone(),
            transactions: vec![Transaction {
                header: vec![1],
                header_signature: format!("{:064x}{:064x}", service + 1000, n),
                payload: payload.into_bytes(),
            }],
            trace: false,
        }],
    };
    NewBatch {
        batch_id,
        serialized_batch: list.encode_to_vec(),
    }
}

/// Runs one scenario on `backend` and checks the invariants.
pub async fn run_scenario(backend: TestBackend, scenario: Scenario) -> anyhow::Result<Outcome> {
    run_scenario_with(backend, scenario, None).await
}

/// [`run_scenario`], the faulted instance running the deliberately broken variant
/// `broken` (see `dltsub_chaos_points::broken`) if given.
pub async fn run_scenario_with(
    backend: TestBackend,
    scenario: Scenario,
    broken: Option<&str>,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut cluster = Cluster::start(backend).await?;
    cluster.broken = broken.map(str::to_string);
    enqueue_workload(&cluster).await?;

    // The faulted instance starts alone, so it is the one that holds the services; the
    // second joins once the first has registered.
    let faulted = cluster.add_instance(&scenario.plan())?;
    // Only the faulted instance runs a broken variant.
    cluster.broken = None;
    let faulted_id = cluster.wait_registered(faulted).await?;
    cluster.add_instance("")?;
    let report = cluster.instances[faulted].report.clone();

    // Wait for the fault to fire (or for the work to finish without it).
    let fired_at = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((_, at_us)) = fired(&report).into_iter().next() {
                break Some(at_us);
            }
            if Instant::now() > deadline || unfinished(&cluster).await? == 0 {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let fault_instant = Instant::now();
    let held_at_fault = cluster.held_by(&faulted_id).await?;
    // Whether the holder stopped with batches mid-submission (for the failure message: a
    // dead holder's services move at the fast expiry either way).
    let mid_submission = cluster
        .store
        .count_unfinished_by_status()
        .await?
        .get(&dltsub_store::BatchStatus::Submitting)
        .is_some_and(|count| *count > 0);

    // Failover: every service the faulted instance held gets another holder.
    let mut failover = None;
    if fired_at.is_some() && matches!(scenario.fault, Fault::Delay | Fault::Fail) {
        let limit = SLOW_EXPIRY + Duration::from_secs(10);
        while fault_instant.elapsed() < limit {
            let still: Vec<String> = cluster.held_by(&faulted_id).await?;
            if held_at_fault.iter().all(|service| !still.contains(service)) {
                failover = Some(fault_instant.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if scenario.fault == Fault::Delay {
            // Stay stopped past the slow expiry, then carry on with stale state.
            let resume_at = SLOW_EXPIRY + Duration::from_secs(1);
            if let Some(wait) = resume_at.checked_sub(fault_instant.elapsed()) {
                tokio::time::sleep(wait).await;
            }
            cluster.signal(faulted, "-CONT").await;
        }
    }

    let Drained {
        findings,
        mut problems,
        stale_rejected,
    } = drain_and_check(&mut cluster, scenario.duplicate_allowed()).await?;
    // A dead holder's services move within the fast expiry plus a tick, mid-submission
    // or not (its process is seen gone) — measured from the fault's report.
    if scenario.fault == Fault::Fail && fired_at.is_some() && !held_at_fault.is_empty() {
        // One tick, plus the jitter between ticks and the harness's own polling.
        let bound = FAST_EXPIRY + RENEW_INTERVAL * 2;
        match failover {
            Some(after) if after <= bound => {}
            Some(after) => problems.push(format!(
                "failover took {after:?}, over {bound:?} (fast expiry + tick){}",
                if mid_submission {
                    "; it died with batches mid-submission"
                } else {
                    ""
                }
            )),
            None => problems.push("the dead instance's services never moved".into()),
        }
    }
    let kept = if problems.is_empty() && fired_at.is_some() {
        None
    } else {
        Some(cluster.keep())
    };
    let mode = match scenario.fault {
        Fault::Pass => "pass",
        Fault::Delay => "delay",
        Fault::Fail => "fail",
        Fault::Error => "error",
    };
    let mut replay = format!(
        "cargo run -p chaos -- one --plan {}@{} --fault {mode}",
        scenario.point, scenario.hit
    );
    if let Some(broken) = broken {
        replay.push_str(&format!(" --broken {broken}"));
    }
    if backend == TestBackend::Sqlite {
        replay.push_str(" --backend sqlite");
    }
    Ok(Outcome {
        name: scenario.to_string(),
        replay,
        duplicate_allowed: scenario.duplicate_allowed(),
        fired: fired_at.is_some(),
        findings,
        stale_rejected,
        failover,
        elapsed: started.elapsed(),
        problems,
        kept,
    })
}

/// The workload: `SERVICES` services of `BATCHES_PER_SERVICE` batches, one of each
/// service invalid.
pub(crate) async fn enqueue_workload(cluster: &Cluster) -> anyhow::Result<()> {
    for service in 0..SERVICES {
        let batches: Vec<NewBatch> = (0..BATCHES_PER_SERVICE)
            .map(|n| batch(service, n))
            .collect();
        cluster
            .store
            .enqueue(&format!("chaos::svc{service}"), &batches)
            .await?;
    }
    Ok(())
}

/// What [`drain_and_check`] found.
pub(crate) struct Drained {
    pub findings: Findings,
    /// A failed drain, any broken invariant, and duplicate POSTs unless allowed.
    pub problems: Vec<String>,
    pub stale_rejected: u64,
}

/// Waits for every batch to be final, lets a resumed instance act on its stale state,
/// reads the fencing counters, stops the cluster and runs the checker. A duplicate POST
/// is a problem unless `duplicate_allowed` (a DELAY in the self-fencing window).
pub(crate) async fn drain_and_check(
    cluster: &mut Cluster,
    duplicate_allowed: bool,
) -> anyhow::Result<Drained> {
    let drained = cluster
        .wait_until("every batch to be final", DRAIN_TIMEOUT, || async {
            Ok(unfinished(cluster).await? == 0)
        })
        .await;
    tokio::time::sleep(RENEW_INTERVAL * 2).await;
    let stale_rejected = cluster.fenced_writes_rejected().await;
    cluster.stop_all().await;
    let findings = check(&cluster.store, &cluster.ledger).await?;
    let mut problems = Vec::new();
    if let Err(error) = drained {
        problems.push(error.to_string());
    }
    if !findings.invariants_hold() {
        problems.extend(findings.details.iter().cloned());
    }
    if findings.duplicate_batches > 0 && !duplicate_allowed {
        problems.push(format!(
            "{} duplicate POSTs where self-fencing must prevent them",
            findings.duplicate_batches
        ));
    }
    Ok(Drained {
        findings,
        problems,
        stale_rejected,
    })
}

pub(crate) async fn unfinished(cluster: &Cluster) -> anyhow::Result<i64> {
    Ok(cluster
        .store
        .count_unfinished_by_status()
        .await?
        .values()
        .sum())
}
