//! What a devnet is told at start: dialect, seed, limits, and the fault knobs (which can also
//! be changed at run time through `PUT /_devnet/faults`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which ledger API devnet imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// Splinter scabbard: `/scabbard/{circuit}/{service}/…`, one ledger per `circuit::service`.
    Scabbard,
    /// Sawtooth REST API: `/batches`, `/batch_statuses`, one ledger.
    Sawtooth,
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dialect::Scabbard => "scabbard",
            Dialect::Sawtooth => "sawtooth",
        })
    }
}

/// The ledger key of the one Sawtooth ledger (scabbard ledgers are keyed `circuit::service`).
pub const SAWTOOTH_LEDGER: &str = "sawtooth";

/// A latency drawn uniformly from `min..=max`. Written `50ms` (fixed) or `10ms..200ms`, on the
/// command line and in the faults JSON alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    pub min: Duration,
    pub max: Duration,
}

impl Latency {
    pub const ZERO: Latency = Latency {
        min: Duration::ZERO,
        max: Duration::ZERO,
    };

    pub fn fixed(latency: Duration) -> Self {
        Self {
            min: latency,
            max: latency,
        }
    }

    pub fn between(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// The latency at `unit` (a draw in `[0, 1)`) of the range.
    pub(crate) fn sample(self, unit: f64) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        self.min + (self.max - self.min).mul_f64(unit)
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", humantime::format_duration(self.min))
        } else {
            write!(
                f,
                "{}..{}",
                humantime::format_duration(self.min),
                humantime::format_duration(self.max)
            )
        }
    }
}

impl FromStr for Latency {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| {
            humantime::parse_duration(part.trim()).map_err(|err| ConfigError::Latency {
                text: text.to_owned(),
                reason: err.to_string(),
            })
        };
        let latency = match text.split_once("..") {
            Some((min, max)) => Latency::between(parse(min)?, parse(max)?),
            None => Latency::fixed(parse(text)?),
        };
        if latency.min > latency.max {
            return Err(ConfigError::Latency {
                text: text.to_owned(),
                reason: "the minimum is above the maximum".into(),
            });
        }
        Ok(latency)
    }
}

impl Serialize for Latency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The fault knobs. Probabilities are in `[0, 1]`; every draw comes from the seed (see the
/// crate documentation), so a run with the same seed and the same request order fails the
/// same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Delay before any ledger route answers.
    pub response_latency: Latency,
    /// Time from acceptance to commit; execution (Pending → Valid/Invalid) happens halfway.
    pub commit_latency: Latency,
    /// Fraction of batches made Invalid at random (on top of the `invalid` payload rule).
    pub invalid_fraction: f64,
    /// Probability that a valid POST is answered 500 without being accepted.
    pub error_500_before: f64,
    /// Probability that a valid POST is answered 503 without being accepted.
    pub error_503_before: f64,
    /// Probability that a POST is accepted, its batches committed, and then answered 500.
    pub error_500_after_commit: f64,
    /// Probability that a POST is accepted, its batches committed, and then the connection is
    /// closed without any response.
    pub drop_after_commit: f64,
    /// A full pause: ledger routes do not answer and nothing executes or commits until the
    /// pause is lifted. The `/_devnet` routes keep working.
    pub paused: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            response_latency: Latency::ZERO,
            commit_latency: Latency::fixed(Duration::from_millis(100)),
            invalid_fraction: 0.0,
            error_500_before: 0.0,
            error_503_before: 0.0,
            error_500_after_commit: 0.0,
            drop_after_commit: 0.0,
            paused: false,
        }
    }
}

impl Faults {
    /// Checks every probability, and that the ones drawn together sum to at most 1.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let probabilities = [
            ("invalid_fraction", self.invalid_fraction),
            ("error_500_before", self.error_500_before),
            ("error_503_before", self.error_503_before),
            ("error_500_after_commit", self.error_500_after_commit),
            ("drop_after_commit", self.drop_after_commit),
            (
                "error_500_before + error_503_before",
                self.error_500_before + self.error_503_before,
            ),
            (
                "error_500_after_commit + drop_after_commit",
                self.error_500_after_commit + self.drop_after_commit,
            ),
        ];
        for (name, value) in probabilities {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::Probability { name, value });
            }
        }
        Ok(())
    }

    /// Applies the fields present in `patch`.
    pub fn apply(&mut self, patch: &FaultsPatch) {
        if let Some(v) = patch.response_latency {
            self.response_latency = v;
        }
        if let Some(v) = patch.commit_latency {
            self.commit_latency = v;
        }
        if let Some(v) = patch.invalid_fraction {
            self.invalid_fraction = v;
        }
        if let Some(v) = patch.error_500_before {
            self.error_500_before = v;
        }
        if let Some(v) = patch.error_503_before {
            self.error_503_before = v;
        }
        if let Some(v) = patch.error_500_after_commit {
            self.error_500_after_commit = v;
        }
        if let Some(v) = patch.drop_after_commit {
            self.drop_after_commit = v;
        }
        if let Some(v) = patch.paused {
            self.paused = v;
        }
    }
}

/// A partial update of [`Faults`], the body of `PUT /_devnet/faults`: absent fields keep
/// their value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_latency: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_latency: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_500_before: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_503_before: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_500_after_commit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_after_commit: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Everything a devnet is started with.
#[derive(Debug, Clone, PartialEq)]
pub struct DevnetConfig {
    pub dialect: Dialect,
    /// Seed of every random choice.
    pub seed: u64,
    /// The fault knobs at start.
    pub faults: Faults,
    /// Statuses remembered per ledger; older ids read Unknown (the real nodes keep 100).
    pub history_limit: usize,
    /// Batches in flight (accepted, neither committed nor invalid) at which a ledger answers
    /// 429.
    pub backpressure_high: usize,
    /// Scabbard accepts again only once fewer than this many are in flight (hysteresis).
    /// Sawtooth has no hysteresis: it accepts as soon as it is below `backpressure_high`.
    pub backpressure_low: usize,
    /// Committed ids kept per ledger for `/_devnet/ledger` and Sawtooth's duplicate check;
    /// older ones are forgotten and counted.
    pub ledger_limit: usize,
    /// POSTs kept in the log of `/_devnet/posts`; older ones are forgotten and counted.
    pub post_log_limit: usize,
}

impl DevnetConfig {
    /// The defaults: seed 0, 100 ms commit latency, no faults, the real nodes' limits.
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            seed: 0,
            faults: Faults::default(),
            history_limit: 100,
            backpressure_high: 30,
            backpressure_low: 15,
            ledger_limit: 100_000,
            post_log_limit: 10_000,
        }
    }

    /// Checks the configuration once, at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.faults.validate()?;
        for (name, value) in [
            ("history_limit", self.history_limit),
            ("backpressure_high", self.backpressure_high),
            ("ledger_limit", self.ledger_limit),
            ("post_log_limit", self.post_log_limit),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.backpressure_low > self.backpressure_high {
            return Err(ConfigError::Backpressure {
                low: self.backpressure_low,
                high: self.backpressure_high,
            });
        }
        Ok(())
    }
}

/// A configuration devnet refuses.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("{name} must be a probability between 0 and 1, got {value}")]
    Probability { name: &'static str, value: f64 },
    #[error("invalid latency {text:?} (expected e.g. 50ms or 10ms..200ms): {reason}")]
    Latency { text: String, reason: String },
    #[error("backpressure_low ({low}) must not exceed backpressure_high ({high})")]
    Backpressure { low: usize, high: usize },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

/// `dltsub devnet`: run a simulated ledger.
#[derive(Debug, Clone, clap::Args)]
pub struct DevnetArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8008")]
    pub listen: SocketAddr,
    /// Ledger API to imitate.
    #[arg(long, value_enum, default_value_t = Dialect::Scabbard)]
    pub dialect: Dialect,
    /// Seed of every random choice (latencies, faults, random invalid batches).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Acceptance to commit, e.g. 100ms or 50ms..500ms.
    #[arg(long, default_value = "100ms")]
    pub commit_latency: Latency,
    /// Delay before each ledger response, e.g. 0s or 1ms..20ms.
    #[arg(long, default_value = "0s")]
    pub response_latency: Latency,
    /// Fraction of batches made Invalid at random.
    #[arg(long, default_value_t = 0.0)]
    pub invalid_fraction: f64,
    /// Probability of a 500 before accepting a POST.
    #[arg(long, default_value_t = 0.0)]
    pub error_500_before: f64,
    /// Probability of a 503 before accepting a POST.
    #[arg(long, default_value_t = 0.0)]
    pub error_503_before: f64,
    /// Probability of a 500 after the POST's batches are committed.
    #[arg(long, default_value_t = 0.0)]
    pub error_500_after_commit: f64,
    /// Probability of closing the connection without a response after committing.
    #[arg(long, default_value_t = 0.0)]
    pub drop_after_commit: f64,
    /// Start paused (lift with `PUT /_devnet/faults {"paused": false}`).
    #[arg(long)]
    pub paused: bool,
    /// Statuses remembered per ledger.
    #[arg(long, default_value_t = 100)]
    pub history_limit: usize,
    /// Batches in flight at which a ledger answers 429.
    #[arg(long, default_value_t = 30)]
    pub backpressure_high: usize,
    /// Scabbard accepts again below this many in flight.
    #[arg(long, default_value_t = 15)]
    pub backpressure_low: usize,
    /// Committed ids kept per ledger for inspection.
    #[arg(long, default_value_t = 100_000)]
    pub ledger_limit: usize,
    /// POSTs kept in the inspection log.
    #[arg(long, default_value_t = 10_000)]
    pub post_log_limit: usize,
}

impl DevnetArgs {
    /// The validated configuration these flags describe.
    pub fn config(&self) -> Result<DevnetConfig, ConfigError> {
        let config = DevnetConfig {
            dialect: self.dialect,
            seed: self.seed,
            faults: Faults {
                response_latency: self.response_latency,
                commit_latency: self.commit_latency,
                invalid_fraction: self.invalid_fraction,
                error_500_before: self.error_500_before,
                error_503_before: self.error_503_before,
                error_500_after_commit: self.error_500_after_commit,
                drop_after_commit: self.drop_after_commit,
                paused: self.paused,
            },
            history_limit: self.history_limit,
            backpressure_high: self.backpressure_high,
            backpressure_low: self.backpressure_low,
            ledger_limit: self.ledger_limit,
            post_log_limit: self.post_log_limit,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevnetArgs,
    }

    #[test]
    fn latency_parses_and_prints_both_forms() {
        let fixed: Latency = "50ms".parse().unwrap();
        assert_eq!(fixed, Latency::fixed(Duration::from_millis(50)));
        assert_eq!(fixed.to_string(), "50ms");
        let range: Latency = "10ms..1s".parse().unwrap();
        assert_eq!(
            range,
            Latency::between(Duration::from_millis(10), Duration::from_secs(1))
        );
        assert_eq!(range.to_string(), "10ms..1s");
        assert_eq!(range.sample(0.5), Duration::from_millis(505));
        assert!("1s..10ms".parse::<Latency>().is_err());
        assert!("soon".parse::<Latency>().is_err());
    }

    #[test]
    fn flags_become_a_validated_config() {
        let cli = Cli::try_parse_from([
            "devnet",
            "--dialect",
            "sawtooth",
            "--seed",
            "7",
            "--commit-latency",
            "5ms..10ms",
            "--drop-after-commit",
            "0.25",
        ])
        .unwrap();
        let config = cli.args.config().unwrap();
        assert_eq!(config.dialect, Dialect::Sawtooth);
        assert_eq!(config.seed, 7);
        assert_eq!(config.faults.drop_after_commit, 0.25);
        assert_eq!(
            config.faults.commit_latency,
            Latency::between(Duration::from_millis(5), Duration::from_millis(10))
        );
        let bad = Cli::try_parse_from(["devnet", "--error-500-before", "1.5"]).unwrap();
        assert!(matches!(
            bad.args.config(),
            Err(ConfigError::Probability {
                name: "error_500_before",
                ..
            })
        ));
        let bad = Cli::try_parse_from(["devnet", "--backpressure-low", "31"]).unwrap();
        assert!(matches!(
            bad.args.config(),
            Err(ConfigError::Backpressure { .. })
        ));
    }

    #[test]
    fn faults_patch_changes_only_what_it_names() {
        let mut faults = Faults::default();
        let patch: FaultsPatch =
            serde_json::from_str(r#"{"paused": true, "commit_latency": "1s"}"#).unwrap();
        faults.apply(&patch);
        assert!(faults.paused);
        assert_eq!(
            faults.commit_latency,
            Latency::fixed(Duration::from_secs(1))
        );
        assert_eq!(faults.response_latency, Latency::ZERO);
        assert!(serde_json::from_str::<FaultsPatch>(r#"{"pause": true}"#).is_err());
    }
}
