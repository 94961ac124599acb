//! The ledger routes of both dialects, answering as the real nodes do (see the crate
//! documentation for the table of answers and where each one comes from).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use dltsub_wire::sawtooth::{self, ErrorKind};
use dltsub_wire::scabbard::{self, ScabbardError};
use dltsub_wire::{
    BatchLink, BatchListError, BatchStatus, decode_batch_list, is_lowercase_batch_id,
};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::chance::Draw;
use crate::config::{Dialect, Faults, SAWTOOTH_LEDGER};
use crate::inspect::PostRecord;
use crate::node::{Acceptance, Ledger, Node, StatusView};

/// Put in every request by the server loop: cancelling it closes the request's connection
/// without a response.
#[derive(Clone)]
pub(crate) struct ConnectionKill(pub CancellationToken);

/// The routes of `dialect`.
pub(crate) fn routes(dialect: Dialect) -> Router<Arc<Node>> {
    match dialect {
        Dialect::Scabbard => Router::new()
            .route("/scabbard/{circuit}/{service}/batches", post(scabbard_post))
            .route(
                "/scabbard/{circuit}/{service}/batch_statuses",
                get(scabbard_statuses),
            ),
        Dialect::Sawtooth => Router::new().route("/batches", post(sawtooth_post)).route(
            "/batch_statuses",
            get(sawtooth_statuses_get).post(sawtooth_statuses_post),
        ),
    }
}

/// Where the 202's link points.
enum Link {
    Scabbard { circuit: String, service: String },
    Sawtooth { base: String },
}

async fn scabbard_post(
    State(node): State<Arc<Node>>,
    Path((circuit, service)): Path<(String, String)>,
    Extension(kill): Extension<ConnectionKill>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = format!("{circuit}::{service}");
    post_batches(
        node,
        key,
        Link::Scabbard { circuit, service },
        kill,
        headers,
        body,
    )
    .await
}

async fn sawtooth_post(
    State(node): State<Arc<Node>>,
    Extension(kill): Extension<ConnectionKill>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let base = format!("http://{}", host(&headers));
    post_batches(
        node,
        SAWTOOTH_LEDGER.to_owned(),
        Link::Sawtooth { base },
        kill,
        headers,
        body,
    )
    .await
}

/// What became of a POST: the response (none when the connection is to be dropped) and the
/// injected fault.
struct Outcome {
    response: Option<Response>,
    fault: Option<&'static str>,
}

impl From<Response> for Outcome {
    fn from(response: Response) -> Self {
        Outcome {
            response: Some(response),
            fault: None,
        }
    }
}

async fn post_batches(
    node: Arc<Node>,
    key: String,
    link: Link,
    kill: ConnectionKill,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seq = node.posts.next_seq();
    let time_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64;
    let mut record = PostRecord {
        seq,
        time_us,
        ledger: key.clone(),
        batch_ids: Vec::new(),
        duplicates: Vec::new(),
        instance: header_text(&headers, "x-dltsub-instance"),
        epoch: header_text(&headers, "x-dltsub-epoch"),
        status: None,
        fault: None,
    };
    let outcome = if node.unpaused().await {
        let ledger = node.ledger(&key);
        let number = ledger.posts.fetch_add(1, Ordering::Relaxed);
        let faults = node.faults();
        if response_delay(&node, &ledger, &faults).await {
            handle_post(
                &node,
                &ledger,
                number,
                &faults,
                &link,
                &headers,
                &body,
                &mut record,
            )
            .await
        } else {
            unavailable(node.dialect).into()
        }
    } else {
        unavailable(node.dialect).into()
    };
    record.status = outcome.response.as_ref().map(|r| r.status().as_u16());
    record.fault = outcome.fault.map(str::to_owned);
    node.posts.push(record);
    match outcome.response {
        Some(response) => response,
        None => {
            kill.0.cancel();
            // The server loop drops this connection, and this future with it.
            std::future::pending().await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle_post(
    node: &Node,
    ledger: &Ledger,
    number: u64,
    faults: &Faults,
    link: &Link,
    headers: &HeaderMap,
    body: &[u8],
    record: &mut PostRecord,
) -> Outcome {
    let dialect = node.dialect;
    if dialect == Dialect::Sawtooth {
        // The REST API compares the header to exactly this string; a missing header is a
        // KeyError in its handler, which aiohttp answers with a plain 500.
        match headers.get(header::CONTENT_TYPE) {
            None => return aiohttp_internal_error().into(),
            Some(value) if value.as_bytes() != dltsub_wire::OCTET_STREAM.as_bytes() => {
                return sawtooth_error(ErrorKind::SubmissionWrongContentType, "").into();
            }
            Some(_) => {}
        }
        if body.is_empty() {
            return sawtooth_error(ErrorKind::NoBatchesSubmitted, "").into();
        }
    }
    // Scabbard does not look at the Content-Type at all: real clients send
    // `octet-stream`, `application/octet-stream`, or nothing.
    let list = match decode_batch_list(body) {
        Ok(list) => list,
        Err(err) => return refused_list(dialect, &err).into(),
    };
    record.batch_ids = list.batch_ids().map(str::to_owned).collect();

    let draw = node.draw(Draw::BeforeAccept, &ledger.key, number);
    if draw < faults.error_500_before {
        return Outcome {
            response: Some(internal_error(dialect)),
            fault: Some("error_500_before"),
        };
    }
    if draw < faults.error_500_before + faults.error_503_before {
        return Outcome {
            response: Some(unavailable(dialect)),
            fault: Some("error_503_before"),
        };
    }

    let incoming = Ledger::incoming(node, &list, faults);
    match ledger.accept(node, incoming, faults) {
        Acceptance::Full => return back_pressure(dialect).into(),
        Acceptance::Accepted { duplicates } => record.duplicates = duplicates,
    }

    let draw = node.draw(Draw::AfterCommit, &ledger.key, number);
    if draw < faults.error_500_after_commit + faults.drop_after_commit {
        // Fail only once the batches are in the ledger, as a node does that commits and then
        // loses the response. Bounded, so a pause cannot hold the request forever.
        let deadline = Instant::now() + faults.commit_latency.max + Duration::from_secs(5);
        ledger
            .wait_statuses(&record.batch_ids, Some(deadline), &node.shutdown)
            .await;
        return if draw < faults.error_500_after_commit {
            Outcome {
                response: Some(internal_error(dialect)),
                fault: Some("error_500_after_commit"),
            }
        } else {
            Outcome {
                response: None,
                fault: Some("drop_after_commit"),
            }
        };
    }

    let ids = list.batch_ids();
    let response = match link {
        Link::Scabbard { circuit, service } => scabbard_json(
            StatusCode::ACCEPTED,
            &BatchLink {
                link: scabbard::batch_statuses_link(circuit, service, ids),
            },
        ),
        Link::Sawtooth { base } => sawtooth_json(
            StatusCode::ACCEPTED,
            &BatchLink {
                link: format!(
                    "{base}/batch_statuses?id={}",
                    ids.collect::<Vec<_>>().join(",")
                ),
            },
        ),
    };
    response.into()
}

async fn scabbard_statuses(
    State(node): State<Arc<Node>>,
    Path((circuit, service)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    if !node.unpaused().await {
        return unavailable(node.dialect);
    }
    let ledger = node.ledger(&format!("{circuit}::{service}"));
    if !response_delay(&node, &ledger, &node.faults()).await {
        return unavailable(node.dialect);
    }
    let query = Query::parse(query.as_deref());
    // actix deserialises the query into a map: the last value of a key wins.
    let Some(ids) = query.last("ids") else {
        return scabbard_json(
            StatusCode::BAD_REQUEST,
            &ScabbardError::bad_request(scabbard::MSG_NO_IDS),
        );
    };
    // Scabbard collects the ids into a set: each answered once.
    let mut seen = HashSet::new();
    let ids: Vec<String> = ids
        .split(',')
        .filter(|id| seen.insert(*id))
        .map(str::to_owned)
        .collect();
    let wait = match query.last("wait") {
        None | Some("false") => None,
        Some(text) => Some(text.parse().unwrap_or(scabbard::DEFAULT_WAIT_SECS)),
    };
    let deadline = wait.map(|secs| Instant::now() + Duration::from_secs(secs));
    let views = ledger.wait_statuses(&ids, deadline, &node.shutdown).await;
    let infos: Vec<_> = views.into_iter().map(scabbard_info).collect();
    scabbard_json(StatusCode::OK, &infos)
}

fn scabbard_info(view: StatusView) -> scabbard::ScabbardBatchInfo {
    let valid = || {
        view.transaction_ids
            .iter()
            .map(|id| scabbard::ScabbardValidTransaction {
                transaction_id: id.clone(),
            })
            .collect()
    };
    let status = match view.status {
        BatchStatus::Unknown => scabbard::ScabbardStatus::Unknown,
        BatchStatus::Pending => scabbard::ScabbardStatus::Pending,
        BatchStatus::Valid => scabbard::ScabbardStatus::Valid(valid()),
        BatchStatus::Committed => scabbard::ScabbardStatus::Committed(valid()),
        BatchStatus::Invalid => scabbard::ScabbardStatus::Invalid(
            view.invalid
                .iter()
                .map(|invalid| scabbard::ScabbardInvalidTransaction {
                    transaction_id: invalid.transaction_id.clone(),
                    error_message: invalid.message.clone(),
                    error_data: Vec::new(),
                })
                .collect(),
        ),
    };
    scabbard::ScabbardBatchInfo {
        id: view.id,
        status,
        timestamp: view.timestamp.into(),
    }
}

async fn sawtooth_statuses_get(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let Some(ledger) = sawtooth_gate(&node).await else {
        return unavailable(node.dialect);
    };
    let query = Query::parse(query.as_deref());
    // aiohttp's `query.get` returns the first value of a key.
    let Some(ids) = query.first("id") else {
        return sawtooth_error(ErrorKind::StatusIdQueryInvalid, "");
    };
    let ids: Vec<String> = ids.split(',').map(str::to_owned).collect();
    if let Some(bad) = ids.iter().find(|id| !is_lowercase_batch_id(id)) {
        return sawtooth_error(ErrorKind::InvalidResourceId, bad);
    }
    let link = format!(
        "http://{}/batch_statuses{}",
        host(&headers),
        query.sawtooth_link_query()
    );
    sawtooth_statuses(&node, &ledger, &ids, &query, Some(link)).await
}

async fn sawtooth_statuses_post(
    State(node): State<Arc<Node>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let Some(ledger) = sawtooth_gate(&node).await else {
        return unavailable(node.dialect);
    };
    match headers.get(header::CONTENT_TYPE) {
        None => return aiohttp_internal_error(),
        Some(value) if value.as_bytes() != b"application/json" => {
            return sawtooth_error(ErrorKind::StatusWrongContentType, "");
        }
        Some(_) => {}
    }
    // `await request.json()` raises on a body that is not JSON: a plain 500 from aiohttp.
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return aiohttp_internal_error();
    };
    let ids: Option<Vec<String>> = value
        .as_array()
        .filter(|ids| !ids.is_empty())
        .and_then(|ids| {
            ids.iter()
                .map(|id| id.as_str().map(str::to_owned))
                .collect()
        });
    let Some(ids) = ids else {
        return sawtooth_error(ErrorKind::StatusBodyInvalid, "");
    };
    if let Some(bad) = ids.iter().find(|id| !is_lowercase_batch_id(id)) {
        return sawtooth_error(ErrorKind::InvalidResourceId, bad);
    }
    let query = Query::parse(query.as_deref());
    sawtooth_statuses(&node, &ledger, &ids, &query, None).await
}

/// Pause and response latency of a Sawtooth status route; `None` when shutting down.
async fn sawtooth_gate(node: &Arc<Node>) -> Option<Arc<Ledger>> {
    if !node.unpaused().await {
        return None;
    }
    let ledger = node.ledger(SAWTOOTH_LEDGER);
    response_delay(node, &ledger, &node.faults())
        .await
        .then_some(ledger)
}

async fn sawtooth_statuses(
    node: &Node,
    ledger: &Ledger,
    ids: &[String],
    query: &Query,
    link: Option<String>,
) -> Response {
    // `wait` present and not "false": its integer value, or 95% of the REST API's timeout.
    let wait = match query.first("wait") {
        None => None,
        Some(text) if text.eq_ignore_ascii_case("false") => None,
        Some(text) => Some(text.trim().parse().unwrap_or(sawtooth::DEFAULT_WAIT_SECS)),
    };
    let deadline = wait.map(|secs| Instant::now() + Duration::from_secs(secs));
    let views = ledger.wait_statuses(ids, deadline, &node.shutdown).await;
    let data = views
        .into_iter()
        .map(|view| sawtooth::SawtoothBatchStatus {
            invalid_transactions: view
                .invalid
                .iter()
                .map(|invalid| sawtooth::InvalidTransaction {
                    extended_data: String::new(),
                    id: invalid.transaction_id.clone(),
                    message: invalid.message.clone(),
                })
                .collect(),
            id: view.id,
            status: view.status,
        })
        .collect();
    sawtooth_json(StatusCode::OK, &sawtooth::BatchStatuses { data, link })
}

/// A decoded query string, pairs in order.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: Option<&str>) -> Self {
        Query(
            url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn first(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn last(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The query of the `link` Sawtooth answers a GET with: the request's keys (first value
    /// each), `head`, `start` and `limit` first, then the rest sorted, values unencoded.
    fn sawtooth_link_query(&self) -> String {
        let mut keys: Vec<&str> = Vec::new();
        for (key, _) in &self.0 {
            if !keys.contains(&key.as_str()) {
                keys.push(key);
            }
        }
        let rank = |key: &str| match key {
            "head" => 0,
            "start" => 1,
            "limit" => 2,
            _ => 3,
        };
        keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
        let parts: Vec<String> = keys
            .iter()
            .map(|key| match self.first(key) {
                Some("") | None => (*key).to_owned(),
                Some(value) => format!("{key}={value}"),
            })
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!("?{}", parts.join("&"))
        }
    }
}

/// Sleeps the configured response latency. False when devnet shut down meanwhile.
async fn response_delay(node: &Node, ledger: &Ledger, faults: &Faults) -> bool {
    let number = ledger.requests.fetch_add(1, Ordering::Relaxed);
    let delay =
        faults
            .response_latency
            .sample(node.draw(Draw::ResponseLatency, &ledger.key, number));
    if delay.is_zero() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = node.shutdown.cancelled() => false,
    }
}

fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
}

fn host(headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("localhost")
        .to_owned()
}

/// A scabbard answer: actix's compact JSON.
fn scabbard_json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// A Sawtooth answer: the REST API's indented, key-sorted JSON.
fn sawtooth_json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        sawtooth::to_json(body),
    )
        .into_response()
}

fn sawtooth_error(kind: ErrorKind, additional_info: &str) -> Response {
    let status = StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    sawtooth_json(status, &kind.body(additional_info))
}

/// aiohttp's answer to an exception in a handler.
fn aiohttp_internal_error() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "500 Internal Server Error\n\nServer got itself in trouble",
    )
        .into_response()
}

fn refused_list(dialect: Dialect, err: &BatchListError) -> Response {
    match dialect {
        Dialect::Scabbard => {
            let message = match err {
                BatchListError::Decode(_) => scabbard::MSG_NOT_A_BATCH_LIST,
                _ => scabbard::MSG_NO_VALID_BATCHES,
            };
            scabbard_json(
                StatusCode::BAD_REQUEST,
                &ScabbardError::bad_request(message),
            )
        }
        Dialect::Sawtooth => sawtooth_error(
            match err {
                BatchListError::Decode(_) => ErrorKind::BadProtobufSubmitted,
                BatchListError::Empty => ErrorKind::NoBatchesSubmitted,
                _ => ErrorKind::SubmittedBatchesInvalid,
            },
            "",
        ),
    }
}

fn internal_error(dialect: Dialect) -> Response {
    match dialect {
        Dialect::Scabbard => scabbard_json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &ScabbardError::internal_error(),
        ),
        Dialect::Sawtooth => sawtooth_error(ErrorKind::UnknownValidatorError, ""),
    }
}

/// The message of devnet's scabbard 503 (Splinter has no canned 503 body).
pub const SCABBARD_UNAVAILABLE_MESSAGE: &str = "The service is unavailable";

fn unavailable(dialect: Dialect) -> Response {
    match dialect {
        Dialect::Scabbard => scabbard_json(
            StatusCode::SERVICE_UNAVAILABLE,
            &ScabbardError {
                code: "503".into(),
                message: SCABBARD_UNAVAILABLE_MESSAGE.into(),
            },
        ),
        // The REST API could not reach its validator: nothing was submitted.
        Dialect::Sawtooth => sawtooth_error(ErrorKind::ValidatorDisconnected, ""),
    }
}

fn back_pressure(dialect: Dialect) -> Response {
    match dialect {
        // Scabbard's 429 has no body at all.
        Dialect::Scabbard => StatusCode::TOO_MANY_REQUESTS.into_response(),
        Dialect::Sawtooth => sawtooth_error(ErrorKind::BatchQueueFull, ""),
    }
}
