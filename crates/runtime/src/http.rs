//! `/healthz`, `/readyz` and `/metrics`.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};

use crate::metrics::Metrics;

/// What the HTTP endpoints read.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// The worker's metrics.
    pub metrics: Arc<Metrics>,
    /// True once the first claim pass is done, false again while draining.
    pub ready: Arc<AtomicBool>,
    /// The worker id, as the metrics label.
    pub worker_id: String,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(&s.worker_id),
    )
}

/// The routes, callable without a socket.
pub fn app(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Binds `addr` and serves `router` (with the peer's address available as
/// `ConnectInfo<SocketAddr>`) until the returned task is aborted.
///
/// # Errors
/// When `addr` cannot be bound (in use, no permission).
pub async fn serve_router(
    addr: SocketAddr,
    router: Router,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    Ok((local, task))
}

/// Binds `addr` and serves until the returned task is aborted.
///
/// # Errors
/// When `addr` cannot be bound (in use, no permission).
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app(state)).await;
    });
    Ok((local, task))
}
