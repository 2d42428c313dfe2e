//! The Kubernetes client every sidecar uses: from `--kubeconfig` (or `KUBECONFIG`, a
//! colon-separated list like kubectl's) or the in-cluster service account; a client-side token
//! bucket only when `--kube-api-qps`/`--kube-api-burst` are given; and 429/503/504 retried with
//! backoff that honours `Retry-After` (kube's server-aware retry policy). Over TLS, HTTP/2 is
//! negotiated as client-go does: every request and watch of a client shares one connection,
//! where HTTP/1.1 holds one connection (and its buffers) per request in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ::kube::config::{KubeConfigOptions, Kubeconfig};
use ::kube::{Client, Config};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::flags::KubeArgs;

/// client-go's defaults, used for whichever of qps/burst was not given when the other was.
pub const DEFAULT_QPS: f32 = 5.0;
pub const DEFAULT_BURST: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("cannot load kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: ::kube::config::KubeconfigError,
    },
    #[error(
        "no --kubeconfig or KUBECONFIG given and not running in a cluster (in-cluster configuration failed: {0})"
    )]
    InCluster(#[source] ::kube::config::InClusterError),
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] ::kube::Error),
    #[error("--master {0:?} is not a valid URL")]
    Master(String),
}

/// A client-side rate limit (client-go `flowcontrol.NewTokenBucketRateLimiter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f32,
    pub burst: u32,
}

impl RateLimit {
    /// The limit the flags ask for: none unless one of them was given. As in client-go, a zero
    /// value means the default and a negative QPS disables the limit.
    pub fn from_flags(qps: Option<f32>, burst: Option<u32>) -> Option<Self> {
        if qps.is_none() && burst.is_none() {
            return None;
        }
        let qps = match qps.unwrap_or(DEFAULT_QPS) {
            0.0 => DEFAULT_QPS,
            q if q < 0.0 => return None,
            q => q,
        };
        let burst = match burst.unwrap_or(DEFAULT_BURST) {
            0 => DEFAULT_BURST,
            b => b,
        };
        Some(Self { qps, burst })
    }
}

/// Loads the client configuration the flags select.
pub async fn config(args: &KubeArgs) -> Result<Config, KubeClientError> {
    if args.kubeconfig.is_empty() {
        return Config::incluster().map_err(KubeClientError::InCluster);
    }
    let load_error = |source| KubeClientError::Kubeconfig {
        path: args.kubeconfig.clone(),
        source,
    };
    let mut merged: Option<Kubeconfig> = None;
    for path in args.kubeconfig.split(':').filter(|p| !p.is_empty()) {
        let next = Kubeconfig::read_from(path).map_err(load_error)?;
        merged = Some(match merged {
            None => next,
            Some(first) => first.merge(next).map_err(load_error)?,
        });
    }
    let kubeconfig = merged.unwrap_or_default();
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(load_error)
}

/// [`config`], with the server address of upstream's deprecated `--master` flag instead of the
/// kubeconfig's when it is not empty.
pub async fn config_with_master(args: &KubeArgs, master: &str) -> Result<Config, KubeClientError> {
    let mut config = config(args).await?;
    if !master.is_empty() {
        config.cluster_url = master
            .parse()
            .map_err(|_| KubeClientError::Master(master.to_string()))?;
    }
    Ok(config)
}

/// Builds the client the flags select.
pub async fn client(args: &KubeArgs) -> Result<Client, KubeClientError> {
    client_with_master(args, "").await
}

/// [`client`], with upstream's deprecated `--master` ([`config_with_master`]).
pub async fn client_with_master(args: &KubeArgs, master: &str) -> Result<Client, KubeClientError> {
    let config = config_with_master(args, master).await?;
    client_from_config(
        config,
        RateLimit::from_flags(args.kube_api_qps, args.kube_api_burst),
    )
}

/// Builds a client from a loaded configuration, with an optional client-side limit.
pub fn client_from_config(
    mut config: Config,
    rate_limit: Option<RateLimit>,
) -> Result<Client, KubeClientError> {
    // Always on: 429 (API Priority and Fairness) and 503/504 are retried with exponential
    // backoff, waiting at least the server's Retry-After.
    config.default_retry = true;
    if !config
        .headers
        .iter()
        .any(|(name, _)| name == http::header::USER_AGENT)
        && let Ok(value) = http::HeaderValue::from_str(&user_agent())
    {
        config.headers.push((http::header::USER_AGENT, value));
    }
    let rate_limit = TokenBucketLayer::new(rate_limit);
    if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTPS) && config.proxy_url.is_none()
    {
        return http2_client(config, rate_limit);
    }
    let builder =
        ::kube::client::ClientBuilder::try_from(config).map_err(KubeClientError::Build)?;
    Ok(builder.with_layer(&rate_limit).build())
}

/// kube's stack (base URI, server retry, authentication, extra headers) over a connection
/// pool that offers HTTP/2 by ALPN (and keeps HTTP/1.1 for a server without it). kube's own
/// builder offers HTTP/1.1 only. HTTP/2 pings every 30 s find a dead connection, as
/// client-go's health check does, where HTTP/1.1 relied on per-request read timeouts.
fn http2_client(config: Config, rate_limit: TokenBucketLayer) -> Result<Client, KubeClientError> {
    use ::kube::client::ConfigExt;
    use ::kube::client::retry::RetryPolicy;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};

    let tls = config
        .rustls_client_config()
        .map_err(KubeClientError::Build)?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    // A request with a body goes out as a HEADERS and a DATA frame in two writes: with Nagle's
    // algorithm the second waits for the server's delayed ACK, about 40 ms on Linux, on every
    // create, update and patch. Go's net package sets TCP_NODELAY on every connection.
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(tcp);
    let pool = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
        .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(rate_limit)
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(KubeClientError::Build)?)
        .layer(
            config
                .extra_headers_layer()
                .map_err(KubeClientError::Build)?,
        )
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(Client::new(service, config.default_namespace))
}

/// client-go's HTTP/2 health check: a ping this often while requests or watches are open...
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// ...and the connection closed when its answer takes longer than this.
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// `<program>/<version> (<os>/<arch>)`, as client-go's default user agent names the binary:
/// API server audit logs and request metrics then say which sidecar sent a request.
pub fn user_agent() -> String {
    let program = std::env::args_os()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "csi-sidecar".to_string());
    format!(
        "{program}/v{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Token bucket state, golang.org/x/time/rate semantics (what client-go uses): the bucket
/// starts full; every request takes a token, waiting for it when the bucket is empty.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Self {
            per_second: f64::from(limit.qps),
            capacity: f64::from(limit.burst.max(1)),
            tokens: f64::from(limit.burst.max(1)),
            updated: now,
        }
    }

    /// Takes one token and returns how long the caller must wait before using it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.updated = now.max(self.updated);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// Tower layer applying a [`TokenBucket`] to every API request (pass-through when `None`).
#[derive(Debug, Clone)]
pub struct TokenBucketLayer {
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

impl TokenBucketLayer {
    pub fn new(limit: Option<RateLimit>) -> Self {
        Self {
            bucket: limit
                .map(|limit| Arc::new(Mutex::new(TokenBucket::new(limit, Instant::now())))),
        }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucketService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucketService {
            inner,
            bucket: self.bucket.clone(),
            waiting: None,
            permitted: false,
        }
    }
}

/// See [`TokenBucketLayer`]. The wait happens in `poll_ready`, so the inner service need not
/// be `Clone` and queued requests keep their order.
pub struct TokenBucketService<S> {
    inner: S,
    bucket: Option<Arc<Mutex<TokenBucket>>>,
    waiting: Option<Pin<Box<Sleep>>>,
    permitted: bool,
}

impl<S> std::fmt::Debug for TokenBucketService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBucketService")
            .field("limited", &self.bucket.is_some())
            .field("permitted", &self.permitted)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for TokenBucketService<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let Some(bucket) = &self.bucket else {
            return self.inner.poll_ready(cx);
        };
        loop {
            if self.permitted {
                return self.inner.poll_ready(cx);
            }
            if let Some(sleep) = self.waiting.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.waiting = None;
                self.permitted = true;
                continue;
            }
            let now = Instant::now();
            let wait = bucket
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .reserve(now);
            if wait.is_zero() {
                self.permitted = true;
            } else {
                self.waiting = Some(Box::pin(tokio::time::sleep_until(now + wait)));
            }
        }
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.permitted = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn limit_only_when_asked() {
        let table = [
            ((None, None), None),
            (
                (Some(20.0), None),
                Some(RateLimit {
                    qps: 20.0,
                    burst: 10,
                }),
            ),
            (
                (None, Some(50)),
                Some(RateLimit {
                    qps: 5.0,
                    burst: 50,
                }),
            ),
            (
                (Some(0.0), Some(0)),
                Some(RateLimit {
                    qps: 5.0,
                    burst: 10,
                }),
            ),
            ((Some(-1.0), Some(100)), None),
        ];
        for ((qps, burst), want) in table {
            assert_eq!(RateLimit::from_flags(qps, burst), want, "{qps:?}/{burst:?}");
        }
    }

    #[test]
    fn bucket_allows_burst_then_paces_at_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit { qps: 2.0, burst: 3 }, start);
        let waits: Vec<u128> = (0..6).map(|_| bucket.reserve(start).as_millis()).collect();
        assert_eq!(waits, [0, 0, 0, 500, 1000, 1500]);
        // After the queue drains and time passes, tokens refill up to the burst only.
        let later = start + Duration::from_secs(60);
        let waits: Vec<u128> = (0..4).map(|_| bucket.reserve(later).as_millis()).collect();
        assert_eq!(waits, [0, 0, 0, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn service_waits_for_tokens_in_order() {
        let start = Instant::now();
        let layer = TokenBucketLayer::new(Some(RateLimit { qps: 1.0, burst: 2 }));
        let mut service = layer.layer(tower::service_fn(|_: ()| async move {
            Ok::<_, std::convert::Infallible>(Instant::now())
        }));
        let mut seen = Vec::new();
        for _ in 0..5 {
            let at = service.ready().await.unwrap().call(()).await.unwrap();
            seen.push((at - start).as_secs());
        }
        assert_eq!(seen, [0, 0, 1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_means_no_wait() {
        let start = Instant::now();
        let mut service =
            TokenBucketLayer::new(None).layer(tower::service_fn(|_: ()| async move {
                Ok::<_, std::convert::Infallible>(Instant::now())
            }));
        for _ in 0..100 {
            let at = service.ready().await.unwrap().call(()).await.unwrap();
            assert_eq!(at, start);
        }
    }
}
