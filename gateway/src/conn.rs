//! Connections: the accept loop, hyper's HTTP/1 settings, the connection limits and the
//! graceful drain.
//!
//! - hyper closes a connection whose request headers are not complete within
//!   `header_timeout` (`header_read_timeout`; hyper restarts it for each request, so it is
//!   also the keep-alive idle time) and answers 431 past its hard header-count limit;
//! - no half-close: a client whose side of the connection ends (EOF) while its request is
//!   queued, prefilling or generating is gone, so hyper drops the request's future, which
//!   aborts it in the engine and frees its seats and KV blocks within one step (without
//!   this, a request that hung up before its first token was only noticed at its first
//!   write). As uvicorn (vLLM) does, a client that shuts down only its sending side is
//!   taken as gone too;
//! - at most `max_connections` connections at once, and `max_connections_per_ip` from one
//!   address; the last [`RESERVED_SHARE`]th of the places go only to addresses holding fewer
//!   than [`LIGHT_SOURCE`] connections (a probe, a light client), so a few addresses opening
//!   connections by the hundred cannot take them all. A connection over a limit is answered
//!   once with 503 (total) or 429 (per address) in OpenAI's error shape and closed, except
//!   that `/healthz` is answered 200 (the process is alive). At most [`MAX_REFUSING`] such
//!   answers are pending at once; beyond that a connection is closed without one;
//! - the errors hyper answers by itself (a head it cannot parse) get OpenAI bodies too
//!   ([`head_errors`]).

mod head_errors;

use axum::response::IntoResponse;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::config::EdgeConfig;
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::proxy::PeerAddr;
use head_errors::HeadErrors;

/// Closes the connection a request came on (put in every request's extensions): for a stream
/// whose client stopped reading, where an error in the body would never be seen because
/// hyper no longer polls it.
#[derive(Clone, Debug, Default)]
pub struct ConnKill(Arc<Notify>);

impl ConnKill {
    pub fn close(&self) {
        self.0.notify_one();
    }

    async fn closed(&self) {
        self.0.notified().await;
    }
}

type Conn = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves one connection with `app` (watched by `graceful` when given), closing it early if
/// one of its requests asks ([`ConnKill`]).
fn serve_conn(
    builder: &http1::Builder,
    app: &Router,
    stream: TcpStream,
    graceful: Option<&GracefulShutdown>,
) -> Conn {
    let kill = ConnKill::default();
    let k = kill.clone();
    // The TCP peer, for the trusted-proxy check of `crate::proxy`.
    let peer = stream.peer_addr().ok().map(PeerAddr);
    let svc = TowerToHyperService::new(app.clone().map_request(
        move |mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(k.clone());
            if let Some(p) = peer {
                req.extensions_mut().insert(p);
            }
            req
        },
    ));
    let conn = builder.serve_connection(TokioIo::new(HeadErrors::new(stream)), svc);
    let conn: Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>> = match graceful {
        Some(g) => Box::pin(g.watch(conn)),
        None => Box::pin(conn),
    };
    Box::pin(async move {
        tokio::select! {
            _ = conn => {}
            () = kill.closed() => {}
        }
    })
}

/// Liveness: 200 while the process is up (Kubernetes' `livenessProbe`).
pub const LIVENESS_PATH: &str = "/healthz";

/// Connections being answered with a refusal at once, at most.
pub const MAX_REFUSING: usize = 256;
/// One place in this many of `--max-connections` is kept for light sources.
pub const RESERVED_SHARE: usize = 8;
/// A source holding fewer connections than this is light: it may take a reserved place.
pub const LIGHT_SOURCE: usize = 4;

/// How many connections are open, in all and per address.
#[derive(Debug)]
pub struct ConnLimits {
    total: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max_total: usize,
    max_per_ip: usize,
}

/// An open connection's places; released on drop.
#[derive(Debug)]
pub struct ConnGuard {
    _total: OwnedSemaphorePermit,
    ip: IpAddr,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut map = self.per_ip.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl ConnLimits {
    pub fn new(max_total: usize, max_per_ip: usize) -> ConnLimits {
        ConnLimits {
            total: Arc::new(Semaphore::new(max_total)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            per_ip: Arc::new(Mutex::new(HashMap::new())),
            max_total,
            max_per_ip,
        }
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.max_total - self.total.available_permits()
    }

    /// Places kept for light sources: the last eighth of `--max-connections`.
    fn reserved(&self) -> usize {
        self.max_total
            .div_ceil(RESERVED_SHARE)
            .min(self.max_total - 1)
    }

    /// Takes places for a connection from `ip`, or says which limit it is over. The last
    /// [`RESERVED_SHARE`]th of the places go only to sources holding fewer than
    /// [`LIGHT_SOURCE`] connections: a few addresses that open connections by the hundred
    /// (slow headers, a flood) cannot take the last place from a probe or a light client.
    pub fn admit(&self, ip: IpAddr) -> Result<ConnGuard, GatewayError> {
        let over_total = || GatewayError::TooManyConnections {
            limit: self.max_total,
            per_address: false,
        };
        // Admissions are serialized by the map's lock; releases only add places.
        let mut map = self.per_ip.lock().unwrap_or_else(PoisonError::into_inner);
        let n = map.get(&ip).copied().unwrap_or(0);
        if n >= self.max_per_ip {
            return Err(GatewayError::TooManyConnections {
                limit: self.max_per_ip,
                per_address: true,
            });
        }
        if n >= LIGHT_SOURCE && self.total.available_permits() <= self.reserved() {
            return Err(over_total());
        }
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| over_total())?;
        *map.entry(ip).or_insert(0) += 1;
        Ok(ConnGuard {
            _total: total,
            ip,
            per_ip: self.per_ip.clone(),
        })
    }
}

/// The HTTP/1 settings every connection is served with.
fn builder(cfg: &EdgeConfig) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .half_close(false)
        // hyper's own limit (431, given an OpenAI body by `head_errors`) sits above ours
        // (`header_limits`), which names the count and the limit.
        .max_headers(cfg.max_headers.saturating_mul(2).max(100));
    b
}

/// One listener's accept loop, until `stop` resolves; then a graceful drain of at most
/// `drain`: idle connections close at once, busy ones after their current response, and
/// connections that arrive meanwhile are served one request each (which the draining state
/// answers with 503).
pub struct Accept {
    pub listener: TcpListener,
    pub app: Router,
    pub config: EdgeConfig,
    pub metrics: Metrics,
    pub drain: Duration,
}

/// The connections still open when the drain deadline passed.
pub struct Remaining(JoinSet<()>);

impl Remaining {
    /// Waits up to `grace` for them to end (e.g. streams writing their error event after the
    /// engine stopped), then closes the rest.
    pub async fn close(mut self, grace: Duration) {
        let all = async { while self.0.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, all).await.is_err() {
            self.0.abort_all();
            while self.0.join_next().await.is_some() {}
        }
    }
}

impl Accept {
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> Remaining {
        let limits = ConnLimits::new(
            self.config.max_connections,
            self.config.max_connections_per_ip,
        );
        let builder = builder(&self.config);
        let graceful = GracefulShutdown::new();
        let mut tasks = JoinSet::new();
        tokio::pin!(stop);
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut stop => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, don't spin.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            while tasks.try_join_next().is_some() {}
            // Small writes (a stream's events, a body's last chunk) go out at once, not after
            // the peer's delayed ACK (Nagle's algorithm).
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
            }
            match limits.admit(peer.ip()) {
                Ok(guard) => {
                    let conn = serve_conn(&builder, &self.app, stream, Some(&graceful));
                    tasks.spawn(async move {
                        let _guard = guard;
                        conn.await;
                    });
                }
                Err(refusal) => self.refuse(&limits, &builder, stream, peer, refusal, &mut tasks),
            }
        }
        self.drain_phase(graceful, &limits, &builder, &mut tasks)
            .await;
        Remaining(tasks)
    }

    /// Draining: the open connections finish their requests (idle ones close now); the
    /// listener stays open so that probes and new requests get a clear 503 (`/readyz`
    /// "draining", generation "shutting down"), each on a connection closed after it.
    async fn drain_phase(
        &self,
        graceful: GracefulShutdown,
        limits: &ConnLimits,
        builder: &http1::Builder,
        tasks: &mut JoinSet<()>,
    ) {
        let drained = graceful.shutdown();
        let deadline = tokio::time::sleep(self.drain);
        tokio::pin!(drained, deadline);
        let mut once = builder.clone();
        once.keep_alive(false);
        loop {
            tokio::select! {
                () = &mut drained => break,
                () = &mut deadline => {
                    tracing::warn!(
                        "drain deadline of {:?} passed; closing the remaining connections",
                        self.drain
                    );
                    break;
                }
                accepted = self.listener.accept() => {
                    let Ok((stream, peer)) = accepted else { continue };
                    while tasks.try_join_next().is_some() {}
                    let Ok(guard) = limits.admit(peer.ip()) else { continue };
                    let conn = serve_conn(&once, &self.app, stream, None);
                    tasks.spawn(async move {
                        let _guard = guard;
                        conn.await;
                    });
                }
            }
        }
    }

    /// Answers a connection over a limit once, then closes it.
    fn refuse(
        &self,
        limits: &ConnLimits,
        builder: &http1::Builder,
        stream: TcpStream,
        peer: SocketAddr,
        refusal: GatewayError,
        tasks: &mut JoinSet<()>,
    ) {
        self.metrics.shed("connections");
        let Ok(permit) = limits.refusing.clone().try_acquire_owned() else {
            return; // dropping the stream closes it
        };
        tracing::debug!(%peer, error = %refusal, "connection refused");
        let per_address = matches!(
            refusal,
            GatewayError::TooManyConnections {
                per_address: true,
                ..
            }
        );
        let limit = match refusal {
            GatewayError::TooManyConnections { limit, .. } => limit,
            _ => 0,
        };
        let svc = hyper::service::service_fn(move |req: axum::http::Request<_>| async move {
            // The process is alive even when its connections are full: liveness is answered
            // truthfully, so an orchestrator never restarts a node for its load.
            let resp = if req.uri().path() == LIVENESS_PATH {
                axum::Json(serde_json::json!({"status": "ok"})).into_response()
            } else {
                GatewayError::TooManyConnections { limit, per_address }.into_response()
            };
            Ok::<_, Infallible>(resp)
        });
        let mut b = builder.clone();
        b.keep_alive(false);
        tasks.spawn(async move {
            let _permit = permit;
            let _ = b
                .serve_connection(TokioIo::new(HeadErrors::new(stream)), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_per_address_and_in_all_and_free_on_drop() {
        let l = ConnLimits::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = l.admit(a).unwrap();
        let _a2 = l.admit(a).unwrap();
        let e = l.admit(a).unwrap_err();
        assert_eq!(e.status(), 429, "{e}");
        let _b1 = l.admit(b).unwrap();
        let e = l.admit(b).unwrap_err();
        assert_eq!(e.status(), 503, "{e}");
        assert_eq!(l.open(), 3);
        drop(a1);
        assert_eq!(l.open(), 2);
        assert!(l.admit(a).is_ok());
    }

    /// Heavy sources fill the unreserved places; a light source (a probe) still gets one.
    #[test]
    fn the_last_places_are_kept_for_light_sources() {
        let l = ConnLimits::new(64, 64);
        let heavy: Vec<IpAddr> = (1..=3)
            .map(|i| format!("10.0.1.{i}").parse().unwrap())
            .collect();
        let mut held = Vec::new();
        for ip in heavy.iter().cycle().take(200) {
            if let Ok(g) = l.admit(*ip) {
                held.push(g);
            }
        }
        // 64 places, 8 reserved: the heavy three hold 56 (and light ones took none).
        assert_eq!(l.open(), 56);
        assert_eq!(l.admit(heavy[0]).unwrap_err().status(), 503);
        let probe: IpAddr = "10.0.2.1".parse().unwrap();
        let probes: Vec<_> = (0..LIGHT_SOURCE).map(|_| l.admit(probe).unwrap()).collect();
        assert_eq!(l.open(), 56 + LIGHT_SOURCE);
        assert_eq!(l.admit(probe).unwrap_err().status(), 503, "no longer light");
        drop(probes);
        drop(held);
        assert_eq!(l.open(), 0);
    }
}
