//! Calls to drivers of the VolumeCondition generation (CSI v1.0-v1.12), whose conditions ride
//! in fields CSI v1.13 removed. The method paths are the same in both generations, so these
//! calls use tonic's generic unary call with the v1.12 messages instead of a generated
//! client; they share [`CsiConnection::unary`]'s timeout, metrics and redacted logging.

use std::time::Duration;

use csi_proto::csi::v1_12;
use tonic::Status;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

use super::{CsiChannel, CsiConnection};

/// A message as the other generation's type (v1.12 from v1.13 or back): v1.13 only removed
/// fields and reserved their numbers, so every remaining field has the same bytes on the
/// wire; what the target type lacks is dropped.
pub fn rewire<A: prost::Message, B: prost::Message + Default>(
    message: &A,
) -> Result<B, prost::DecodeError> {
    B::decode(&*message.encode_to_vec())
}

/// One unary call on `path` with v1.12 messages.
async fn call<Req, Resp>(
    channel: CsiChannel,
    path: &'static str,
    request: tonic::Request<Req>,
) -> Result<tonic::Response<Resp>, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("CSI connection not ready: {e}")))?;
    grpc.unary(
        request,
        PathAndQuery::from_static(path),
        ProstCodec::<Req, Resp>::default(),
    )
    .await
}

macro_rules! legacy_rpcs {
    ($( $method:ident $path:literal ($request:ty) -> $response:ty; )*) => {
        impl CsiConnection {
            $(
                #[doc = concat!("`", $path, "` as a CSI v1.12 client calls it: the response keeps `volume_condition`.")]
                pub async fn $method(&self, request: $request, timeout: Duration) -> Result<$response, Status> {
                    self.unary($path, request, timeout, |channel, request| call(channel, $path, request)).await
                }
            )*
        }
    };
}

legacy_rpcs! {
    legacy_list_volumes "/csi.v1.Controller/ListVolumes" (v1_12::ListVolumesRequest) -> v1_12::ListVolumesResponse;
    legacy_controller_get_volume "/csi.v1.Controller/ControllerGetVolume" (v1_12::ControllerGetVolumeRequest) -> v1_12::ControllerGetVolumeResponse;
    legacy_node_get_volume_stats "/csi.v1.Node/NodeGetVolumeStats" (v1_12::NodeGetVolumeStatsRequest) -> v1_12::NodeGetVolumeStatsResponse;
}
