//! Network-fault scenarios: the instance holding the services reaches the database or the
//! ledger through a [`Proxy`]; a fault is put on that link for longer than the slow
//! expiry, then lifted; the cluster drains and the checker runs.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use dltsub_store::DatabaseUrl;
use dltsub_store::testing::TestBackend;

use crate::cluster::Cluster;
use crate::proxy::{NetFault, Proxy};
use crate::scenario::{Drained, Outcome, drain_and_check, enqueue_workload};

/// Which link of the faulted instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Database,
    Ledger,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetScenario {
    pub link: Link,
    pub fault: NetFault,
}

impl std::fmt::Display for NetScenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let link = match self.link {
            Link::Database => "db",
            Link::Ledger => "dlt",
        };
        write!(f, "NET {link}: {}", self.fault)
    }
}

/// Each network fault on each link (PostgreSQL only: SQLite has no link).
pub fn net_matrix() -> Vec<NetScenario> {
    let latency = NetFault::Latency(Duration::from_millis(300));
    let mut scenarios = Vec::new();
    for fault in [
        latency,
        NetFault::BlackholeResponses,
        NetFault::Reset,
        NetFault::CutAfter(200),
    ] {
        scenarios.push(NetScenario {
            link: Link::Database,
            fault,
        });
    }
    for fault in [
        latency,
        NetFault::BlackholeResponses,
        NetFault::Reset,
        NetFault::LoseResponses,
    ] {
        scenarios.push(NetScenario {
            link: Link::Ledger,
            fault,
        });
    }
    scenarios
}

fn socket_of(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("cannot resolve {host}:{port}"))
}

/// How long a fault stays on: past the slow expiry, so the holder loses its claims.
const FAULT_TIME: Duration = Duration::from_secs(6);

pub async fn run_net_scenario(scenario: NetScenario) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut cluster = Cluster::start(TestBackend::Postgres).await?;
    enqueue_workload(&cluster).await?;
    let Ok(DatabaseUrl::Postgres(database_url)) = cluster.database_url.parse::<DatabaseUrl>()
    else {
        anyhow::bail!("network scenarios need PostgreSQL");
    };
    let mut database = url::Url::parse(&database_url)?;
    let database_target = socket_of(
        database.host_str().unwrap_or("127.0.0.1"),
        database.port().unwrap_or(5432),
    )?;
    let ledger_target = cluster.ledger.addr();
    let proxy = Proxy::start(match scenario.link {
        Link::Database => database_target,
        Link::Ledger => ledger_target,
    })
    .await?;
    let (database_url, ledger_url) = match scenario.link {
        Link::Database => {
            database
                .set_host(Some(&proxy.addr.ip().to_string()))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            database
                .set_port(Some(proxy.addr.port()))
                .map_err(|()| anyhow::anyhow!("cannot set the port"))?;
            (Some(database.to_string()), None)
        }
        Link::Ledger => (None, Some(format!("http://{}", proxy.addr))),
    };

    let faulted = cluster.add_instance_via("", database_url, ledger_url)?;
    let faulted_id = cluster.wait_registered(faulted).await?;
    cluster.add_instance("")?;
    // Let the work get going before the link fails.
    tokio::time::sleep(Duration::from_millis(800)).await;

    let held_at_fault = cluster.held_by(&faulted_id).await?;
    let fault_instant = Instant::now();
    proxy.set(scenario.fault);
    let mut failover = None;
    while fault_instant.elapsed() < FAULT_TIME {
        if failover.is_none() {
            let still = cluster.held_by(&faulted_id).await?;
            if held_at_fault.iter().all(|service| !still.contains(service)) {
                failover = Some(fault_instant.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.set(NetFault::None);
    let fired = proxy.affected.load(Ordering::Relaxed) > 0;

    let Drained {
        findings,
        problems,
        stale_rejected,
    } = drain_and_check(&mut cluster, false).await?;
    let kept = if problems.is_empty() && fired {
        None
    } else {
        Some(cluster.keep())
    };
    Ok(Outcome {
        name: scenario.to_string(),
        replay: "cargo run -p chaos -- matrix --only NET".into(),
        duplicate_allowed: false,
        fired,
        findings,
        stale_rejected,
        failover,
        elapsed: started.elapsed(),
        problems,
        kept,
    })
}
