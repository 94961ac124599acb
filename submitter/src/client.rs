//! The DLT client: POST a BatchList, ask for batch statuses, in the Splinter scabbard or
//! the Sawtooth REST dialect (DESIGN.md §5).
//!
//! Exact in what it sends (`Content-Type: application/octet-stream`, the dialect's query
//! parameter), liberal in what it accepts (status casing, missing fields, error bodies that
//! are not JSON). Every POST carries `X-Dltsub-Instance` and `X-Dltsub-Epoch`, so the
//! ledger's logs (and the simulated ledger's POST log) show who sent it under which claim.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

/// Which ledger API dltsub talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Splinter scabbard: `service_id` is `circuit::service`.
    Scabbard,
    /// Sawtooth REST API: one endpoint; `service_id` only groups batches for ordering.
    Sawtooth,
}

/// What became of one POST, as far as the submitter can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    /// 202: the ledger has the batches and will decide.
    Accepted,
    /// 400: the ledger refused the batches for good; `message` is its error body.
    Rejected { message: String },
    /// 429 or 503: back-pressure, nothing was taken; retry later.
    BackPressure { status: u16 },
    /// The request never reached the ledger (connection refused, DNS): retry later.
    NotSent { error: String },
    /// The ledger may or may not have the batches (timeout or reset after sending, another
    /// 5xx, an unexpected answer): ask it before resubmitting.
    InDoubt { error: String },
}

/// A batch's state on the ledger, normalised across dialects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerState {
    Pending,
    Valid,
    Committed,
    Invalid,
    Unknown,
}

impl LedgerState {
    /// Accepts either dialect's spelling (`Committed`, `COMMITTED`, …).
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_uppercase().as_str() {
            "PENDING" => Some(Self::Pending),
            "VALID" => Some(Self::Valid),
            "COMMITTED" => Some(Self::Committed),
            "INVALID" => Some(Self::Invalid),
            "UNKNOWN" => Some(Self::Unknown),
            _ => None,
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Self::Committed | Self::Invalid)
    }
}

/// One entry of a batch-status answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerStatus {
    pub batch_id: String,
    pub state: LedgerState,
    /// The ledger's own detail (invalid transactions and their messages), as JSON.
    pub message: Option<Value>,
}

/// A status request that failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid service id {0:?} for the scabbard dialect: expected circuit::service")]
    BadServiceId(String),
    #[error("batch status request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("batch status request answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("batch status answer not understood: {0}")]
    Body(String),
}

/// Sawtooth answers GET with at most this many ids; more go in a POST body.
const SAWTOOTH_MAX_GET_IDS: usize = 15;

/// A pooled HTTP client for one ledger.
#[derive(Debug, Clone)]
pub struct DltClient {
    http: reqwest::Client,
    /// The ledger's base URL without credentials, so no URL this client builds (and no
    /// error that quotes one) carries a password.
    base: url::Url,
    credentials: Option<Credentials>,
    dialect: Dialect,
    request_timeout: Duration,
}

/// `user:password@` of the ledger URL, sent as HTTP basic authentication on every request.
#[derive(Clone)]
struct Credentials {
    user: String,
    password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}:***)", self.user)
    }
}

impl Credentials {
    /// Takes the user information out of `url` (percent-decoded), leaving it without.
    fn take_from(url: &mut url::Url) -> Option<Self> {
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8_lossy()
                .into_owned()
        };
        if url.username().is_empty() && url.password().is_none() {
            return None;
        }
        let credentials = Credentials {
            user: decode(url.username()),
            password: url.password().map(decode),
        };
        let _ = url.set_username("");
        let _ = url.set_password(None);
        Some(credentials)
    }
}

impl DltClient {
    /// A client for the ledger at `base`. Credentials in `base` (`http://user:pass@host`)
    /// are taken out of the URL and sent as basic authentication instead.
    pub fn new(
        mut base: url::Url,
        dialect: Dialect,
        request_timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let credentials = Credentials::take_from(&mut base);
        let http = reqwest::Client::builder()
            .connect_timeout(request_timeout)
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            base,
            credentials,
            dialect,
            request_timeout,
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The ledger's credentials, if its URL carried any, as an Authorization header.
    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credentials {
            Some(credentials) => {
                request.basic_auth(&credentials.user, credentials.password.as_deref())
            }
            None => request,
        }
    }

    fn endpoint(&self, service_id: &str, leaf: &str) -> Result<url::Url, ClientError> {
        let path = match self.dialect {
            Dialect::Scabbard => {
                let (circuit, service) = service_id
                    .split_once("::")
                    .filter(|(c, s)| !c.is_empty() && !s.is_empty() && !s.contains("::"))
                    .ok_or_else(|| ClientError::BadServiceId(service_id.to_string()))?;
                format!("scabbard/{circuit}/{service}/{leaf}")
            }
            Dialect::Sawtooth => leaf.to_string(),
        };
        let mut base = self.base.clone();
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        base.join(&path)
            .map_err(|error| ClientError::Body(format!("cannot build the URL: {error}")))
    }

    /// POSTs a serialized BatchList (one or more batches of one service, in order).
    pub async fn post_batches(
        &self,
        service_id: &str,
        batch_list: Vec<u8>,
        instance_id: &str,
        epoch: i64,
    ) -> PostOutcome {
        let url = match self.endpoint(service_id, "batches") {
            Ok(url) => url,
            Err(error) => {
                return PostOutcome::Rejected {
                    message: error.to_string(),
                };
            }
        };
        let response = self
            .authorized(self.http.post(url))
            .timeout(self.request_timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header("X-Dltsub-Instance", instance_id)
            .header("X-Dltsub-Epoch", epoch.to_string())
            .body(batch_list)
            .send()
            .await;
        let response = match response {
            Ok(response) => response,
            // A connect error means the request never left: nothing can have been
            // received. Anything else (timeout, reset) may have happened after sending.
            Err(error) if error.is_connect() => {
                return PostOutcome::NotSent {
                    error: error_chain(&error),
                };
            }
            Err(error) => {
                return PostOutcome::InDoubt {
                    error: error_chain(&error),
                };
            }
        };
        let status = response.status();
        // The body of a 202 carries only the status link, which we know already; an
        // error body is kept as the ledger's message.
        let body = response.text().await.unwrap_or_default();
        match status {
            StatusCode::ACCEPTED | StatusCode::OK => PostOutcome::Accepted,
            StatusCode::BAD_REQUEST => PostOutcome::Rejected { message: body },
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                PostOutcome::BackPressure {
                    status: status.as_u16(),
                }
            }
            // Any other 4xx (404, 401, 403, 413, 415, …) is a definite refusal of the
            // request, not of the batches: nothing was taken, retry later (alone).
            other if other.is_client_error() => PostOutcome::NotSent {
                error: format!(
                    "ledger refused the request: {other}: {}",
                    truncate(&body, 500)
                ),
            },
            other => PostOutcome::InDoubt {
                error: format!("ledger answered {other}: {}", truncate(&body, 500)),
            },
        }
    }

    /// Asks for the statuses of `batch_ids` of one service. With `wait`, the ledger answers
    /// as soon as every id is final, or after `wait` with what it knows.
    pub async fn batch_statuses(
        &self,
        service_id: &str,
        batch_ids: &[String],
        wait: Option<Duration>,
    ) -> Result<Vec<LedgerStatus>, ClientError> {
        if batch_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut url = self.endpoint(service_id, "batch_statuses")?;
        // Both ledgers take `wait` in whole seconds.
        let wait_secs = wait
            .map(|wait| wait.as_secs_f64().ceil() as u64)
            .filter(|s| *s > 0);
        let timeout = self.request_timeout + wait.unwrap_or_default();
        let request = match self.dialect {
            Dialect::Scabbard => {
                url.query_pairs_mut()
                    .append_pair("ids", &batch_ids.join(","));
                if let Some(secs) = wait_secs {
                    url.query_pairs_mut().append_pair("wait", &secs.to_string());
                }
                self.http.get(url)
            }
            Dialect::Sawtooth if batch_ids.len() > SAWTOOTH_MAX_GET_IDS => {
                if let Some(secs) = wait_secs {
                    url.query_pairs_mut().append_pair("wait", &secs.to_string());
                }
                self.http.post(url).json(batch_ids)
            }
            Dialect::Sawtooth => {
                url.query_pairs_mut()
                    .append_pair("id", &batch_ids.join(","));
                if let Some(secs) = wait_secs {
                    url.query_pairs_mut().append_pair("wait", &secs.to_string());
                }
                self.http.get(url)
            }
        };
        let response = self.authorized(request).timeout(timeout).send().await?;
        let status = response.status();
        let body = response.text().await?;
        if !status.is_success() {
            return Err(ClientError::Status {
                status: status.as_u16(),
                body: truncate(&body, 500),
            });
        }
        let json: Value = serde_json::from_str(&body)
            .map_err(|error| ClientError::Body(format!("{error}: {}", truncate(&body, 200))))?;
        parse_statuses(&json)
    }
}

/// Reads either dialect's answer: scabbard's array of `{id, status: {statusType, message}}`
/// or Sawtooth's `{data: [{id, status, invalid_transactions}]}`.
pub fn parse_statuses(json: &Value) -> Result<Vec<LedgerStatus>, ClientError> {
    let entries = json
        .as_array()
        .or_else(|| json.get("data").and_then(Value::as_array))
        .ok_or_else(|| ClientError::Body("expected a list of batch statuses".into()))?;
    entries
        .iter()
        .map(|entry| {
            let batch_id = entry
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| ClientError::Body("a status entry has no id".into()))?
                .to_string();
            let (state_text, message) = match entry.get("status") {
                Some(Value::Object(status)) => (
                    status.get("statusType").and_then(Value::as_str),
                    status.get("message").cloned(),
                ),
                Some(Value::String(text)) => (
                    Some(text.as_str()),
                    entry.get("invalid_transactions").cloned(),
                ),
                _ => (None, None),
            };
            let state = state_text.and_then(LedgerState::parse).ok_or_else(|| {
                ClientError::Body(format!("batch {batch_id} has no known status"))
            })?;
            let message =
                message.filter(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty()));
            Ok(LedgerStatus {
                batch_id,
                state,
                message,
            })
        })
        .collect()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_scabbard_statuses() {
        let answer = json!([
            {"id": "a", "status": {"statusType": "Committed", "message": []}, "timestamp": {"secs_since_epoch": 1, "nanos_since_epoch": 0}},
            {"id": "b", "status": {"statusType": "Invalid", "message": [{"transaction_id": "t", "error_message": "bad", "error_data": []}]}},
            {"id": "c", "status": {"statusType": "Unknown", "message": []}}
        ]);
        let statuses = parse_statuses(&answer).unwrap();
        assert_eq!(statuses[0].state, LedgerState::Committed);
        assert_eq!(statuses[0].message, None);
        assert_eq!(statuses[1].state, LedgerState::Invalid);
        assert_eq!(
            statuses[1].message.as_ref().unwrap()[0]["error_message"],
            "bad"
        );
        assert_eq!(statuses[2].state, LedgerState::Unknown);
    }

    #[test]
    fn parses_sawtooth_statuses() {
        let answer = json!({"data": [
            {"id": "a", "status": "PENDING", "invalid_transactions": []},
            {"id": "b", "status": "INVALID", "invalid_transactions": [{"id": "t", "message": "bad", "extended_data": ""}]}
        ], "link": "http://x/batch_statuses?id=a,b"});
        let statuses = parse_statuses(&answer).unwrap();
        assert_eq!(statuses[0].state, LedgerState::Pending);
        assert_eq!(statuses[1].message.as_ref().unwrap()[0]["message"], "bad");
    }

    #[test]
    fn rejects_answers_it_cannot_read() {
        assert!(parse_statuses(&json!({"error": {"code": 30}})).is_err());
        assert!(parse_statuses(&json!([{"id": "a", "status": {"statusType": "Weird"}}])).is_err());
    }

    #[test]
    fn scabbard_endpoint_needs_circuit_and_service() {
        let client = DltClient::new(
            "http://ledger:8080/base".parse().unwrap(),
            Dialect::Scabbard,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            client.endpoint("c1::s1", "batches").unwrap().as_str(),
            "http://ledger:8080/base/scabbard/c1/s1/batches"
        );
        assert!(client.endpoint("no-separator", "batches").is_err());
        let sawtooth = DltClient::new(
            "http://ledger:8008".parse().unwrap(),
            Dialect::Sawtooth,
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(
            sawtooth.endpoint("any", "batches").unwrap().as_str(),
            "http://ledger:8008/batches"
        );
    }

    /// Credentials in the ledger URL become basic authentication; the URLs the client
    /// builds (and any error quoting them) and its Debug form carry no password.
    #[test]
    fn credentials_leave_the_url() {
        let client = DltClient::new(
            "http://ledger%20user:p%40ss-s3cret@ledger:8008/base"
                .parse()
                .unwrap(),
            Dialect::Scabbard,
            Duration::from_secs(1),
        )
        .unwrap();
        let url = client.endpoint("c::s", "batches").unwrap();
        assert_eq!(url.as_str(), "http://ledger:8008/base/scabbard/c/s/batches");
        let request = client.authorized(client.http.post(url)).build().unwrap();
        let header = request.headers()[reqwest::header::AUTHORIZATION].clone();
        assert!(header.is_sensitive());
        // base64("ledger user:p@ss-s3cret")
        assert_eq!(header, "Basic bGVkZ2VyIHVzZXI6cEBzcy1zM2NyZXQ=");
        let debug = format!("{client:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        let plain = DltClient::new(
            "http://ledger:8008".parse().unwrap(),
            Dialect::Sawtooth,
            Duration::from_secs(1),
        )
        .unwrap();
        let request = plain
            .authorized(plain.http.get("http://ledger:8008/batches"))
            .build()
            .unwrap();
        assert!(
            request
                .headers()
                .get(reqwest::header::AUTHORIZATION)
                .is_none()
        );
    }
}
