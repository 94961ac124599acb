//! The operator commands: `dltsub submit | status | services | claims | instances | cancel |
//! requeue | pause | resume | max-in-flight | pin` talk to a running instance over its native
//! API (docs/api-v1.md) and print tables, or the server's JSON with `--json`.
//!
//! Exit codes: 0 done; 1 the server could not be reached, timed out or failed (5xx);
//! 2 bad usage or input refused (any 4xx error, including `status` of an unknown id and an
//! id that needs `--service`); 3 denied (a 409 execution report); 4 not final within
//! `--wait`; 5 a batch ended INVALID.

mod table;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use table::Table;

pub const EXIT_OK: u8 = 0;
pub const EXIT_UNREACHABLE: u8 = 1;
pub const EXIT_REFUSED: u8 = 2;
pub const EXIT_DENIED: u8 = 3;
pub const EXIT_NOT_FINAL: u8 = 4;
pub const EXIT_INVALID: u8 = 5;

/// Where the instance is and how to talk to it.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Base URL of a running dltsub's API.
    #[arg(long, env = "DLTSUB_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token for operations and admin reads (the server's `api_token`).
    #[arg(long, env = "DLTSUB_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Give up on the server after this long (plus any --wait).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Subcommands that talk to a running instance over HTTP (exit codes: see the module).
#[derive(Debug, clap::Subcommand)]
pub enum OpsCommand {
    /// Submit a protobuf BatchList file (`-` for stdin) to a service. Exit 4 if not final
    /// within --wait, 5 if a batch ended INVALID, 3 if denied.
    Submit {
        /// The BatchList file.
        file: PathBuf,
        /// The service (for scabbard, `circuit::service`).
        #[arg(long)]
        service: String,
        /// Wait up to this long for the outcome ("30s").
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show batches by id; one id shows its history too. Exit 2 if an id is unknown, 4 if
    /// not final within --wait, 5 if a batch is INVALID.
    Status {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Only in this service.
        #[arg(long)]
        service: Option<String>,
        /// Wait up to this long until every batch is final ("30s").
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        #[command(flatten)]
        connection: Connection,
    },
    /// List the services: holder, settings and batch counts.
    Services {
        #[command(flatten)]
        connection: Connection,
    },
    /// Who holds which service, its epoch and the time left in each phase.
    Claims {
        #[command(flatten)]
        connection: Connection,
    },
    /// The live instances.
    Instances {
        #[command(flatten)]
        connection: Connection,
    },
    /// Cancel QUEUED batches (denied, exit 3, for a batch mid-submission or final).
    Cancel {
        #[arg(required = true)]
        ids: Vec<String>,
        #[arg(long)]
        service: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Make QUEUED (backoff) or IN_DOUBT batches submittable now (denied for others).
    Requeue {
        #[arg(required = true)]
        ids: Vec<String>,
        #[arg(long)]
        service: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Stop starting submissions for a service (in-flight ones finish).
    Pause {
        service: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Resume a paused service.
    Resume {
        service: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Set how many of a service's batches may be in flight at once (1 to 1000).
    MaxInFlight {
        service: String,
        max_in_flight: i64,
        #[command(flatten)]
        connection: Connection,
    },
    /// Pin a service to instances with a label, or keep it from those with one; without
    /// options, any instance may hold it again.
    Pin {
        service: String,
        /// Only instances carrying this label may hold the service.
        #[arg(long)]
        label: Option<String>,
        /// No instance carrying this label may hold the service.
        #[arg(long)]
        exclude: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
}

/// Runs one operator command; returns the exit code. Messages go to stderr, results to
/// stdout.
pub async fn run(command: OpsCommand) -> u8 {
    match execute(command).await {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            failure.code
        }
    }
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_REFUSED,
            message: message.into(),
        }
    }
}

/// An answer from the server: status and JSON body.
struct Answer {
    status: u16,
    body: Value,
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    json: bool,
}

impl Client {
    fn new(connection: &Connection, wait: Option<Duration>) -> Result<Self, Failure> {
        let base = connection.url.trim_end_matches('/').to_string();
        let url = url::Url::parse(&base)
            .map_err(|error| Failure::usage(format!("invalid --url {base:?}: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Failure::usage(format!(
                "invalid --url {base:?}: expected http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(connection.timeout + wait.unwrap_or_default())
            .build()
            .map_err(|error| Failure {
                code: EXIT_UNREACHABLE,
                message: format!("cannot build an HTTP client: {error}"),
            })?;
        Ok(Self {
            http,
            base,
            token: connection.token.clone(),
            json: connection.json,
        })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Answer, Failure> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request.send().await.map_err(|error| Failure {
            code: EXIT_UNREACHABLE,
            message: format!("cannot reach dltsub at {}: {error}", self.base),
        })?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|error| Failure {
            code: EXIT_UNREACHABLE,
            message: format!("reading the answer from {}: {error}", self.base),
        })?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let answer = Answer { status, body };
        check_error(&answer)?;
        Ok(answer)
    }

    async fn get(&self, path: &str) -> Result<Answer, Failure> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<Answer, Failure> {
        let mut request = self.http.post(format!("{}{path}", self.base));
        if let Some((content_type, bytes)) = body {
            request = request.header("Content-Type", content_type).body(bytes);
        }
        self.send(request).await
    }

    /// Prints the body as JSON (with `--json`) or through `render`.
    fn print(&self, body: &Value, render: impl FnOnce(&Value) -> String) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(body).unwrap_or_else(|_| body.to_string())
            );
        } else {
            print!("{}", render(body));
        }
    }
}

/// A 4xx or 5xx other than a 409 execution report becomes a failure carrying the
/// server's message.
fn check_error(answer: &Answer) -> Result<(), Failure> {
    let status = answer.status;
    if status < 400 || (status == 409 && answer.body.get("state").is_some()) {
        return Ok(());
    }
    let error = &answer.body["error"];
    let message = match (error["code"].as_str(), error["message"].as_str()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        _ => format!("HTTP {status}: {}", answer.body),
    };
    // A 409 *report* is a denial (handled above); a 409 *error* (an id in several
    // services) is input to correct, like any other 4xx.
    let code = match status {
        400..=499 => EXIT_REFUSED,
        _ => EXIT_UNREACHABLE,
    };
    Err(Failure { code, message })
}

/// Percent-encodes one path segment (service ids hold `::`, which survives as is).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~:".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn query_value(text: &str) -> String {
    segment(text).replace(':', "%3A")
}

fn wait_query(wait: Option<Duration>) -> Option<String> {
    wait.map(|wait| format!("wait={}ms", wait.as_millis()))
}

fn with_query(path: String, parameters: &[Option<String>]) -> String {
    let present: Vec<&str> = parameters.iter().flatten().map(String::as_str).collect();
    if present.is_empty() {
        path
    } else {
        format!("{path}?{}", present.join("&"))
    }
}

/// The exit code of an execution report.
fn report_code(report: &Value) -> u8 {
    let invalid = report["batches"]
        .as_array()
        .is_some_and(|batches| batches.iter().any(|b| b["status"] == "INVALID"));
    match report["state"].as_str() {
        Some("denied") => EXIT_DENIED,
        Some("postponed") => EXIT_NOT_FINAL,
        _ if invalid => EXIT_INVALID,
        _ => EXIT_OK,
    }
}

async fn execute(command: OpsCommand) -> Result<u8, Failure> {
    match command {
        OpsCommand::Submit {
            file,
            service,
            wait,
            connection,
        } => {
            let bytes = if file.as_os_str() == "-" {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                    .map_err(|error| Failure::usage(format!("cannot read stdin: {error}")))?;
                bytes
            } else {
                std::fs::read(&file).map_err(|error| {
                    Failure::usage(format!("cannot read {}: {error}", file.display()))
                })?
            };
            let client = Client::new(&connection, wait)?;
            let path = with_query(
                format!("/api/v1/services/{}/batches", segment(&service)),
                &[wait_query(wait)],
            );
            let answer = client
                .post(&path, Some(("application/octet-stream", bytes)))
                .await?;
            client.print(&answer.body, render_report);
            // Without --wait an accepted submission is success, not "not final".
            let code = report_code(&answer.body);
            Ok(if wait.is_none() && code == EXIT_NOT_FINAL {
                EXIT_OK
            } else {
                code
            })
        }
        OpsCommand::Status {
            ids,
            service,
            wait,
            connection,
        } => {
            let client = Client::new(&connection, wait)?;
            let service_query = service
                .as_deref()
                .map(|s| format!("service_id={}", query_value(s)));
            if ids.len() == 1 && wait.is_none() {
                let path = with_query(
                    format!("/api/v1/batches/{}", segment(&ids[0])),
                    &[service_query],
                );
                let answer = client.get(&path).await?;
                client.print(&answer.body, render_batch_with_history);
                let invalid = answer.body["status"] == "INVALID";
                return Ok(if invalid { EXIT_INVALID } else { EXIT_OK });
            }
            let path = with_query(
                "/api/v1/batches".to_string(),
                &[
                    Some(format!(
                        "ids={}",
                        ids.iter()
                            .map(|id| query_value(id))
                            .collect::<Vec<_>>()
                            .join(",")
                    )),
                    service_query,
                    wait_query(wait),
                ],
            );
            let answer = client.get(&path).await?;
            client.print(&answer.body, render_statuses);
            Ok(statuses_code(&answer.body, wait.is_some()))
        }
        OpsCommand::Services { connection } => {
            let client = Client::new(&connection, None)?;
            let answer = client.get("/api/v1/services").await?;
            client.print(&answer.body, render_services);
            Ok(EXIT_OK)
        }
        OpsCommand::Claims { connection } => {
            let client = Client::new(&connection, None)?;
            let answer = client.get("/api/v1/claims").await?;
            client.print(&answer.body, render_claims);
            Ok(EXIT_OK)
        }
        OpsCommand::Instances { connection } => {
            let client = Client::new(&connection, None)?;
            let answer = client.get("/api/v1/instances").await?;
            client.print(&answer.body, render_instances);
            Ok(EXIT_OK)
        }
        OpsCommand::Cancel {
            ids,
            service,
            connection,
        } => batch_moves("cancel", ids, service, connection).await,
        OpsCommand::Requeue {
            ids,
            service,
            connection,
        } => batch_moves("requeue", ids, service, connection).await,
        OpsCommand::Pause {
            service,
            connection,
        } => service_move("pause", &service, None, connection).await,
        OpsCommand::Resume {
            service,
            connection,
        } => service_move("resume", &service, None, connection).await,
        OpsCommand::MaxInFlight {
            service,
            max_in_flight,
            connection,
        } => {
            let body = serde_json::json!({ "max_in_flight": max_in_flight }).to_string();
            service_move("max_in_flight", &service, Some(body), connection).await
        }
        OpsCommand::Pin {
            service,
            label,
            exclude,
            connection,
        } => {
            let body =
                serde_json::json!({ "pin_label": label, "exclude_label": exclude }).to_string();
            service_move("pin", &service, Some(body), connection).await
        }
    }
}

/// Cancel or requeue each id; the worst exit code wins (denied over done).
async fn batch_moves(
    operation: &str,
    ids: Vec<String>,
    service: Option<String>,
    connection: Connection,
) -> Result<u8, Failure> {
    let client = Client::new(&connection, None)?;
    let service_query = service
        .as_deref()
        .map(|s| format!("service_id={}", query_value(s)));
    let mut code = EXIT_OK;
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    // Every id is tried, so one unknown id does not hide what happened to the others.
    for id in &ids {
        let path = with_query(
            format!("/api/v1/batches/{}/{operation}", segment(id)),
            std::slice::from_ref(&service_query),
        );
        match client.post(&path, None).await {
            Ok(answer) => {
                code = code.max(report_code(&answer.body));
                reports.push(answer.body);
            }
            Err(failure) => {
                code = code.max(failure.code);
                failures.push(format!("{id}: {}", failure.message));
            }
        }
    }
    let all = Value::Array(reports);
    client.print(&all, |reports| {
        reports
            .as_array()
            .into_iter()
            .flatten()
            .map(render_report)
            .collect()
    });
    for failure in failures {
        eprintln!("error: {failure}");
    }
    Ok(code)
}

async fn service_move(
    operation: &str,
    service: &str,
    json_body: Option<String>,
    connection: Connection,
) -> Result<u8, Failure> {
    let client = Client::new(&connection, None)?;
    let path = format!("/api/v1/services/{}/{operation}", segment(service));
    let body = json_body.map(|text| ("application/json", text.into_bytes()));
    let answer = client.post(&path, body).await?;
    client.print(&answer.body, render_report);
    Ok(report_code(&answer.body))
}

fn statuses_code(body: &Value, waited: bool) -> u8 {
    let unknown = body["unknown_ids"]
        .as_array()
        .is_some_and(|ids| !ids.is_empty());
    let batches = body["batches"].as_array().cloned().unwrap_or_default();
    let is_final = |b: &Value| {
        matches!(
            b["status"].as_str(),
            Some("COMMITTED" | "INVALID" | "CANCELLED")
        )
    };
    if unknown {
        EXIT_REFUSED
    } else if waited && !batches.iter().all(is_final) {
        EXIT_NOT_FINAL
    } else if batches.iter().any(|b| b["status"] == "INVALID") {
        EXIT_INVALID
    } else {
        EXIT_OK
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_string(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A batch id cut to 16 characters for tables.
fn short_id(value: &Value) -> String {
    let id = text(value);
    if id.len() > 16 {
        format!("{}…", &id[..16])
    } else {
        id
    }
}

/// Milliseconds as "2.3s"; "-" when past or absent.
fn left(value: &Value) -> String {
    match value.as_i64() {
        Some(ms) if ms > 0 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => "-".to_string(),
    }
}

fn render_report(report: &Value) -> String {
    let mut out = format!(
        "{} {}: {}",
        text(&report["operation"]),
        text(&report["service_id"]),
        text(&report["state"]),
    );
    if let Some(reason) = report["reason"].as_str() {
        out.push_str(&format!(" ({reason})"));
    }
    out.push('\n');
    if let Some(batches) = report["batches"].as_array().filter(|b| !b.is_empty()) {
        out.push_str(&batch_table(batches).render());
    }
    out
}

fn batch_table(batches: &[Value]) -> Table {
    let mut table = Table::new(&["BATCH", "SERVICE", "SEQ", "STATUS", "ATTEMPTS", "UPDATED"]);
    for batch in batches {
        table.row(vec![
            short_id(&batch["batch_id"]),
            text(&batch["service_id"]),
            text(&batch["seq"]),
            text(&batch["status"]),
            text(&batch["attempts"]),
            text(&batch["updated_at"]),
        ]);
    }
    table
}

fn render_statuses(body: &Value) -> String {
    let batches = body["batches"].as_array().cloned().unwrap_or_default();
    let mut table = batch_table(&batches);
    for id in body["unknown_ids"].as_array().into_iter().flatten() {
        table.row(vec![
            short_id(id),
            "-".into(),
            "-".into(),
            "UNKNOWN".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    table.render()
}

fn render_batch_with_history(batch: &Value) -> String {
    let mut out = format!(
        "batch    {}\nservice  {}\nseq      {}\nstatus   {}\nattempts {}\nepoch    {}\nby       {}\n",
        text(&batch["batch_id"]),
        text(&batch["service_id"]),
        text(&batch["seq"]),
        text(&batch["status"]),
        text(&batch["attempts"]),
        text(&batch["submit_epoch"]),
        text(&batch["submitted_by"]),
    );
    if !batch["last_error"].is_null() {
        out.push_str(&format!("error    {}\n", text(&batch["last_error"])));
    }
    out.push('\n');
    let mut table = Table::new(&["AT", "FROM", "TO", "EPOCH", "INSTANCE", "DETAIL"]);
    for event in batch["history"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&event["at"]),
            text(&event["old_status"]),
            text(&event["new_status"]),
            text(&event["epoch"]),
            text(&event["instance_id"]),
            text(&event["detail"]),
        ]);
    }
    out.push_str(&table.render());
    out
}

fn render_services(body: &Value) -> String {
    let mut table = Table::new(&[
        "SERVICE",
        "HOLDER",
        "EPOCH",
        "PAUSED",
        "MAX_IN_FLIGHT",
        "QUEUED",
        "IN_FLIGHT",
        "COMMITTED",
        "INVALID",
        "CANCELLED",
    ]);
    for service in body["services"].as_array().into_iter().flatten() {
        let counts = &service["counts"];
        let count = |status: &str| counts[status].as_i64().unwrap_or(0);
        let in_flight: i64 = ["SUBMITTING", "PENDING", "VALID", "IN_DOUBT"]
            .iter()
            .map(|s| count(s))
            .sum();
        table.row(vec![
            text(&service["service_id"]),
            text(&service["claimant"]),
            text(&service["epoch"]),
            text(&service["paused"]),
            text(&service["max_in_flight"]),
            count("QUEUED").to_string(),
            in_flight.to_string(),
            count("COMMITTED").to_string(),
            count("INVALID").to_string(),
            count("CANCELLED").to_string(),
        ]);
    }
    table.render()
}

fn render_claims(body: &Value) -> String {
    let mut table = Table::new(&[
        "SERVICE",
        "HOLDER",
        "EPOCH",
        "PHASE",
        "FAST_LEFT",
        "SLOW_LEFT",
    ]);
    for claim in body["claims"].as_array().into_iter().flatten() {
        table.row(vec![
            text(&claim["service_id"]),
            text(&claim["claimant"]),
            text(&claim["epoch"]),
            text(&claim["phase"]),
            left(&claim["fast_left_ms"]),
            left(&claim["slow_left_ms"]),
        ]);
    }
    table.render()
}

fn render_instances(body: &Value) -> String {
    let mut table = Table::new(&[
        "INSTANCE",
        "STATE",
        "HEARTBEAT_AGE",
        "CLAIMS",
        "CAPACITY",
        "VERSION",
        "STARTED",
    ]);
    for instance in body["instances"].as_array().into_iter().flatten() {
        let age = instance["heartbeat_age_ms"]
            .as_i64()
            .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        table.row(vec![
            text(&instance["instance_id"]),
            text(&instance["state"]),
            age,
            text(&instance["claims"]),
            text(&instance["capacity"]),
            text(&instance["version"]),
            text(&instance["started_at"]),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_keep_service_ids_readable_and_escape_the_rest() {
        assert_eq!(segment("circ::svc"), "circ::svc");
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(query_value("circ::svc"), "circ%3A%3Asvc");
        assert_eq!(
            with_query("/x".into(), &[None, Some("a=1".into()), Some("b=2".into())]),
            "/x?a=1&b=2"
        );
        assert_eq!(with_query("/x".into(), &[None]), "/x");
        assert_eq!(
            wait_query(Some(Duration::from_secs(30))).as_deref(),
            Some("wait=30000ms")
        );
    }

    #[test]
    fn exit_codes_follow_status_and_report() {
        let answer = |status, body| Answer { status, body };
        assert!(check_error(&answer(200, json!({}))).is_ok());
        assert!(check_error(&answer(409, json!({"state": "denied"}))).is_ok());
        let failure = check_error(&answer(
            404,
            json!({"error": {"code": "unknown_service", "message": "no service \"x\""}}),
        ))
        .unwrap_err();
        assert_eq!(failure.code, EXIT_REFUSED);
        assert_eq!(failure.message, "unknown_service: no service \"x\"");
        assert_eq!(
            check_error(&answer(429, json!({}))).unwrap_err().code,
            EXIT_REFUSED
        );
        // A 409 error (not a report) is input to correct: an id in several services.
        assert_eq!(
            check_error(&answer(409, json!({"error": {"code": "ambiguous_batch"}})))
                .unwrap_err()
                .code,
            EXIT_REFUSED
        );
        assert_eq!(
            check_error(&answer(503, json!("down"))).unwrap_err().code,
            EXIT_UNREACHABLE
        );

        assert_eq!(
            report_code(&json!({"state": "executed", "batches": []})),
            EXIT_OK
        );
        assert_eq!(report_code(&json!({"state": "denied"})), EXIT_DENIED);
        assert_eq!(report_code(&json!({"state": "postponed"})), EXIT_NOT_FINAL);
        assert_eq!(
            report_code(&json!({"state": "executed", "batches": [{"status": "INVALID"}]})),
            EXIT_INVALID
        );
        let statuses =
            |batches: Value, unknown: Value| json!({"batches": batches, "unknown_ids": unknown});
        assert_eq!(
            statuses_code(&statuses(json!([{"status": "QUEUED"}]), json!([])), false),
            EXIT_OK
        );
        assert_eq!(
            statuses_code(&statuses(json!([{"status": "QUEUED"}]), json!([])), true),
            EXIT_NOT_FINAL
        );
        assert_eq!(
            statuses_code(&statuses(json!([]), json!(["ab"])), false),
            EXIT_REFUSED
        );
        assert_eq!(
            statuses_code(&statuses(json!([{"status": "INVALID"}]), json!([])), true),
            EXIT_INVALID
        );
    }

    #[test]
    fn tables_show_what_an_operator_looks_for() {
        let services = json!({"services": [{
            "service_id": "circ::svc", "paused": false, "max_in_flight": 1, "claimant": "h:1:ab",
            "epoch": 4, "counts": {"QUEUED": 3, "SUBMITTING": 1, "PENDING": 1, "VALID": 0,
            "IN_DOUBT": 0, "COMMITTED": 120, "INVALID": 2, "CANCELLED": 0}}]});
        assert_eq!(
            render_services(&services),
            "SERVICE    HOLDER  EPOCH  PAUSED  MAX_IN_FLIGHT  QUEUED  IN_FLIGHT  COMMITTED  INVALID  CANCELLED\n\
             circ::svc  h:1:ab  4      false   1              3       2          120        2        0\n"
        );
        let claims = json!({"claims": [
            {"service_id": "a", "claimant": "h:1:ab", "epoch": 2, "phase": "held",
             "fast_left_ms": 2300, "slow_left_ms": 9000},
            {"service_id": "b", "claimant": null, "epoch": 0, "phase": "unclaimed",
             "fast_left_ms": null, "slow_left_ms": null}]});
        assert_eq!(
            render_claims(&claims),
            "SERVICE  HOLDER  EPOCH  PHASE      FAST_LEFT  SLOW_LEFT\n\
             a        h:1:ab  2      held       2.3s       9.0s\n\
             b        -       0      unclaimed  -          -\n"
        );
        let report = json!({"operation": "cancel", "service_id": "s", "state": "denied",
            "reason": "batch ab is SUBMITTING: mid-submission",
            "batches": [{"batch_id": "0123456789abcdef0123", "service_id": "s", "seq": 7,
                         "status": "SUBMITTING", "attempts": 1, "updated_at": "t"}]});
        assert_eq!(
            render_report(&report),
            "cancel s: denied (batch ab is SUBMITTING: mid-submission)\n\
             BATCH              SERVICE  SEQ  STATUS      ATTEMPTS  UPDATED\n\
             0123456789abcdef…  s        7    SUBMITTING  1         t\n"
        );
    }
}
