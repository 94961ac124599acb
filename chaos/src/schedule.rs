//! Random multi-fault schedules: several faults on several instances of one cluster, all
//! drawn from a seed, so any schedule replays from its seed alone.
//!
//! A cluster of [`INSTANCES`] instances gets one to [`MAX_FAULTS`] faults, each a point of
//! the single-fault matrix with a random hit and PASS, DELAY or FAIL, on a random instance.
//! The harness plays the operator: a stopped instance gets SIGCONT past the slow expiry,
//! and a killed one is replaced by a fresh instance (a supervisor's restart), so the
//! cluster always recovers. Then it drains and the checker runs, as for one fault.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use dltsub_store::testing::TestBackend;

use crate::cluster::{Cluster, SLOW_EXPIRY, fired};
use crate::scenario::{
    Drained, Outcome, Scenario, drain_and_check, enqueue_workload, matrix, unfinished,
};

pub const INSTANCES: usize = 3;
pub const MAX_FAULTS: u64 = 3;
/// How long the faults may take to fire and heal before the drain starts.
const FAULT_PHASE: Duration = Duration::from_secs(40);

/// The faults of one run, each on one of the first instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    /// (instance index, fault), at most one fault per point and instance.
    pub faults: Vec<(usize, Scenario)>,
}

/// xorshift64*: a small reproducible generator (the schedule must replay from the seed on
/// any build, so no library generator whose algorithm may change).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // One splitmix64 step spreads neighbouring seeds apart (and xorshift needs a
        // nonzero state).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)).max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A seed from any text: a number is itself, anything else (a commit hash) is hashed.
pub fn seed_from(text: &str) -> u64 {
    text.parse().unwrap_or_else(|_| {
        // FNV-1a.
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}

impl Schedule {
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let points = matrix();
        let count = 1 + rng.below(MAX_FAULTS);
        let mut faults: Vec<(usize, Scenario)> = Vec::new();
        let mut taken = BTreeSet::new();
        while (faults.len() as u64) < count {
            let instance = rng.below(INSTANCES as u64) as usize;
            let mut scenario = points[rng.below(points.len() as u64) as usize];
            // Early hits: a small workload reaches each point only a few times per
            // instance.
            scenario.hit = 1 + rng.below(3);
            // Two rules at one point of one instance would shadow each other.
            if taken.insert((instance, scenario.point.to_string())) {
                faults.push((instance, scenario));
            }
        }
        Self { seed, faults }
    }

    /// The chaos plan of instance `index` (empty if it has no fault).
    pub fn plan_for(&self, index: usize) -> String {
        self.faults
            .iter()
            .filter(|(instance, _)| *instance == index)
            .map(|(_, scenario)| scenario.plan())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A duplicate POST is possible by design only with a DELAY in the self-fencing
    /// window (see [`Scenario::duplicate_allowed`]).
    pub fn duplicate_allowed(&self) -> bool {
        self.faults
            .iter()
            .any(|(_, scenario)| scenario.duplicate_allowed())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(instance, scenario)| format!("i{instance} {scenario}"))
            .collect();
        write!(f, "{}", faults.join(" + "))
    }
}

/// Runs one schedule on `backend` and checks the invariants.
pub async fn run_schedule(backend: TestBackend, schedule: &Schedule) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut cluster = Cluster::start(backend).await?;
    enqueue_workload(&cluster).await?;
    // All start together, so each holds a share of the services from the start and
    // reaches its points.
    for index in 0..INSTANCES {
        cluster.add_instance(&schedule.plan_for(index))?;
    }

    // Play the operator until every fault fired and healed, or the work is done.
    let mut seen: Vec<usize> = vec![0; INSTANCES];
    let mut stopped: Vec<(usize, Instant)> = Vec::new();
    let mut fired_rules = 0;
    let deadline = Instant::now() + FAULT_PHASE;
    loop {
        for index in 0..INSTANCES {
            let rules = fired(&cluster.instances[index].report);
            for (rule, _) in &rules[seen[index]..] {
                fired_rules += 1;
                if rule.ends_with("=stop") {
                    stopped.push((index, Instant::now() + SLOW_EXPIRY + Duration::from_secs(1)));
                } else if rule.ends_with("=kill") {
                    // A supervisor restarts it, without faults.
                    cluster.add_instance("")?;
                }
            }
            seen[index] = rules.len();
        }
        let mut still_stopped = Vec::new();
        for (index, resume_at) in stopped.drain(..) {
            if Instant::now() >= resume_at {
                cluster.signal(index, "-CONT").await;
            } else {
                still_stopped.push((index, resume_at));
            }
        }
        stopped = still_stopped;
        let all_fired = fired_rules >= schedule.faults.len();
        let done = stopped.is_empty() && (all_fired || unfinished(&cluster).await? == 0);
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (index, _) in stopped {
        cluster.signal(index, "-CONT").await;
    }

    let Drained {
        findings,
        problems,
        stale_rejected,
    } = drain_and_check(&mut cluster, schedule.duplicate_allowed()).await?;
    let all_fired = fired_rules >= schedule.faults.len();
    // Logs are kept for broken invariants only: a soak reaches faults by chance.
    let kept = if problems.is_empty() {
        None
    } else {
        Some(cluster.keep())
    };
    let mut replay = format!("cargo run -p chaos -- schedule --seed {}", schedule.seed);
    if backend == TestBackend::Sqlite {
        replay.push_str(" --backend sqlite");
    }
    Ok(Outcome {
        name: format!("seed {} ({} faults)", schedule.seed, schedule.faults.len()),
        replay,
        duplicate_allowed: schedule.duplicate_allowed(),
        fired: all_fired,
        findings,
        stale_rejected,
        failover: None,
        elapsed: started.elapsed(),
        problems,
        kept,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Fault;
    use dltsub_chaos_points::{Event, Phase};

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        for seed in [1, 42, seed_from("5446a9f0c0ffee")] {
            assert_eq!(Schedule::from_seed(seed), Schedule::from_seed(seed));
        }
        let many: BTreeSet<String> = (0..50)
            .map(|seed| Schedule::from_seed(seed).to_string())
            .collect();
        assert!(many.len() > 40, "seeds give different schedules");
    }

    #[test]
    fn schedules_have_one_to_three_faults_on_the_instances() {
        let mut sizes = BTreeSet::new();
        for seed in 0..200 {
            let schedule = Schedule::from_seed(seed);
            sizes.insert(schedule.faults.len());
            assert!(
                schedule
                    .faults
                    .iter()
                    .all(|(i, s)| *i < INSTANCES && s.hit >= 1)
            );
            let plans: Vec<String> = (0..INSTANCES).map(|i| schedule.plan_for(i)).collect();
            let rules: usize = plans
                .iter()
                .map(|plan| plan.split(',').filter(|r| !r.is_empty()).count())
                .sum();
            assert_eq!(rules, schedule.faults.len(), "{plans:?}");
            for plan in &plans {
                dltsub_chaos_points::parse_plan(plan).expect("a valid plan");
            }
        }
        assert_eq!(sizes, BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn only_a_delay_in_the_fencing_window_allows_duplicates() {
        let window = Scenario {
            point: dltsub_chaos_points::Point {
                event: Event::E6,
                phase: Phase::Before,
            },
            hit: 1,
            fault: Fault::Delay,
        };
        let mut schedule = Schedule {
            seed: 0,
            faults: vec![(
                0,
                Scenario {
                    fault: Fault::Fail,
                    ..window
                },
            )],
        };
        assert!(!schedule.duplicate_allowed());
        schedule.faults.push((1, window));
        assert!(schedule.duplicate_allowed());
    }

    #[test]
    fn commit_hashes_and_numbers_make_seeds() {
        assert_eq!(seed_from("42"), 42);
        assert_ne!(
            seed_from("5446a9f0000000000000000000000000000000000"),
            seed_from("eddedbb0000000000000000000000000000000000")
        );
    }
}
