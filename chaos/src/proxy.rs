//! A TCP proxy that puts network faults on one link (instance ↔ database, instance ↔
//! ledger): latency, a one-way blackhole, resets, a cut after N bytes, and responses lost
//! after the server acted on the request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The fault on the link, changed at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    None,
    /// Every chunk in either direction waits this long.
    Latency(Duration),
    /// Bytes from the server to the client vanish (connections stay open).
    BlackholeResponses,
    /// Every open connection is closed at once, new ones are closed on arrival.
    Reset,
    /// A connection is closed once the client has sent this many bytes on it.
    CutAfter(u64),
    /// The request reaches the server; its response is dropped and the connection closed
    /// ("the ledger committed but the response never arrived").
    LoseResponses,
}

impl std::fmt::Display for NetFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetFault::None => write!(f, "none"),
            NetFault::Latency(d) => write!(f, "latency {}ms", d.as_millis()),
            NetFault::BlackholeResponses => write!(f, "blackhole responses"),
            NetFault::Reset => write!(f, "reset"),
            NetFault::CutAfter(n) => write!(f, "cut after {n} B"),
            NetFault::LoseResponses => write!(f, "lose responses"),
        }
    }
}

/// A running proxy. Dropping it stops accepting; connections end with their tasks.
pub struct Proxy {
    pub addr: SocketAddr,
    fault: watch::Sender<NetFault>,
    /// How often the fault changed what happened to the traffic (coverage).
    pub affected: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, watcher) = watch::channel(NetFault::None);
        let affected = Arc::new(AtomicU64::new(0));
        let counter = affected.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watcher = watcher.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    if *watcher.borrow() == NetFault::Reset {
                        counter.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    if let Ok(server) = TcpStream::connect(target).await {
                        connection(client, server, watcher, counter).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            fault,
            affected,
            task,
        })
    }

    pub fn set(&self, fault: NetFault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connection(
    client: TcpStream,
    server: TcpStream,
    watcher: watch::Receiver<NetFault>,
    affected: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = pump(
        client_read,
        server_write,
        Direction::Request,
        watcher.clone(),
        affected.clone(),
    );
    let downstream = pump(
        server_read,
        client_write,
        Direction::Response,
        watcher,
        affected,
    );
    // When either side ends (or a fault ends the connection), both halves are dropped.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Response,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    direction: Direction,
    mut watcher: watch::Receiver<NetFault>,
    affected: Arc<AtomicU64>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    let mut sent: u64 = 0;
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = watcher.changed() => {
                if changed.is_err() {
                    return;
                }
                if *watcher.borrow() == NetFault::Reset {
                    affected.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let fault = *watcher.borrow();
        match (fault, direction) {
            (NetFault::Reset, _) => {
                affected.fetch_add(1, Ordering::Relaxed);
                return;
            }
            (NetFault::Latency(delay), _) => {
                affected.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(delay).await;
            }
            (NetFault::BlackholeResponses, Direction::Response) => {
                affected.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            (NetFault::LoseResponses, Direction::Response) => {
                affected.fetch_add(1, Ordering::Relaxed);
                return;
            }
            (NetFault::CutAfter(limit), Direction::Request) if sent + n as u64 > limit => {
                affected.fetch_add(1, Ordering::Relaxed);
                let keep = limit.saturating_sub(sent) as usize;
                let _ = to.write_all(&buffer[..keep]).await;
                return;
            }
            _ => {}
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
        sent += n as u64;
    }
}
