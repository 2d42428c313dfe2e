//! Serving the VolumeCondition generation (CSI v1.0-v1.12, `--volume-health=v1.12|both`).
//!
//! v1.13 removed `volume_condition` from ListVolumes, ControllerGetVolume and
//! NodeGetVolumeStats, so the generated v1.13 servers cannot send it. [`LegacyHealth`] wraps a
//! generated Controller or Node server and answers those three methods itself with the
//! published v1.12 messages; every other method goes to the wrapped server. The answers are
//! the v1.13 ones (same wire format: v1.13 only reserved the removed numbers) plus the
//! condition folded from the same health checks the v1.13 health RPCs report.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use csi_proto::csi::v1_12;
use prost::Message;
use tonic::body::Body;
use tonic::codegen::{Body as HttpBody, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic_prost::ProstCodec;

use crate::driver::{Driver, ready_volume};
use crate::error::DriverError;
use crate::health::{NodePaths, legacy_condition};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A generated CSI server with the three VolumeCondition methods answered in v1.12 form.
#[derive(Debug, Clone)]
pub struct LegacyHealth<S> {
    inner: S,
    driver: Arc<Driver>,
}

impl<S> LegacyHealth<S> {
    pub fn new(inner: S, driver: Arc<Driver>) -> Self {
        Self { inner, driver }
    }
}

impl<S: NamedService> NamedService for LegacyHealth<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<B>> for LegacyHealth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let driver = self.driver.clone();
        match request.uri().path() {
            "/csi.v1.Controller/ListVolumes" => serve(driver, list_volumes, request),
            "/csi.v1.Controller/ControllerGetVolume" => serve(driver, get_volume, request),
            "/csi.v1.Node/NodeGetVolumeStats" => serve(driver, volume_stats, request),
            _ => Box::pin(self.inner.call(request)),
        }
    }
}

/// Answers one unary call with `answer` on the blocking pool, in v1.12 messages.
fn serve<Req, Resp, B>(
    driver: Arc<Driver>,
    answer: fn(&Driver, Req) -> Result<Resp, DriverError>,
    request: http::Request<B>,
) -> BoxFuture<Result<http::Response<Body>, Infallible>>
where
    Req: Message + Default + Send + 'static,
    Resp: Message + Send + 'static,
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    Box::pin(async move {
        let mut grpc = Grpc::new(ProstCodec::<Resp, Req>::default());
        Ok(grpc.unary(Rpc { driver, answer }, request).await)
    })
}

struct Rpc<Req, Resp> {
    driver: Arc<Driver>,
    answer: fn(&Driver, Req) -> Result<Resp, DriverError>,
}

impl<Req, Resp> UnaryService<Req> for Rpc<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Result<tonic::Response<Resp>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let (driver, answer) = (self.driver.clone(), self.answer);
        Box::pin(async move {
            let request = request.into_inner();
            driver.blocking(move |driver| answer(driver, request)).await
        })
    }
}

/// [`csi_grpc::conn::rewire`], its (impossible unless the protos disagree) failure INTERNAL.
fn rewire<A: Message, B: Message + Default>(message: &A) -> Result<B, DriverError> {
    csi_grpc::conn::rewire(message).map_err(|error| DriverError::Io {
        context: "re-reading a message in the other CSI generation".into(),
        source: std::io::Error::other(error),
    })
}

fn list_volumes(
    driver: &Driver,
    request: v1_12::ListVolumesRequest,
) -> Result<v1_12::ListVolumesResponse, DriverError> {
    let mut response: v1_12::ListVolumesResponse =
        rewire(&driver.list_volumes(&rewire(&request)?)?)?;
    let state = driver.store.read()?;
    for entry in &mut response.entries {
        let id = entry.volume.as_ref().map(|v| v.volume_id.as_str());
        // A volume deleted since the page was read has no condition to report.
        if let (Some(status), Some(Ok(volume))) =
            (entry.status.as_mut(), id.map(|id| ready_volume(&state, id)))
        {
            status.volume_condition = Some(legacy_condition(&driver.volume_health(volume)));
        }
    }
    Ok(response)
}

fn get_volume(
    driver: &Driver,
    request: v1_12::ControllerGetVolumeRequest,
) -> Result<v1_12::ControllerGetVolumeResponse, DriverError> {
    let mut response: v1_12::ControllerGetVolumeResponse =
        rewire(&driver.get_volume(&rewire(&request)?)?)?;
    let state = driver.store.read()?;
    if let (Some(status), Ok(volume)) = (
        response.status.as_mut(),
        ready_volume(&state, &request.volume_id),
    ) {
        status.volume_condition = Some(legacy_condition(&driver.volume_health(volume)));
    }
    Ok(response)
}

fn volume_stats(
    driver: &Driver,
    request: v1_12::NodeGetVolumeStatsRequest,
) -> Result<v1_12::NodeGetVolumeStatsResponse, DriverError> {
    let mut response: v1_12::NodeGetVolumeStatsResponse =
        rewire(&driver.stats(&rewire(&request)?)?)?;
    let paths = NodePaths {
        publish: Some(request.volume_path.as_str()),
        staging: Some(request.staging_target_path.as_str()).filter(|p| !p.is_empty()),
    };
    let health = driver.node_volume_health_of(&request.volume_id, paths)?;
    response.volume_condition = Some(legacy_condition(&health.health_statuses));
    Ok(response)
}
