//! `grpc.health.v1.Health` on the gRPC port, as upstream registers grpc-go's health server: the
//! server as a whole (service `""`) is NOT_SERVING until the driver is validated and again from
//! shutdown on, SERVING in between; any other service is unknown. `/health` reads the same
//! readiness.

use std::pin::Pin;

use csi_proto::grpc::health::v1::health_check_response::ServingStatus;
use csi_proto::grpc::health::v1::health_server::Health;
use csi_proto::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
use futures::StreamExt;
use futures::stream::{self, Stream};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The health service over the sidecar's readiness.
#[derive(Debug, Clone)]
pub struct HealthService {
    ready: watch::Receiver<bool>,
}

impl HealthService {
    pub fn new(ready: watch::Receiver<bool>) -> Self {
        Self { ready }
    }
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

fn serving(ready: bool) -> ServingStatus {
    if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    type WatchStream = Statuses;

    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        if request.into_inner().service.is_empty() {
            Ok(Response::new(response(serving(*self.ready.borrow()))))
        } else {
            // grpc-go's answer for a service it has no status of.
            Err(Status::not_found("unknown service"))
        }
    }

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let statuses: Statuses = if request.into_inner().service.is_empty() {
            // The current status first, then each change; the stream ends with the sender.
            let mut ready = self.ready.clone();
            ready.mark_changed();
            Box::pin(stream::unfold(ready, |mut ready| async move {
                ready.changed().await.ok()?;
                let status = serving(*ready.borrow_and_update());
                Some((Ok(response(status)), ready))
            }))
        } else {
            // Unknown now, and stays so: the stream stays open as grpc-go's does.
            Box::pin(
                stream::once(async { Ok(response(ServingStatus::ServiceUnknown)) })
                    .chain(stream::pending()),
            )
        };
        Ok(Response::new(statuses))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_server_status_follows_readiness() {
        let (ready, receiver) = watch::channel(false);
        let health = HealthService::new(receiver);
        let check = |service: &str| {
            let health = health.clone();
            let request = Request::new(HealthCheckRequest {
                service: service.to_owned(),
            });
            async move { health.check(request).await.map(|r| r.into_inner().status) }
        };
        assert_eq!(check("").await.unwrap(), ServingStatus::NotServing as i32);
        let mut watched = health
            .watch(Request::new(HealthCheckRequest::default()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            watched.next().await.unwrap().unwrap().status,
            ServingStatus::NotServing as i32
        );
        ready.send_replace(true);
        assert_eq!(check("").await.unwrap(), ServingStatus::Serving as i32);
        assert_eq!(
            watched.next().await.unwrap().unwrap().status,
            ServingStatus::Serving as i32
        );
        let unknown = check("snapshotmetadata.SnapshotMetadata")
            .await
            .unwrap_err();
        assert_eq!(
            (unknown.code(), unknown.message()),
            (tonic::Code::NotFound, "unknown service")
        );
        let mut other = health
            .watch(Request::new(HealthCheckRequest {
                service: "other".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            other.next().await.unwrap().unwrap().status,
            ServingStatus::ServiceUnknown as i32
        );
    }
}
