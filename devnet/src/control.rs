//! The `/_devnet` routes and their in-process twin, [`DevnetControl`]: change the fault
//! knobs, restart the node, read the ledgers, the POST log and the counters.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::json;

use crate::config::{ConfigError, Dialect, Faults, FaultsPatch};
use crate::inspect::{DevnetStats, LedgerSnapshot, PostLog};
use crate::node::Node;

pub(crate) fn routes() -> Router<Arc<Node>> {
    Router::new()
        .route("/_devnet/faults", get(get_faults).put(put_faults))
        .route("/_devnet/restart", post(restart))
        .route("/_devnet/ledger", get(ledger))
        .route("/_devnet/posts", get(posts))
        .route("/_devnet/stats", get(stats))
}

async fn get_faults(State(node): State<Arc<Node>>) -> Json<Faults> {
    Json(node.faults())
}

/// Body: a [`FaultsPatch`] (any subset of the fields). Answers the faults now in force, or
/// 400 `{"error": …}`. The body is read as JSON whatever its Content-Type, so a bare
/// `curl -X PUT -d '{"paused":true}'` works.
async fn put_faults(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    let patch: FaultsPatch = match serde_json::from_slice(&body) {
        Ok(patch) => patch,
        Err(err) => return bad_request(&err.to_string()),
    };
    match node.update_faults(&patch) {
        Ok(faults) => Json(faults).into_response(),
        Err(err) => bad_request(&err.to_string()),
    }
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
}

/// Answers `{"forgotten": n}`, the batches in flight the restart lost.
async fn restart(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(json!({ "forgotten": node.restart() }))
}

/// `?ledger=circuit::service` narrows the answer to one ledger.
async fn ledger(State(node): State<Arc<Node>>, RawQuery(query): RawQuery) -> Json<LedgerSnapshot> {
    let mut snapshot = node.ledger_snapshot();
    let wanted = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == "ledger")
        .map(|(_, value)| value.into_owned());
    if let Some(wanted) = wanted {
        snapshot.ledgers.retain(|key, _| *key == wanted);
    }
    Json(snapshot)
}

async fn posts(State(node): State<Arc<Node>>) -> Json<PostLog> {
    Json(node.posts.snapshot())
}

async fn stats(State(node): State<Arc<Node>>) -> Json<DevnetStats> {
    Json(node.stats())
}

/// In-process control of a running devnet: everything the `/_devnet` routes do, without HTTP.
#[derive(Clone)]
pub struct DevnetControl {
    node: Arc<Node>,
}

impl DevnetControl {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    pub fn dialect(&self) -> Dialect {
        self.node.dialect
    }

    /// The fault knobs in force.
    pub fn faults(&self) -> Faults {
        self.node.faults()
    }

    /// Replaces every fault knob.
    pub fn set_faults(&self, faults: Faults) -> Result<(), ConfigError> {
        self.node.set_faults(faults)
    }

    /// Changes the knobs present in `patch`; returns the knobs now in force.
    pub fn update_faults(&self, patch: &FaultsPatch) -> Result<Faults, ConfigError> {
        self.node.update_faults(patch)
    }

    /// A full pause: ledger routes stop answering, nothing executes or commits.
    pub fn pause(&self) {
        self.set_paused(true);
    }

    pub fn resume(&self) {
        self.set_paused(false);
    }

    fn set_paused(&self, paused: bool) {
        let patch = FaultsPatch {
            paused: Some(paused),
            ..FaultsPatch::default()
        };
        // Only `paused` changes, and the knobs in force are already valid.
        let _ = self.node.update_faults(&patch);
    }

    /// Restarts the node; returns how many batches in flight were forgotten.
    pub fn restart(&self) -> u64 {
        self.node.restart()
    }

    /// Every ledger's committed batches.
    pub fn ledger(&self) -> LedgerSnapshot {
        self.node.ledger_snapshot()
    }

    /// The committed ids of one ledger in commit order (empty if it does not exist).
    pub fn committed(&self, ledger: &str) -> Vec<String> {
        self.node
            .ledger_snapshot()
            .ledgers
            .remove(ledger)
            .map(|view| view.committed)
            .unwrap_or_default()
    }

    pub fn posts(&self) -> PostLog {
        self.node.posts.snapshot()
    }

    pub fn stats(&self) -> DevnetStats {
        self.node.stats()
    }
}
