//! The named event points of a submission (DESIGN.md §7), where the chaos harness injects
//! faults into a real `dltsub` process.
//!
//! Built without the `enabled` feature (production), [`reached`] is an empty inline
//! function. Built with it, the process reads a plan from `DLTSUB_CHAOS` once, e.g.
//! `E6.after@2=stop,E1.before=stall:5s`: at the 2nd time this process reaches the point
//! after E6 it stops itself (SIGSTOP; the harness sends SIGCONT), and so on. Before acting,
//! it appends one line to the file named by `DLTSUB_CHAOS_REPORT` so the harness knows the
//! point was reached (and can synchronise on it).
//!
//! Plan grammar: rules separated by commas; a rule is `E<1-9>.<before|after>[@<n>]=<action>`
//! (`n` counts from 1, default 1); an action is `pass`, `stall:<duration>` (this task
//! sleeps), `stop` (SIGSTOP to the whole process), `kill` (SIGKILL to itself) or `error` (the
//! caller gets [`Injected`] and takes its failure path).

use std::fmt;

/// The events of one batch's submission, in order (DESIGN.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// The queuer requests claims from the database (every claim tick).
    E1,
    /// The queuer gets a claim (a tick acquired services).
    E2,
    /// The submitter reads submittable batches from the database.
    E3,
    /// The batches are queued for submission (grouped, handed to the POST path).
    E4,
    /// Submission begins: batches marked SUBMITTING, the observer will be told.
    E5,
    /// The POST to the ledger begins.
    E6,
    /// The ledger's HTTP response is received and handed to the observer.
    E7,
    /// The observer records a status.
    E8,
    /// The queuer requests renewal of the claims it holds.
    E9,
}

impl Event {
    pub const ALL: [Event; 9] = [
        Event::E1,
        Event::E2,
        Event::E3,
        Event::E4,
        Event::E5,
        Event::E6,
        Event::E7,
        Event::E8,
        Event::E9,
    ];
}

/// Just before the event, or just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Before,
    After,
}

/// One point: an event and a phase, written `E6.after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    pub event: Event,
    pub phase: Phase,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match self.phase {
            Phase::Before => "before",
            Phase::After => "after",
        };
        write!(f, "{:?}.{phase}", self.event)
    }
}

impl std::str::FromStr for Point {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (event, phase) = text
            .split_once('.')
            .ok_or_else(|| format!("{text:?}: expected E<1-9>.<before|after>"))?;
        let event = Event::ALL
            .into_iter()
            .find(|e| format!("{e:?}") == event)
            .ok_or_else(|| format!("{text:?}: unknown event {event:?} (E1 to E9)"))?;
        let phase = match phase {
            "before" => Phase::Before,
            "after" => Phase::After,
            other => return Err(format!("{text:?}: unknown phase {other:?} (before, after)")),
        };
        Ok(Point { event, phase })
    }
}

/// What a rule does when its point is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Pass,
    Stall(std::time::Duration),
    Stop,
    Kill,
    Error,
}

/// One rule of a plan: at the `hit`-th time `point` is reached, do `action`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub point: Point,
    pub hit: u64,
    pub action: Action,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}=", self.point, self.hit)?;
        match &self.action {
            Action::Pass => write!(f, "pass"),
            Action::Stall(duration) => write!(f, "stall:{}ms", duration.as_millis()),
            Action::Stop => write!(f, "stop"),
            Action::Kill => write!(f, "kill"),
            Action::Error => write!(f, "error"),
        }
    }
}

/// Parses a plan (see the module documentation). Empty text is an empty plan.
pub fn parse_plan(text: &str) -> Result<Vec<Rule>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|rule| !rule.is_empty())
        .map(parse_rule)
        .collect()
}

fn parse_rule(text: &str) -> Result<Rule, String> {
    let (target, action) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected POINT[@N]=ACTION"))?;
    let (point, hit) = match target.split_once('@') {
        Some((point, hit)) => {
            let hit: u64 = hit
                .parse()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{text:?}: @{hit} is not a count from 1"))?;
            (point, hit)
        }
        None => (target, 1),
    };
    let action = match action {
        "pass" => Action::Pass,
        "stop" => Action::Stop,
        "kill" => Action::Kill,
        "error" => Action::Error,
        other => match other.strip_prefix("stall:") {
            Some(duration) => Action::Stall(parse_duration(duration).ok_or_else(|| {
                format!("{text:?}: {duration:?} is not a duration like 500ms or 5s")
            })?),
            None => {
                return Err(format!(
                    "{text:?}: unknown action {other:?} (pass, stall:DURATION, stop, kill, error)"
                ));
            }
        },
    };
    Ok(Rule {
        point: point.parse()?,
        hit,
        action,
    })
}

/// `<n>ms` or `<n>s`, at most `u64::MAX` milliseconds: a rule prints its stall in
/// milliseconds (the report lines), and what it prints must parse back.
fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let number: u64 = number.parse().ok()?;
    let millis = match unit {
        "ms" => number,
        "s" => number.checked_mul(1_000)?,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(millis))
}

/// The failure a point injects: the caller takes the path it takes for a real error there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    pub point: Point,
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chaos: error injected at {}", self.point)
    }
}

impl std::error::Error for Injected {}

/// Marks that this process reached `point`; with the `enabled` feature, does what the
/// plan says for this hit.
#[cfg(not(feature = "enabled"))]
#[inline(always)]
pub async fn reached(event: Event, phase: Phase) -> Result<(), Injected> {
    let _ = (event, phase);
    Ok(())
}

#[cfg(feature = "enabled")]
pub use enabled::reached;

#[cfg(feature = "enabled")]
mod enabled {
    use std::collections::HashMap;
    use std::io::Write;
    use std::sync::{Mutex, OnceLock};

    use super::{Action, Event, Injected, Phase, Point, Rule, parse_plan};

    struct Plan {
        rules: Vec<Rule>,
        hits: Mutex<HashMap<Point, u64>>,
        report: Option<std::path::PathBuf>,
    }

    fn plan() -> &'static Plan {
        static PLAN: OnceLock<Plan> = OnceLock::new();
        PLAN.get_or_init(|| {
            let text = std::env::var("DLTSUB_CHAOS").unwrap_or_default();
            let rules = parse_plan(&text).unwrap_or_else(|problem| {
                // A broken plan must not pass silently as "no faults".
                eprintln!("error: invalid DLTSUB_CHAOS: {problem}");
                std::process::exit(2);
            });
            Plan {
                rules,
                hits: Mutex::new(HashMap::new()),
                report: std::env::var_os("DLTSUB_CHAOS_REPORT").map(Into::into),
            }
        })
    }

    /// Validates the plan at start-up (exits 2 on a bad one) instead of at the first point.
    pub fn init() {
        plan();
    }

    pub async fn reached(event: Event, phase: Phase) -> Result<(), Injected> {
        let plan = plan();
        if plan.rules.is_empty() {
            return Ok(());
        }
        let point = Point { event, phase };
        let hit = {
            let mut hits = plan.hits.lock().unwrap_or_else(|e| e.into_inner());
            let count = hits.entry(point).or_default();
            *count += 1;
            *count
        };
        let Some(rule) = plan
            .rules
            .iter()
            .find(|rule| rule.point == point && rule.hit == hit)
        else {
            return Ok(());
        };
        report(plan, rule);
        match &rule.action {
            Action::Pass => Ok(()),
            Action::Stall(duration) => {
                tokio::time::sleep(*duration).await;
                Ok(())
            }
            Action::Stop => {
                signal_self("-STOP");
                Ok(())
            }
            Action::Kill => {
                signal_self("-KILL");
                // SIGKILL cannot be caught; wait for it rather than go on.
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
            Action::Error => Err(Injected { point }),
        }
    }

    /// One JSON line per fired rule, written and flushed before the action, so that the
    /// harness sees it even if the action is a SIGKILL.
    fn report(plan: &Plan, rule: &Rule) {
        let at_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        let line = format!(
            "{{\"pid\":{},\"rule\":\"{rule}\",\"point\":\"{}\",\"hit\":{},\"at_us\":{at_us}}}\n",
            std::process::id(),
            rule.point,
            rule.hit
        );
        eprint!("chaos: {line}");
        if let Some(path) = &plan.report {
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut file| file.write_all(line.as_bytes()));
            if let Err(error) = written {
                eprintln!("chaos: cannot write {}: {error}", path.display());
            }
        }
    }

    /// Signals this process through `kill(1)` (the workspace forbids unsafe code, so no
    /// direct `kill(2)`). For SIGSTOP the call returns once the harness sends SIGCONT.
    fn signal_self(signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &std::process::id().to_string()])
            .status();
        if let Err(error) = status {
            eprintln!("chaos: cannot signal myself with {signal}: {error}");
        }
    }
}

/// Whether this process runs the deliberately broken variant `name`, named in
/// `DLTSUB_CHAOS_BROKEN` (comma-separated). Chaos builds only, to prove the checker can
/// fail; always false otherwise.
#[cfg(feature = "enabled")]
pub fn broken(name: &str) -> bool {
    static BROKEN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    BROKEN
        .get_or_init(|| {
            std::env::var("DLTSUB_CHAOS_BROKEN")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .iter()
        .any(|b| b == name)
}

/// Production builds are never broken on purpose.
#[cfg(not(feature = "enabled"))]
#[inline(always)]
pub fn broken(name: &str) -> bool {
    let _ = name;
    false
}

/// Reads and validates the plan now (a bad plan exits 2) rather than at the first point.
#[cfg(feature = "enabled")]
pub fn init() {
    enabled::init();
}

/// Without the feature there is no plan to read.
#[cfg(not(feature = "enabled"))]
pub fn init() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_print_back() {
        let rules =
            parse_plan("E6.after@2=stop, E1.before=stall:5s,E8.after@3=error,E9.before=kill")
                .unwrap();
        let printed: Vec<String> = rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            [
                "E6.after@2=stop",
                "E1.before@1=stall:5000ms",
                "E8.after@3=error",
                "E9.before@1=kill"
            ]
        );
        assert_eq!(parse_plan("").unwrap(), vec![]);
        // The longest stall there is prints and parses back.
        let longest = parse_plan("E1.after=stall:18446744073709551615ms").unwrap();
        assert_eq!(parse_plan(&longest[0].to_string()).unwrap(), longest);
        let reparsed = parse_plan(&printed.join(",")).unwrap();
        assert_eq!(reparsed, rules);
    }

    #[test]
    fn bad_plans_name_the_problem() {
        for (plan, problem) in [
            ("E0.before=stop", "unknown event"),
            ("E6.during=stop", "unknown phase"),
            ("E6.after@0=stop", "not a count"),
            ("E6.after=explode", "unknown action"),
            ("E6.after=stall:soon", "not a duration"),
            // Found by the chaos_plan fuzz target: printed in milliseconds, this stall
            // would not parse back.
            ("E6.before=stall:44444444444444445s", "not a duration"),
            ("E6.after", "expected POINT"),
        ] {
            let error = parse_plan(plan).unwrap_err();
            assert!(error.contains(problem), "{plan}: {error}");
        }
    }
}
