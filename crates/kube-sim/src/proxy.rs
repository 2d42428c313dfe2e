//! kube-sim's fault injection in front of any API server: a plain-HTTP proxy on 127.0.0.1 that
//! forwards each request to the upstream server through a `kube::Client` (which brings the
//! upstream's TLS and credentials), streams the answer back (watches included), and answers
//! instead with the [`Faults`] a test set: a status with `Retry-After` on chosen methods and
//! resources, a delay before every request, the end of every open watch, 410 Gone to the
//! watches that resume after it. A component under
//! test is pointed at the proxy (its config from [`FaultProxy::config`]), while the rest of the
//! cluster talks to the real server, so a fault reaches the component alone, as a fault on
//! kube-sim reaches every client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::errors::ApiError;
use crate::faults::{Faults, RequestCounter, RequestCounts, ResourcePath};

/// The largest request body forwarded (kube-apiserver's own limit is 3 MiB).
const MAX_BODY: usize = 16 << 20;

struct Proxy {
    upstream: kube::Client,
    faults: Faults,
    requests: RequestCounter,
}

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: Faults,
    requests: RequestCounter,
    shutdown: CancellationToken,
}

impl FaultProxy {
    /// Starts a proxy to the API server of `upstream` on a free port of 127.0.0.1.
    pub async fn start(upstream: kube::Client) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let faults = Faults::default();
        let requests = RequestCounter::default();
        let proxy = Arc::new(Proxy {
            upstream,
            faults: faults.clone(),
            requests: requests.clone(),
        });
        let app = axum::Router::new().fallback(forward).with_state(proxy);
        let shutdown = crate::apiserver::serve(listener, app, "fault proxy");
        Ok(Self {
            addr,
            faults,
            requests,
            shutdown,
        })
    }

    /// The faults the proxy injects.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// The requests that reached the proxy, injected failures included.
    pub fn request_counts(&self) -> RequestCounts {
        self.requests.counts()
    }

    /// A client configuration for the proxy (plain HTTP; the proxy authenticates upstream).
    pub fn config(&self) -> kube::Config {
        let uri: http::Uri = format!("http://{}", self.addr)
            .parse()
            .expect("a socket address is a valid authority");
        kube::Config::new(uri)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let latency = proxy.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let (mut parts, body) = request.into_parts();
    let query: HashMap<String, String> =
        serde_urlencoded::from_str(parts.uri.query().unwrap_or_default()).unwrap_or_default();
    let watch = crate::apiserver::is_watch(&query);
    // Taken now: a cut made while the watch opens ends it too.
    let cut = proxy.faults.watches();
    if let Some(resource) = ResourcePath::parse(parts.uri.path()) {
        proxy.requests.count(
            &parts.method,
            (
                &resource.group,
                &resource.plural,
                resource.subresource.as_deref(),
            ),
            resource.name.is_some(),
            &parts.headers,
            &query,
        );
        if let Some(response) = proxy.faults.injected(&parts.method, &resource.plural) {
            return response;
        }
        if let Some(response) = proxy.faults.expired_resume(&query) {
            return response;
        }
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(error) => {
            return ApiError::bad_request(format!("reading the request body: {error}"))
                .into_response();
        }
    };
    // The upstream connection has its own host, framing and credentials.
    remove_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::AUTHORIZATION);
    let upstream = http::Request::from_parts(parts, kube::client::Body::from(body.to_vec()));
    match proxy.upstream.send(upstream).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            remove_hop_by_hop(&mut parts.headers);
            let body = Body::new(body);
            if !watch {
                return Response::from_parts(parts, body);
            }
            let events = body
                .into_data_stream()
                .take_until(async move { cut.cancelled().await });
            Response::from_parts(parts, Body::from_stream(events))
        }
        Err(error) => ApiError::with_reason(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            format!("the fault proxy could not reach the API server: {error}"),
        )
        .into_response(),
    }
}

/// Headers of one connection, not of the message (RFC 9110 section 7.6.1).
fn remove_hop_by_hop(headers: &mut http::HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}
