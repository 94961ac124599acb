//! The HTTP server: an accept loop on hyper with one task per connection, so that a handler
//! can have its connection closed without a response (the `drop_after_commit` fault), which
//! `axum::serve` cannot do.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::{DevnetArgs, DevnetConfig, Dialect};
use crate::control::{self, DevnetControl};
use crate::node::Node;
use crate::routes::{self, ConnectionKill};

/// How long shutdown waits for connections and tasks before giving up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves devnet on `listener` until `shutdown` completes, then closes every connection
/// (waits end early with the statuses known then) and stops every task.
pub async fn serve(
    listener: TcpListener,
    config: DevnetConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate().context("invalid devnet configuration")?;
    let token = CancellationToken::new();
    let node = Node::new(&config, token.clone());
    // Turns the caller's future into the token every task watches; ends with the server.
    let watcher = {
        let token = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => token.cancel(),
                () = token.cancelled() => {}
            }
        })
    };
    let result = run(listener, node).await;
    token.cancel();
    let _ = watcher.await;
    result
}

/// `dltsub devnet`: binds `args.listen` and serves until `shutdown`.
pub async fn run_devnet(
    args: &DevnetArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = args.config()?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(
        dialect = %config.dialect,
        seed = config.seed,
        "devnet listening on http://{addr}"
    );
    serve(listener, config, shutdown).await
}

fn router(node: Arc<Node>) -> Router {
    routes::routes(node.dialect)
        .merge(control::routes())
        .with_state(node)
}

async fn run(listener: TcpListener, node: Arc<Node>) -> anyhow::Result<()> {
    let router = router(node.clone());
    loop {
        let stream = tokio::select! {
            () = node.shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!(error = %err, "devnet cannot accept a connection");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                        () = node.shutdown.cancelled() => break,
                    }
                }
            },
        };
        // Small requests and answers: don't let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        node.tracker.spawn(serve_connection(
            stream,
            router.clone(),
            node.shutdown.clone(),
        ));
    }
    drop(listener);
    node.tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, node.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("devnet tasks still running {SHUTDOWN_GRACE:?} after shutdown");
    }
    Ok(())
}

async fn serve_connection(stream: TcpStream, router: Router, shutdown: CancellationToken) {
    let kill = CancellationToken::new();
    let service = {
        let kill = ConnectionKill(kill.clone());
        router.map_request(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(kill.clone());
            request
        })
    };
    let connection = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(error = %err, "devnet connection ended with an error");
            }
        }
        // Dropping the connection closes the socket without writing anything.
        () = kill.cancelled() => {}
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

/// A devnet running in this process on `127.0.0.1`, for tests and benchmarks. Dropping it
/// shuts it down; [`Devnet::shutdown`] also waits for it to stop.
pub struct Devnet {
    addr: SocketAddr,
    base_url: String,
    control: DevnetControl,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Devnet {
    /// Starts a devnet on a free loopback port.
    pub async fn spawn(config: DevnetConfig) -> anyhow::Result<Self> {
        config.validate().context("invalid devnet configuration")?;
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let node = Node::new(&config, shutdown.clone());
        let control = DevnetControl::new(node.clone());
        let task = tokio::spawn(run(listener, node));
        Ok(Self {
            addr,
            base_url: format!("http://{addr}"),
            control,
            shutdown,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn dialect(&self) -> Dialect {
        self.control.dialect()
    }

    /// `{base}/scabbard/{circuit}/{service}`: the base a scabbard client is given.
    pub fn scabbard_url(&self, circuit: &str, service: &str) -> String {
        format!("{}/scabbard/{circuit}/{service}", self.base_url)
    }

    pub fn control(&self) -> &DevnetControl {
        &self.control
    }

    /// Stops the server and waits for its connections and tasks to end.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(task) => task.await.context("devnet server task panicked")?,
            None => Ok(()),
        }
    }
}

impl Drop for Devnet {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
