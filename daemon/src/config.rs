//! dltsub's configuration: one table of keys, four layers, validated once at start-up.
//!
//! Each key may come from, lowest to highest precedence: its default, the TOML file given by
//! `--config` / `DLTSUB_CONFIG`, the environment variable `DLTSUB_<KEY>` and the flag
//! `--<key-with-dashes>`. Durations are humantime strings ("500ms", "30s", "3m"). Unknown keys
//! in the file and unknown `DLTSUB_*` variables are errors, so a typo never silently falls
//! back to a default. Every error is one line naming the key, where its value came from and
//! what is wrong with it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use dltsub_store::{DatabaseUrl, StoreOptions};

/// One configuration key: its name in the file, its documentation and its default.
struct Key {
    name: &'static str,
    default: &'static str,
    kind: Kind,
    doc: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Duration,
    Integer,
    Bool,
    Text,
}

/// Every key dltsub understands. Adding one here makes it a file key, an environment
/// variable and a flag at once; `Config::from_values` then gives it a type.
const KEYS: &[Key] = &[
    Key {
        name: "database_url",
        default: "sqlite://dltsub.db",
        kind: Kind::Text,
        doc: "Database: postgres://user:pass@host1,host2/db?target_session_attrs=read-write (production) or sqlite://PATH (one host)",
    },
    Key {
        name: "migrate_on_start",
        default: "true",
        kind: Kind::Bool,
        doc: "Apply pending migrations when `dltsub run` starts (safe with several instances starting at once)",
    },
    Key {
        name: "database_pool_size",
        default: "8",
        kind: Kind::Integer,
        doc: "Most database connections this process keeps open",
    },
    Key {
        name: "database_connect_timeout",
        default: "5s",
        kind: Kind::Duration,
        doc: "How long to wait for a database connection before failing the operation",
    },
    Key {
        name: "statement_timeout",
        default: "5s",
        kind: Kind::Duration,
        doc: "PostgreSQL statement_timeout of every session",
    },
    Key {
        name: "lock_timeout",
        default: "2s",
        kind: Kind::Duration,
        doc: "PostgreSQL lock_timeout of every session: a lock held by a stalled instance fails fast",
    },
    Key {
        name: "idle_in_transaction_timeout",
        default: "2s",
        kind: Kind::Duration,
        doc: "PostgreSQL idle_in_transaction_session_timeout: ends transactions of a stalled process (whose locks would otherwise hold up a takeover); at most fast_expiry. dltsub never idles inside a transaction, so only a stalled process meets it",
    },
    Key {
        name: "sqlite_busy_timeout",
        default: "5s",
        kind: Kind::Duration,
        doc: "SQLite busy_timeout: how long a writer waits for another process's write lock",
    },
    Key {
        name: "fast_expiry",
        default: "10s",
        kind: Kind::Duration,
        doc: "Claim fast expiry: after it, a silent holder's service is taken over if nothing of it is mid-submission",
    },
    Key {
        name: "slow_expiry",
        default: "60s",
        kind: Kind::Duration,
        doc: "Claim slow expiry: after it, a silent holder's service is taken over regardless",
    },
    Key {
        name: "renew_interval",
        default: "2s",
        kind: Kind::Duration,
        doc: "Claim tick: renew held claims, acquire new ones; at most fast_expiry / 3",
    },
    Key {
        name: "instance_capacity",
        default: "100",
        kind: Kind::Integer,
        doc: "This instance's weight in the fair share of services (relative to the others' capacity)",
    },
    Key {
        name: "instance_labels",
        default: "",
        kind: Kind::Text,
        doc: "This instance's labels for pinning, comma-separated (\"gpu,eu-west\"; lowercase letters, digits, '.', '-'): a service pinned to a label is held only by instances carrying it, a service excluding one never by them",
    },
    Key {
        name: "dlt_url",
        default: "http://127.0.0.1:8008",
        kind: Kind::Text,
        doc: "Base URL of the ledger's REST API (http or https)",
    },
    Key {
        name: "dlt_dialect",
        default: "scabbard",
        kind: Kind::Text,
        doc: "Ledger wire format: scabbard (Splinter) or sawtooth (Sawtooth REST API)",
    },
    Key {
        name: "dlt_request_timeout",
        default: "10s",
        kind: Kind::Duration,
        doc: "Timeout of one request to the ledger; must fit inside the slow window (slow_expiry - fast_expiry)",
    },
    Key {
        name: "instance_max_in_flight",
        default: "256",
        kind: Kind::Integer,
        doc: "Most batches this instance has between mark SUBMITTING and the ledger's answer",
    },
    Key {
        name: "submit_poll_interval",
        default: "100ms",
        kind: Kind::Duration,
        doc: "Look for submittable batches this often when no event wakes the submitter (batches accepted by another process on SQLite)",
    },
    Key {
        name: "status_poll_interval",
        default: "500ms",
        kind: Kind::Duration,
        doc: "Look for batches waiting for the ledger's verdict this often when nothing new was submitted",
    },
    Key {
        name: "status_wait",
        default: "5s",
        kind: Kind::Duration,
        doc: "The `wait` of a batch-status request: the ledger answers as soon as every asked batch is final, or after this",
    },
    Key {
        name: "unknown_grace",
        default: "30s",
        kind: Kind::Duration,
        doc: "A batch the ledger calls Unknown for this long without interruption is resubmitted; at least dlt_request_timeout",
    },
    Key {
        name: "retry_backoff_base",
        default: "200ms",
        kind: Kind::Duration,
        doc: "First retry delay after back-pressure or a refused connection (doubles per attempt, with jitter)",
    },
    Key {
        name: "retry_backoff_max",
        default: "30s",
        kind: Kind::Duration,
        doc: "Longest retry delay",
    },
    Key {
        name: "shutdown_timeout",
        default: "10s",
        kind: Kind::Duration,
        doc: "On SIGTERM, wait this long for in-flight POSTs before releasing claims and exiting",
    },
    Key {
        name: "shutdown_delay",
        default: "0s",
        kind: Kind::Duration,
        doc: "On SIGTERM, first keep serving requests this long while /readyz answers 503, so a load balancer takes the instance out of rotation before its listener closes; behind one, set it above the health check's interval × fall count (0s: close at once)",
    },
    Key {
        name: "sawtooth_service_id",
        default: "sawtooth",
        kind: Kind::Text,
        doc: "The service of batches POSTed to the Sawtooth route /batches without ?service_id=",
    },
    Key {
        name: "max_queued_per_service",
        default: "10000",
        kind: Kind::Integer,
        doc: "Most unfinished batches a service may have; a submission beyond it answers 429 like the ledgers (0: no cap)",
    },
    Key {
        name: "max_body_size",
        default: "16777216",
        kind: Kind::Integer,
        doc: "Largest request body in bytes (a BatchList); a larger one answers 413",
    },
    Key {
        name: "api_token",
        default: "",
        kind: Kind::Text,
        doc: "When set, the native API's operations and admin reads (/api/v1 POSTs, claims, instances) require `Authorization: Bearer <token>`; the ledger-compatible routes stay open",
    },
    Key {
        name: "max_batches_per_list",
        default: "1000",
        kind: Kind::Integer,
        doc: "Most batches in one submitted BatchList; a longer list answers 413 naming the field `batches`",
    },
    Key {
        name: "max_transactions_per_batch",
        default: "1000",
        kind: Kind::Integer,
        doc: "Most transactions in one submitted batch; a batch with more answers 413 naming the field `transactions`",
    },
    Key {
        name: "max_ids_per_query",
        default: "1000",
        kind: Kind::Integer,
        doc: "Most batch ids in one status request (scabbard and Sawtooth batch_statuses, /api/v1/batches), at most 1000; more answer 400 naming the field",
    },
    Key {
        name: "max_concurrent_waits",
        default: "256",
        kind: Kind::Integer,
        doc: "Most requests of this instance holding a `wait` at once (each re-reads the database every 25 ms); beyond it 429 with Retry-After",
    },
    Key {
        name: "max_wait",
        default: "300s",
        kind: Kind::Duration,
        doc: "Longest `wait` honoured (at most 300s): the ledger routes cap a longer one, the native API refuses it with 400",
    },
    Key {
        name: "max_queued_total",
        default: "1000000",
        kind: Kind::Integer,
        doc: "Most unfinished batches of all services together; a submission beyond it gets the route's back-pressure answer (429). Checked against a count at most 1s old per instance (0: no cap)",
    },
    Key {
        name: "rate_limit_per_client",
        default: "0",
        kind: Kind::Integer,
        doc: "Requests per second one client address may make to the API (token bucket; 0: off); beyond it 429 with Retry-After. Behind a proxy the address is the proxy's unless it is in trusted_proxies",
    },
    Key {
        name: "rate_limit_burst",
        default: "50",
        kind: Kind::Integer,
        doc: "Requests a client may make at once before rate_limit_per_client applies (the bucket's size)",
    },
    Key {
        name: "trusted_proxies",
        default: "",
        kind: Kind::Text,
        doc: "Proxy addresses, comma-separated IPs, whose X-Forwarded-For (its last address) names the client for rate limiting",
    },
    Key {
        name: "listen",
        default: "127.0.0.1:8080",
        kind: Kind::Text,
        doc: "Address of the HTTP API",
    },
    Key {
        name: "metrics_listen",
        default: "127.0.0.1:9464",
        kind: Kind::Text,
        doc: "Address of the Prometheus /metrics endpoint (its own port)",
    },
];

/// Environment variables with the `DLTSUB_` prefix that are not configuration keys.
const OTHER_ENV_VARS: &[&str] = &[
    "DLTSUB_CONFIG",
    "DLTSUB_LOG",
    "DLTSUB_TEST_DATABASE_URL",
    // The operator commands' --url.
    "DLTSUB_URL",
    // The chaos plan and report file of chaos builds (chaos/points).
    "DLTSUB_CHAOS",
    "DLTSUB_CHAOS_REPORT",
    "DLTSUB_CHAOS_BROKEN",
];

fn env_name(key: &str) -> String {
    format!("DLTSUB_{}", key.to_ascii_uppercase())
}

fn flag_name(key: &str) -> String {
    key.replace('_', "-")
}

/// Where a value came from, for error messages and `dltsub config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Default,
    File(PathBuf),
    Env(String),
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File(path) => write!(f, "config file {}", path.display()),
            Origin::Env(name) => write!(f, "environment {name}"),
            Origin::Flag(name) => write!(f, "flag --{name}"),
        }
    }
}

/// A configuration problem, printed as one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key} = {value:?} (from {origin}): {problem}")]
    BadValue {
        key: &'static str,
        value: String,
        origin: Origin,
        problem: String,
    },
    #[error("{problem}")]
    Inconsistent { problem: String },
    // The key and the name are escaped: a quoted TOML key may hold a newline, and every
    // error is one line.
    #[error("unknown key `{}` in config file {}; known keys: {}", key.escape_debug(), path.display(), known_keys())]
    UnknownFileKey { key: String, path: PathBuf },
    #[error("unknown environment variable {}; known: {}", name.escape_debug(), known_env_vars())]
    UnknownEnvVar { name: String },
    #[error("config file {}: {problem}", path.display())]
    File { path: PathBuf, problem: String },
}

fn known_keys() -> String {
    KEYS.iter()
        .map(|key| key.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn known_env_vars() -> String {
    KEYS.iter()
        .map(|key| env_name(key.name))
        .chain(OTHER_ENV_VARS.iter().map(ToString::to_string))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The configuration flags (`--config` and one per key), shared by the subcommands that
/// read the configuration. Built from `KEYS`, so the table is the only list of keys.
#[derive(Debug, Clone, Default)]
pub struct ConfigArgs {
    config_file: Option<PathBuf>,
    flags: BTreeMap<&'static str, String>,
}

impl ConfigArgs {
    /// Configuration flags given as `(key, value)` pairs, as if on the command line. For
    /// tests and embedders; an unknown key is an error.
    pub fn from_pairs(pairs: &[(&str, String)]) -> Result<Self, ConfigError> {
        let mut args = ConfigArgs::default();
        for (name, value) in pairs {
            let key = KEYS.iter().find(|key| key.name == *name).ok_or_else(|| {
                ConfigError::Inconsistent {
                    problem: format!(
                        "unknown configuration key `{name}`; known keys: {}",
                        known_keys()
                    ),
                }
            })?;
            args.flags.insert(key.name, value.clone());
        }
        Ok(args)
    }
}

impl Args for ConfigArgs {
    fn augment_args(command: Command) -> Command {
        let command = command.arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .help("TOML configuration file (also DLTSUB_CONFIG)")
                .value_parser(clap::value_parser!(PathBuf)),
        );
        KEYS.iter().fold(command, |command, key| {
            command.arg(
                Arg::new(key.name)
                    .long(flag_name(key.name))
                    .value_name(match key.kind {
                        Kind::Duration => "DURATION",
                        Kind::Integer => "N",
                        Kind::Bool => "BOOL",
                        Kind::Text => "VALUE",
                    })
                    .help(format!(
                        "{} [default: {}] [env: {}]",
                        key.doc,
                        key.default,
                        env_name(key.name)
                    ))
                    .help_heading("Configuration"),
            )
        })
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

impl FromArgMatches for ConfigArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ConfigArgs {
            config_file: matches.get_one::<PathBuf>("config").cloned(),
            flags: BTreeMap::new(),
        };
        for key in KEYS {
            if let Some(value) = matches.get_one::<String>(key.name) {
                args.flags.insert(key.name, value.clone());
            }
        }
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// Ledger wire formats dltsub speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DltDialect {
    Scabbard,
    Sawtooth,
}

impl FromStr for DltDialect {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "scabbard" => Ok(DltDialect::Scabbard),
            "sawtooth" => Ok(DltDialect::Sawtooth),
            _ => Err("expected scabbard or sawtooth".into()),
        }
    }
}

impl fmt::Display for DltDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DltDialect::Scabbard => "scabbard",
            DltDialect::Sawtooth => "sawtooth",
        })
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: DatabaseUrl,
    pub migrate_on_start: bool,
    pub database_pool_size: u32,
    pub database_connect_timeout: Duration,
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    pub idle_in_transaction_timeout: Duration,
    pub sqlite_busy_timeout: Duration,
    pub fast_expiry: Duration,
    pub slow_expiry: Duration,
    pub renew_interval: Duration,
    pub instance_capacity: u32,
    /// Labels for pinning; empty: none.
    pub instance_labels: Vec<String>,
    pub dlt_url: url::Url,
    pub dlt_dialect: DltDialect,
    pub dlt_request_timeout: Duration,
    pub instance_max_in_flight: u32,
    pub submit_poll_interval: Duration,
    pub status_poll_interval: Duration,
    pub status_wait: Duration,
    pub unknown_grace: Duration,
    pub retry_backoff_base: Duration,
    pub retry_backoff_max: Duration,
    pub shutdown_timeout: Duration,
    /// Zero: the listener closes at once on SIGTERM.
    pub shutdown_delay: Duration,
    pub sawtooth_service_id: String,
    /// `None`: no cap.
    pub max_queued_per_service: Option<u64>,
    pub max_body_size: u32,
    /// `None`: the native API is open.
    pub api_token: Option<String>,
    pub max_batches_per_list: u32,
    pub max_transactions_per_batch: u32,
    pub max_ids_per_query: u32,
    pub max_concurrent_waits: u32,
    pub max_wait: Duration,
    /// `None`: no cap.
    pub max_queued_total: Option<u64>,
    /// Requests per second per client; `None`: no rate limit.
    pub rate_limit_per_client: Option<u64>,
    pub rate_limit_burst: u32,
    pub trusted_proxies: Vec<std::net::IpAddr>,
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    /// Each key's value as text and where it came from, for `dltsub config`.
    sources: Vec<(&'static str, String, Origin)>,
}

/// The raw text of every key and its origin, after layering.
type RawValues = BTreeMap<&'static str, (String, Origin)>;

impl Config {
    /// Layers defaults, file, environment and flags, then validates.
    pub fn load(args: &ConfigArgs) -> Result<Self, ConfigError> {
        Self::load_from(args, std::env::vars())
    }

    /// Like [`Config::load`] with an explicit environment, for tests.
    pub fn load_from(
        args: &ConfigArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(name, _)| name.starts_with("DLTSUB_"))
            .collect();
        for name in env.keys() {
            let is_key = KEYS.iter().any(|key| env_name(key.name) == *name);
            if !is_key && !OTHER_ENV_VARS.contains(&name.as_str()) {
                return Err(ConfigError::UnknownEnvVar { name: name.clone() });
            }
        }

        let mut values: RawValues = KEYS
            .iter()
            .map(|key| (key.name, (key.default.to_string(), Origin::Default)))
            .collect();
        let file = args
            .config_file
            .clone()
            .or_else(|| env.get("DLTSUB_CONFIG").map(PathBuf::from));
        if let Some(path) = file {
            for (name, value) in read_file(&path)? {
                values.insert(name, (value, Origin::File(path.clone())));
            }
        }
        for key in KEYS {
            let name = env_name(key.name);
            if let Some(value) = env.get(&name) {
                values.insert(key.name, (value.clone(), Origin::Env(name)));
            }
        }
        for (name, value) in &args.flags {
            values.insert(name, (value.clone(), Origin::Flag(flag_name(name))));
        }
        Self::from_values(values)
    }

    /// The configuration a TOML file's `text` gives on its own: defaults, then the file's
    /// keys, validated like [`Config::load`] (no environment, no flags). `path` only names
    /// the file in errors and in [`Config::render`]. The fuzz target `config` feeds it.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut values: RawValues = KEYS
            .iter()
            .map(|key| (key.name, (key.default.to_string(), Origin::Default)))
            .collect();
        for (name, value) in parse_file(text, path)? {
            values.insert(name, (value, Origin::File(path.to_path_buf())));
        }
        Self::from_values(values)
    }

    fn from_values(values: RawValues) -> Result<Self, ConfigError> {
        let get = |name: &'static str| -> Field<'_> {
            let (text, origin) = &values[name];
            Field { name, text, origin }
        };
        let config = Config {
            database_url: get("database_url").parse()?,
            migrate_on_start: get("migrate_on_start").boolean()?,
            database_pool_size: get("database_pool_size").positive_integer()?,
            database_connect_timeout: get("database_connect_timeout").duration()?,
            statement_timeout: get("statement_timeout").duration()?,
            lock_timeout: get("lock_timeout").duration()?,
            idle_in_transaction_timeout: get("idle_in_transaction_timeout").duration()?,
            sqlite_busy_timeout: get("sqlite_busy_timeout").duration()?,
            fast_expiry: get("fast_expiry").duration()?,
            slow_expiry: get("slow_expiry").duration()?,
            renew_interval: get("renew_interval").duration()?,
            instance_capacity: get("instance_capacity").positive_integer()?,
            instance_labels: get("instance_labels").labels()?,
            dlt_url: get("dlt_url").http_url()?,
            dlt_dialect: get("dlt_dialect").parse()?,
            dlt_request_timeout: get("dlt_request_timeout").duration()?,
            instance_max_in_flight: get("instance_max_in_flight").positive_integer()?,
            submit_poll_interval: get("submit_poll_interval").duration()?,
            status_poll_interval: get("status_poll_interval").duration()?,
            status_wait: get("status_wait").duration()?,
            unknown_grace: get("unknown_grace").duration()?,
            retry_backoff_base: get("retry_backoff_base").duration()?,
            retry_backoff_max: get("retry_backoff_max").duration()?,
            shutdown_timeout: get("shutdown_timeout").duration()?,
            shutdown_delay: get("shutdown_delay").duration_or_zero()?,
            sawtooth_service_id: get("sawtooth_service_id").service_id()?,
            max_queued_per_service: get("max_queued_per_service").cap()?,
            max_body_size: get("max_body_size").positive_integer()?,
            api_token: get("api_token").token()?,
            max_batches_per_list: get("max_batches_per_list").positive_integer()?,
            max_transactions_per_batch: get("max_transactions_per_batch").positive_integer()?,
            max_ids_per_query: get("max_ids_per_query").positive_integer()?,
            max_concurrent_waits: get("max_concurrent_waits").positive_integer()?,
            max_wait: get("max_wait").duration()?,
            max_queued_total: get("max_queued_total").cap()?,
            rate_limit_per_client: get("rate_limit_per_client").cap()?,
            rate_limit_burst: get("rate_limit_burst").positive_integer()?,
            trusted_proxies: get("trusted_proxies").addresses()?,
            listen: get("listen").parse()?,
            metrics_listen: get("metrics_listen").parse()?,
            sources: values
                .iter()
                .map(|(name, (text, origin))| (*name, text.clone(), origin.clone()))
                .collect(),
        };
        config.check_consistency()?;
        Ok(config)
    }

    /// Rules between keys. Each names both keys and their values.
    fn check_consistency(&self) -> Result<(), ConfigError> {
        let show = humantime::format_duration;
        if self.fast_expiry >= self.slow_expiry {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "fast_expiry ({}) must be shorter than slow_expiry ({})",
                    show(self.fast_expiry),
                    show(self.slow_expiry)
                ),
            });
        }
        if self.renew_interval * 3 > self.fast_expiry {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "renew_interval ({}) must be at most fast_expiry / 3 ({}), so a claim survives two missed renewals",
                    show(self.renew_interval),
                    show(self.fast_expiry / 3)
                ),
            });
        }
        // A stalled instance's open transaction keeps its locks on claim rows until
        // PostgreSQL ends it; past the fast expiry that would hold up a takeover.
        if self.idle_in_transaction_timeout > self.fast_expiry {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "idle_in_transaction_timeout ({}) must not exceed fast_expiry ({}): a stalled instance's open transaction would delay the takeover of its services",
                    show(self.idle_in_transaction_timeout),
                    show(self.fast_expiry)
                ),
            });
        }
        let slow_window = self.slow_expiry - self.fast_expiry;
        if self.dlt_request_timeout > slow_window {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "dlt_request_timeout ({}) must fit inside the slow window, slow_expiry - fast_expiry ({}): a POST started just before the fast expiry must end before the slow one",
                    show(self.dlt_request_timeout),
                    show(slow_window)
                ),
            });
        }
        // A holder judged gone loses its services at the fast expiry, with a POST of its
        // possibly still under way if it was in fact alive (store/src/liveness.rs); the
        // new holder resubmits only after `unknown_grace` of Unknown answers, by which
        // time such a POST has ended.
        if self.unknown_grace < self.dlt_request_timeout {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "unknown_grace ({}) must be at least dlt_request_timeout ({}): a POST still under way must end before its batch is resubmitted",
                    show(self.unknown_grace),
                    show(self.dlt_request_timeout)
                ),
            });
        }
        if self.retry_backoff_base > self.retry_backoff_max {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "retry_backoff_base ({}) must not exceed retry_backoff_max ({})",
                    show(self.retry_backoff_base),
                    show(self.retry_backoff_max)
                ),
            });
        }
        // The native API's own bound on ids (docs/api-v1.md) is 1,000.
        if self.max_ids_per_query > 1_000 {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "max_ids_per_query ({}) must be at most 1000",
                    self.max_ids_per_query
                ),
            });
        }
        if self.max_wait > crate::api::MAX_WAIT {
            return Err(ConfigError::Inconsistent {
                problem: format!(
                    "max_wait ({}) must be at most {}",
                    show(self.max_wait),
                    show(crate::api::MAX_WAIT)
                ),
            });
        }
        // Port 0 (any free port, for tests) never collides.
        if self.listen == self.metrics_listen && self.listen.port() != 0 {
            return Err(ConfigError::Inconsistent {
                problem: format!("listen and metrics_listen are both {}", self.listen),
            });
        }
        Ok(())
    }

    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            url: self.database_url.clone(),
            pool_size: self.database_pool_size,
            connect_timeout: self.database_connect_timeout,
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
            idle_in_transaction_timeout: self.idle_in_transaction_timeout,
            sqlite_busy_timeout: self.sqlite_busy_timeout,
            clock_offset: Default::default(),
            application_name: None,
        }
    }

    /// The effective configuration as TOML, with where each value came from. Secrets
    /// (a password in `database_url` or `dlt_url`, the `api_token`) are redacted.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, text, origin) in &self.sources {
            let shown = if *name == "database_url" {
                self.database_url.redacted()
            } else if *name == "dlt_url" {
                dltsub_store::redact_url(text)
            } else if *name == "api_token" && !text.is_empty() {
                "<redacted>".to_string()
            } else {
                text.clone()
            };
            let kind = KEYS
                .iter()
                .find(|key| key.name == *name)
                .map(|key| key.kind);
            let value = match kind {
                Some(Kind::Integer | Kind::Bool) => shown,
                _ => format!("{shown:?}"),
            };
            out.push_str(&format!("{name} = {value}  # {origin}\n"));
        }
        out
    }
}

/// The longest duration any key accepts. Longer is a typo, and would overflow: three
/// renew intervals in the consistency check, an `Instant` plus a timeout at run time.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// One key's raw value on its way to a type.
struct Field<'a> {
    name: &'static str,
    text: &'a str,
    origin: &'a Origin,
}

impl Field<'_> {
    fn error(&self, problem: impl Into<String>) -> ConfigError {
        ConfigError::BadValue {
            key: self.name,
            // An error is printed and logged: never with a password or token in it.
            value: match self.name {
                "database_url" | "dlt_url" => dltsub_store::redact_url(self.text),
                "api_token" => "<redacted>".to_string(),
                _ => self.text.to_string(),
            },
            origin: self.origin.clone(),
            problem: problem.into(),
        }
    }

    fn parse<T: FromStr>(&self) -> Result<T, ConfigError>
    where
        T::Err: fmt::Display,
    {
        self.text
            .parse()
            .map_err(|error: T::Err| self.error(error.to_string()))
    }

    fn duration(&self) -> Result<Duration, ConfigError> {
        let duration = humantime::parse_duration(self.text).map_err(|error| {
            self.error(format!("not a duration like \"30s\" or \"3m\": {error}"))
        })?;
        if duration.is_zero() {
            return Err(self.error("must be longer than zero"));
        }
        self.at_most_max(duration)
    }

    /// A duration that may be zero ("0s": the feature is off).
    fn duration_or_zero(&self) -> Result<Duration, ConfigError> {
        let duration = humantime::parse_duration(self.text).map_err(|error| {
            self.error(format!("not a duration like \"0s\" or \"5s\": {error}"))
        })?;
        self.at_most_max(duration)
    }

    fn at_most_max(&self, duration: Duration) -> Result<Duration, ConfigError> {
        if duration > MAX_DURATION {
            // humantime would print a year as "11months 30days 3h 50m 24s".
            return Err(self.error("must be at most 365days"));
        }
        Ok(duration)
    }

    fn positive_integer(&self) -> Result<u32, ConfigError> {
        match self.text.parse::<u32>() {
            Ok(0) => Err(self.error("must be at least 1")),
            Ok(value) => Ok(value),
            Err(_) => Err(self.error("not a positive integer")),
        }
    }

    /// A non-negative integer where 0 means "no limit".
    fn cap(&self) -> Result<Option<u64>, ConfigError> {
        match self.text.parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(value) => Ok(Some(value)),
            Err(_) => Err(self.error("not a non-negative integer (0: no cap)")),
        }
    }

    /// Empty: no token. A token is sent in an HTTP header, so it must be visible ASCII.
    fn token(&self) -> Result<Option<String>, ConfigError> {
        if self.text.is_empty() {
            return Ok(None);
        }
        if self.text.len() < 16 || !self.text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::BadValue {
                key: self.name,
                value: "<redacted>".to_string(),
                origin: self.origin.clone(),
                problem: "must be at least 16 visible ASCII characters (no spaces)".into(),
            });
        }
        Ok(Some(self.text.to_string()))
    }

    /// Comma-separated IP addresses; empty: none.
    fn addresses(&self) -> Result<Vec<std::net::IpAddr>, ConfigError> {
        self.text
            .split(',')
            .map(str::trim)
            .filter(|text| !text.is_empty())
            .map(|text| {
                text.parse()
                    .map_err(|_| self.error(format!("{text:?} is not an IP address")))
            })
            .collect()
    }

    fn labels(&self) -> Result<Vec<String>, ConfigError> {
        dltsub_store::parse_labels(self.text).map_err(|problem| self.error(problem))
    }

    fn service_id(&self) -> Result<String, ConfigError> {
        if self.text.is_empty() || self.text.len() > dltsub_store::MAX_SERVICE_ID_LEN {
            return Err(self.error(format!(
                "must be 1 to {} bytes long",
                dltsub_store::MAX_SERVICE_ID_LEN
            )));
        }
        Ok(self.text.to_string())
    }

    fn boolean(&self) -> Result<bool, ConfigError> {
        match self.text {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.error("expected true or false")),
        }
    }

    fn http_url(&self) -> Result<url::Url, ConfigError> {
        let url = url::Url::parse(self.text)
            .map_err(|error| self.error(format!("not a URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(self.error("expected an http:// or https:// URL with a host"));
        }
        Ok(url)
    }
}

/// Reads the flat TOML file into key → text, rejecting unknown keys and wrong types.
fn read_file(path: &Path) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::File {
        path: path.to_path_buf(),
        problem: error.to_string(),
    })?;
    parse_file(&text, path)
}

/// The flat TOML `text` of the file `path` as key → text, rejecting unknown keys and wrong
/// types.
fn parse_file(text: &str, path: &Path) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let file_error = |problem: String| ConfigError::File {
        path: path.to_path_buf(),
        problem,
    };
    let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
        let line = error
            .span()
            // One more than the newlines before the error (`lines()` is one short when
            // the error starts a line).
            .map(|span| text[..span.start].matches('\n').count() + 1)
            .unwrap_or(0);
        file_error(format!(
            "invalid TOML at line {line}: {}",
            error.message().trim()
        ))
    })?;
    let mut values = Vec::new();
    for (name, value) in table {
        let Some(key) = KEYS.iter().find(|key| key.name == name) else {
            return Err(ConfigError::UnknownFileKey {
                key: name,
                path: path.to_path_buf(),
            });
        };
        let text = match (key.kind, &value) {
            (Kind::Integer, toml::Value::Integer(number)) => number.to_string(),
            (Kind::Bool, toml::Value::Boolean(flag)) => flag.to_string(),
            (Kind::Duration | Kind::Text, toml::Value::String(text)) => text.clone(),
            (kind, other) => {
                let expected = match kind {
                    Kind::Integer => "an integer",
                    Kind::Bool => "true or false",
                    Kind::Duration => "a duration string like \"30s\"",
                    Kind::Text => "a string",
                };
                return Err(ConfigError::BadValue {
                    key: key.name,
                    value: other.to_string(),
                    origin: Origin::File(path.to_path_buf()),
                    problem: format!("expected {expected}"),
                });
            }
        };
        values.push((key.name, text));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(flags: &[(&'static str, &str)], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let args = ConfigArgs {
            config_file: None,
            flags: flags.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        };
        Config::load_from(
            &args,
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn defaults_are_valid() {
        let config = load(&[], &[]).expect("defaults");
        assert_eq!(config.fast_expiry, Duration::from_secs(10));
        assert_eq!(config.dlt_dialect, DltDialect::Scabbard);
        assert_eq!(config.database_url.backend_name(), "sqlite");
    }

    /// The shutdown delay is off by default, may be zero, and is a duration like the others.
    #[test]
    fn shutdown_delay_may_be_zero() {
        assert_eq!(load(&[], &[]).unwrap().shutdown_delay, Duration::ZERO);
        let config = load(&[("shutdown_delay", "5s")], &[]).unwrap();
        assert_eq!(config.shutdown_delay, Duration::from_secs(5));
        let config = load(&[("shutdown_delay", "0s")], &[]).unwrap();
        assert_eq!(config.shutdown_delay, Duration::ZERO);
        let error = load(&[("shutdown_delay", "soon")], &[]).unwrap_err();
        assert!(
            error.to_string().starts_with("shutdown_delay = \"soon\""),
            "{error}"
        );
    }

    #[test]
    fn flags_beat_environment() {
        let config = load(
            &[("renew_interval", "1s")],
            &[("DLTSUB_RENEW_INTERVAL", "3s")],
        )
        .unwrap();
        assert_eq!(config.renew_interval, Duration::from_secs(1));
        let config = load(&[], &[("DLTSUB_RENEW_INTERVAL", "3s")]).unwrap();
        assert_eq!(config.renew_interval, Duration::from_secs(3));
    }

    #[test]
    fn bad_duration_names_key_and_origin() {
        let error = load(&[], &[("DLTSUB_RENEW_INTERVAL", "banana")])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("renew_interval = \"banana\" (from environment DLTSUB_RENEW_INTERVAL): not a duration"), "{error}");
        assert!(!error.contains('\n'));
    }

    #[test]
    fn durations_too_long_are_refused_not_overflowed() {
        // Three renew intervals overflowed Duration in the consistency check (a panic at
        // start-up); so would an Instant plus such a duration at run time.
        let path = Path::new("dltsub.toml");
        let error = Config::from_toml_str("renew_interval = \"7000000000000000000s\"\n", path)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("renew_interval = \"7000000000000000000s\" (from config file dltsub.toml): must be at most"),
            "{error}"
        );
        let error = load(&[("shutdown_delay", "400days")], &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("must be at most 365days"), "{error}");
        load(&[("shutdown_delay", "365days")], &[]).expect("a year is the longest");
    }

    #[test]
    fn from_toml_str_layers_the_file_over_the_defaults() {
        let path = Path::new("dltsub.toml");
        let config = Config::from_toml_str(
            "fast_expiry = \"6s\"\nrenew_interval = \"1s\"\ninstance_capacity = 7\n",
            path,
        )
        .unwrap();
        assert_eq!(config.fast_expiry, Duration::from_secs(6));
        assert_eq!(config.slow_expiry, Duration::from_secs(60));
        assert_eq!(config.instance_capacity, 7);
        assert!(
            config
                .render()
                .contains("instance_capacity = 7  # config file dltsub.toml")
        );
        let error = Config::from_toml_str("bogus = 1\n", path)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("unknown key `bogus` in config file dltsub.toml"),
            "{error}"
        );
        // A quoted key may hold a newline; the error stays one line.
        let error = Config::from_toml_str("\"fast\\nexpiry\" = \"5s\"\n", path)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("unknown key `fast\\nexpiry` in config file"),
            "{error}"
        );
        let example = include_str!("../../deploy/dltsub.toml");
        Config::from_toml_str(example, path).expect("the example configuration is valid");
    }

    #[test]
    fn expiry_rules() {
        let error = load(&[("fast_expiry", "60s"), ("slow_expiry", "30s")], &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("fast_expiry (1m) must be shorter than slow_expiry (30s)"),
            "{error}"
        );
        let error = load(&[("renew_interval", "5s")], &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("renew_interval (5s) must be at most fast_expiry / 3"),
            "{error}"
        );
        let error = load(&[("dlt_request_timeout", "55s")], &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("dlt_request_timeout (55s) must fit inside the slow window"),
            "{error}"
        );
        let error = load(&[("unknown_grace", "5s")], &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("unknown_grace (5s) must be at least dlt_request_timeout (10s)"),
            "{error}"
        );
    }

    #[test]
    fn bad_urls_and_values() {
        for (key, value, expected) in [
            ("database_url", "mysql://x", "database_url = \"mysql://x\""),
            (
                "database_url",
                "postgres://host:notaport/db",
                "not a valid PostgreSQL URL",
            ),
            ("dlt_url", "ftp://x", "expected an http:// or https:// URL"),
            ("dlt_url", "not a url", "not a URL"),
            ("dlt_dialect", "fabric", "expected scabbard or sawtooth"),
            ("listen", "localhost", "dltsub"),
            ("instance_capacity", "0", "must be at least 1"),
            ("migrate_on_start", "yes", "expected true or false"),
        ] {
            let error = load(&[(key, value)], &[]).unwrap_err().to_string();
            let expected = if expected == "dltsub" { key } else { expected };
            assert!(error.contains(expected), "{key}={value}: {error}");
            assert!(error.starts_with(key), "{error}");
        }
    }

    #[test]
    fn unknown_environment_variable_is_rejected() {
        let error = load(&[], &[("DLTSUB_FAST_EXPIRE", "10s")])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("unknown environment variable DLTSUB_FAST_EXPIRE"),
            "{error}"
        );
        load(&[], &[("DLTSUB_LOG", "debug"), ("OTHER", "x")]).expect("non-key variables are fine");
    }

    #[test]
    fn file_layer_and_its_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dltsub.toml");
        std::fs::write(
            &path,
            "fast_expiry = \"6s\"\nrenew_interval = \"1s\"\ninstance_capacity = 7\n",
        )
        .unwrap();
        let args = ConfigArgs {
            config_file: Some(path.clone()),
            flags: BTreeMap::new(),
        };
        let config = Config::load_from(&args, Vec::new()).unwrap();
        assert_eq!(config.fast_expiry, Duration::from_secs(6));
        assert_eq!(config.instance_capacity, 7);
        assert!(
            config
                .render()
                .contains("fast_expiry = \"6s\"  # config file")
        );

        std::fs::write(&path, "fast_expiry = \"6s\"\nbogus = 1\n").unwrap();
        let error = Config::load_from(&args, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("unknown key `bogus` in config file"),
            "{error}"
        );

        std::fs::write(&path, "instance_capacity = \"seven\"\n").unwrap();
        let error = Config::load_from(&args, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("instance_capacity = \"\\\"seven\\\"\""),
            "{error}"
        );

        std::fs::write(&path, "fast_expiry = \n").unwrap();
        let error = Config::load_from(&args, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid TOML at line 1"), "{error}");
        assert!(!error.contains('\n'), "{error}");

        // An error at the very start of a line names that line, not the one before.
        std::fs::write(&path, "fast_expiry = \"5s\"\nslow_expiry = \"60s\"\n= 3\n").unwrap();
        let error = Config::load_from(&args, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid TOML at line 3"), "{error}");
    }

    #[test]
    fn limits_have_defaults_and_bounds() {
        let config = load(&[], &[]).unwrap();
        assert_eq!(config.max_batches_per_list, 1_000);
        assert_eq!(config.max_wait, Duration::from_secs(300));
        assert_eq!(config.max_queued_total, Some(1_000_000));
        assert_eq!(config.rate_limit_per_client, None, "off by default");
        assert!(config.trusted_proxies.is_empty());
        let config = load(
            &[
                ("rate_limit_per_client", "20"),
                ("max_queued_total", "0"),
                ("trusted_proxies", "10.0.0.5, ::1"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(config.rate_limit_per_client, Some(20));
        assert_eq!(config.max_queued_total, None);
        assert_eq!(config.trusted_proxies.len(), 2);
        for (key, value, expected) in [
            ("max_batches_per_list", "0", "must be at least 1"),
            ("max_concurrent_waits", "-1", "not a positive integer"),
            ("max_wait", "0s", "must be longer than zero"),
            ("max_wait", "301s", "max_wait (5m 1s) must be at most 5m"),
            ("max_ids_per_query", "1001", "must be at most 1000"),
            ("rate_limit_burst", "0", "must be at least 1"),
            (
                "trusted_proxies",
                "haproxy",
                "\"haproxy\" is not an IP address",
            ),
        ] {
            let error = load(&[(key, value)], &[]).unwrap_err().to_string();
            assert!(error.contains(expected), "{key}={value}: {error}");
        }
    }

    /// No password or token in `dltsub config` or in an error about a bad value.
    #[test]
    fn secrets_are_redacted_everywhere() {
        let config = load(
            &[
                ("dlt_url", "http://ledger:l3dger-pw@gw:8085"),
                ("api_token", "t0ken-0123456789abcdef"),
            ],
            &[("DLTSUB_DATABASE_URL", "postgres://u@h/db?password=pg-pw-9")],
        )
        .unwrap();
        let rendered = config.render();
        for secret in ["l3dger-pw", "t0ken-0123456789abcdef", "pg-pw-9"] {
            assert!(!rendered.contains(secret), "{rendered}");
        }
        assert!(
            rendered.contains("dlt_url = \"http://ledger:***@gw:8085\""),
            "{rendered}"
        );
        for (key, value) in [
            ("dlt_url", "ftp://ledger:l3dger-pw@gw"),
            ("database_url", "postgres://u:pg-pw-9@h:notaport/db"),
            ("api_token", "short-pw"),
        ] {
            let error = load(&[(key, value)], &[]).unwrap_err().to_string();
            assert!(error.starts_with(key), "{error}");
            assert!(
                !error.contains("l3dger-pw")
                    && !error.contains("pg-pw-9")
                    && !error.contains("short-pw"),
                "{error}"
            );
        }
    }

    #[test]
    fn render_redacts_the_database_password() {
        let config = load(
            &[("database_url", "postgres://dltsub:s3cret@db.example/dltsub")],
            &[],
        )
        .unwrap();
        let rendered = config.render();
        assert!(!rendered.contains("s3cret"), "{rendered}");
        assert!(
            rendered.contains(
                "database_url = \"postgres://dltsub:***@db.example/dltsub\"  # flag --database-url"
            ),
            "{rendered}"
        );
    }
}
