//! Starting a devnet and talking to it over HTTP, as a client would.

use std::time::Duration;

use dltsub_devnet::{Devnet, DevnetConfig, DevnetStats, Dialect, Latency, LedgerSnapshot, PostLog};
use dltsub_wire::sawtooth::BatchStatuses;
use dltsub_wire::scabbard::ScabbardBatchInfo;
use dltsub_wire::{Batch, BatchList, Transaction};
use prost::Message;
use serde_json::Value;

pub const CIRCUIT: &str = "circ1";
pub const SERVICE: &str = "svc1";
pub const LEDGER: &str = "circ1::svc1";

pub struct Net {
    pub devnet: Devnet,
    pub http: reqwest::Client,
}

/// A devnet with a 20 ms commit latency, changed by `adjust`.
pub async fn start(dialect: Dialect, adjust: impl FnOnce(&mut DevnetConfig)) -> Net {
    let mut config = DevnetConfig::new(dialect);
    config.faults.commit_latency = Latency::fixed(Duration::from_millis(20));
    adjust(&mut config);
    Net {
        devnet: Devnet::spawn(config).await.unwrap(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap(),
    }
}

/// The id of batch `n` (128 lowercase hex).
pub fn id(n: u64) -> String {
    format!("{n:0128x}")
}

/// Ids `from..to`.
pub fn ids(from: u64, to: u64) -> Vec<String> {
    (from..to).map(id).collect()
}

pub fn txn_id(batch_id: &str) -> String {
    batch_id.replace('0', "e")
}

pub fn batch(id: &str, payload: &[u8]) -> Batch {
    Batch {
        header: b"header".to_vec(),
        header_signature: id.to_owned(),
        transactions: vec![Transaction {
            header: b"txn-header".to_vec(),
            header_signature: txn_id(id),
            payload: payload.to_vec(),
        }],
        trace: false,
    }
}

/// A BatchList body of valid batches.
pub fn body(ids: &[String]) -> Vec<u8> {
    BatchList {
        batches: ids.iter().map(|id| batch(id, b"ok")).collect(),
    }
    .encode_to_vec()
}

pub fn invalid_body(id: &str) -> Vec<u8> {
    BatchList {
        batches: vec![batch(id, b"invalid: no funds")],
    }
    .encode_to_vec()
}

/// Status, Content-Type and body text of an answer.
pub struct Answer {
    pub status: u16,
    pub content_type: Option<String>,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }
}

pub async fn answer(response: reqwest::Response) -> Answer {
    Answer {
        status: response.status().as_u16(),
        content_type: response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned()),
        text: response.text().await.unwrap(),
    }
}

impl Net {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.devnet.base_url())
    }

    /// POSTs a body to the dialect's batches route with `content_type` (none if `None`).
    pub async fn post_with(&self, body: Vec<u8>, content_type: Option<&str>) -> Answer {
        let url = match self.devnet.dialect() {
            Dialect::Scabbard => format!("{}/batches", self.devnet.scabbard_url(CIRCUIT, SERVICE)),
            Dialect::Sawtooth => self.url("/batches"),
        };
        let mut request = self.http.post(url).body(body);
        if let Some(content_type) = content_type {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type);
        }
        answer(request.send().await.unwrap()).await
    }

    pub async fn post(&self, body: Vec<u8>) -> Answer {
        self.post_with(body, Some("application/octet-stream")).await
    }

    pub async fn post_ids(&self, ids: &[String]) -> Answer {
        self.post(body(ids)).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        answer(self.http.get(self.url(path)).send().await.unwrap()).await
    }

    /// Scabbard statuses of `ids`, with `&wait=…` if given.
    pub async fn scabbard_statuses(
        &self,
        ids: &[String],
        wait: Option<&str>,
    ) -> Vec<ScabbardBatchInfo> {
        let mut path = format!(
            "/scabbard/{CIRCUIT}/{SERVICE}/batch_statuses?ids={}",
            ids.join(",")
        );
        if let Some(wait) = wait {
            path.push_str(&format!("&wait={wait}"));
        }
        let answer = self.get(&path).await;
        assert_eq!(answer.status, 200, "{}", answer.text);
        serde_json::from_str(&answer.text).unwrap()
    }

    /// Sawtooth statuses of `ids` by GET, with `&wait=…` if given.
    pub async fn sawtooth_statuses(&self, ids: &[String], wait: Option<&str>) -> BatchStatuses {
        let mut path = format!("/batch_statuses?id={}", ids.join(","));
        if let Some(wait) = wait {
            path.push_str(&format!("&wait={wait}"));
        }
        let answer = self.get(&path).await;
        assert_eq!(answer.status, 200, "{}", answer.text);
        serde_json::from_str(&answer.text).unwrap()
    }

    /// Waits (with the ledger's own `wait`) until `ids` are final.
    pub async fn settle(&self, ids: &[String]) {
        match self.devnet.dialect() {
            Dialect::Scabbard => {
                let infos = self.scabbard_statuses(ids, Some("10")).await;
                assert!(
                    infos.iter().all(|i| i.status.kind().is_final()),
                    "{infos:?}"
                );
            }
            Dialect::Sawtooth => {
                let statuses = self.sawtooth_statuses(ids, Some("10")).await;
                assert!(
                    statuses.data.iter().all(|s| s.status.is_final()),
                    "{statuses:?}"
                );
            }
        }
    }

    pub async fn put_faults(&self, patch: Value) -> Answer {
        answer(
            self.http
                .put(self.url("/_devnet/faults"))
                .json(&patch)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn restart(&self) -> Value {
        let answer = answer(
            self.http
                .post(self.url("/_devnet/restart"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, 200);
        answer.json()
    }

    pub async fn ledger(&self) -> LedgerSnapshot {
        serde_json::from_str(&self.get("/_devnet/ledger").await.text).unwrap()
    }

    pub async fn committed(&self, ledger: &str) -> Vec<String> {
        self.ledger()
            .await
            .ledgers
            .remove(ledger)
            .map(|view| view.committed)
            .unwrap_or_default()
    }

    pub async fn posts(&self) -> PostLog {
        serde_json::from_str(&self.get("/_devnet/posts").await.text).unwrap()
    }

    pub async fn stats(&self) -> DevnetStats {
        serde_json::from_str(&self.get("/_devnet/stats").await.text).unwrap()
    }
}
