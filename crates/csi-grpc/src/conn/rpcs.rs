//! One typed method per unary RPC (CSI's, podmon's and COSI's), each going through `CsiConnection::unary`, so no call can
//! skip the timeout, the metrics or the redacted logging.

use std::time::Duration;

use csi_proto::cosi::v1alpha1 as cosi_v1alpha1;
use csi_proto::csi::v1 as csi;
use csi_proto::podmon::v1 as podmon_v1;
use tonic::Status;

use super::CsiConnection;
use cosi_v1alpha1::identity_client::IdentityClient as CosiIdentityClient;
use cosi_v1alpha1::provisioner_client::ProvisionerClient as CosiProvisionerClient;
use csi::controller_client::ControllerClient;
use csi::group_controller_client::GroupControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use podmon_v1::podmon_client::PodmonClient;

macro_rules! unary_rpcs {
    ($( $client:ident $service:literal { $( $method:ident $name:literal ($request:ty) -> $response:ty; )* } )*) => {
        impl CsiConnection {
            $( $(
                #[doc = concat!("`", $service, "/", $name, "` with the given timeout.")]
                pub async fn $method(&self, request: $request, timeout: Duration) -> Result<$response, Status> {
                    self.unary(concat!("/", $service, "/", $name), request, timeout, |channel, request| async move {
                        $client::new(channel).$method(request).await
                    })
                    .await
                }
            )* )*
        }
    };
}

unary_rpcs! {
    IdentityClient "csi.v1.Identity" {
        get_plugin_info "GetPluginInfo" (csi::GetPluginInfoRequest) -> csi::GetPluginInfoResponse;
        get_plugin_capabilities "GetPluginCapabilities" (csi::GetPluginCapabilitiesRequest) -> csi::GetPluginCapabilitiesResponse;
        probe "Probe" (csi::ProbeRequest) -> csi::ProbeResponse;
    }
    ControllerClient "csi.v1.Controller" {
        create_volume "CreateVolume" (csi::CreateVolumeRequest) -> csi::CreateVolumeResponse;
        delete_volume "DeleteVolume" (csi::DeleteVolumeRequest) -> csi::DeleteVolumeResponse;
        controller_publish_volume "ControllerPublishVolume" (csi::ControllerPublishVolumeRequest) -> csi::ControllerPublishVolumeResponse;
        controller_unpublish_volume "ControllerUnpublishVolume" (csi::ControllerUnpublishVolumeRequest) -> csi::ControllerUnpublishVolumeResponse;
        validate_volume_capabilities "ValidateVolumeCapabilities" (csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse;
        list_volumes "ListVolumes" (csi::ListVolumesRequest) -> csi::ListVolumesResponse;
        controller_list_volume_health "ControllerListVolumeHealth" (csi::ControllerListVolumeHealthRequest) -> csi::ControllerListVolumeHealthResponse;
        controller_get_volume_health "ControllerGetVolumeHealth" (csi::ControllerGetVolumeHealthRequest) -> csi::ControllerGetVolumeHealthResponse;
        get_capacity "GetCapacity" (csi::GetCapacityRequest) -> csi::GetCapacityResponse;
        controller_get_capabilities "ControllerGetCapabilities" (csi::ControllerGetCapabilitiesRequest) -> csi::ControllerGetCapabilitiesResponse;
        create_snapshot "CreateSnapshot" (csi::CreateSnapshotRequest) -> csi::CreateSnapshotResponse;
        delete_snapshot "DeleteSnapshot" (csi::DeleteSnapshotRequest) -> csi::DeleteSnapshotResponse;
        list_snapshots "ListSnapshots" (csi::ListSnapshotsRequest) -> csi::ListSnapshotsResponse;
        get_snapshot "GetSnapshot" (csi::GetSnapshotRequest) -> csi::GetSnapshotResponse;
        controller_expand_volume "ControllerExpandVolume" (csi::ControllerExpandVolumeRequest) -> csi::ControllerExpandVolumeResponse;
        controller_get_volume "ControllerGetVolume" (csi::ControllerGetVolumeRequest) -> csi::ControllerGetVolumeResponse;
        controller_modify_volume "ControllerModifyVolume" (csi::ControllerModifyVolumeRequest) -> csi::ControllerModifyVolumeResponse;
    }
    GroupControllerClient "csi.v1.GroupController" {
        group_controller_get_capabilities "GroupControllerGetCapabilities" (csi::GroupControllerGetCapabilitiesRequest) -> csi::GroupControllerGetCapabilitiesResponse;
        create_volume_group_snapshot "CreateVolumeGroupSnapshot" (csi::CreateVolumeGroupSnapshotRequest) -> csi::CreateVolumeGroupSnapshotResponse;
        delete_volume_group_snapshot "DeleteVolumeGroupSnapshot" (csi::DeleteVolumeGroupSnapshotRequest) -> csi::DeleteVolumeGroupSnapshotResponse;
        get_volume_group_snapshot "GetVolumeGroupSnapshot" (csi::GetVolumeGroupSnapshotRequest) -> csi::GetVolumeGroupSnapshotResponse;
    }
    NodeClient "csi.v1.Node" {
        node_stage_volume "NodeStageVolume" (csi::NodeStageVolumeRequest) -> csi::NodeStageVolumeResponse;
        node_unstage_volume "NodeUnstageVolume" (csi::NodeUnstageVolumeRequest) -> csi::NodeUnstageVolumeResponse;
        node_publish_volume "NodePublishVolume" (csi::NodePublishVolumeRequest) -> csi::NodePublishVolumeResponse;
        node_unpublish_volume "NodeUnpublishVolume" (csi::NodeUnpublishVolumeRequest) -> csi::NodeUnpublishVolumeResponse;
        node_get_volume_stats "NodeGetVolumeStats" (csi::NodeGetVolumeStatsRequest) -> csi::NodeGetVolumeStatsResponse;
        node_get_volume_health "NodeGetVolumeHealth" (csi::NodeGetVolumeHealthRequest) -> csi::NodeGetVolumeHealthResponse;
        node_get_storage_health "NodeGetStorageHealth" (csi::NodeGetStorageHealthRequest) -> csi::NodeGetStorageHealthResponse;
        node_expand_volume "NodeExpandVolume" (csi::NodeExpandVolumeRequest) -> csi::NodeExpandVolumeResponse;
        node_get_capabilities "NodeGetCapabilities" (csi::NodeGetCapabilitiesRequest) -> csi::NodeGetCapabilitiesResponse;
        node_get_info "NodeGetInfo" (csi::NodeGetInfoRequest) -> csi::NodeGetInfoResponse;
    }
    PodmonClient "podmon.v1.Podmon" {
        validate_volume_host_connectivity "ValidateVolumeHostConnectivity" (podmon_v1::ValidateVolumeHostConnectivityRequest) -> podmon_v1::ValidateVolumeHostConnectivityResponse;
    }
    CosiIdentityClient "cosi.v1alpha1.Identity" {
        driver_get_info "DriverGetInfo" (cosi_v1alpha1::DriverGetInfoRequest) -> cosi_v1alpha1::DriverGetInfoResponse;
    }
    CosiProvisionerClient "cosi.v1alpha1.Provisioner" {
        driver_create_bucket "DriverCreateBucket" (cosi_v1alpha1::DriverCreateBucketRequest) -> cosi_v1alpha1::DriverCreateBucketResponse;
        driver_delete_bucket "DriverDeleteBucket" (cosi_v1alpha1::DriverDeleteBucketRequest) -> cosi_v1alpha1::DriverDeleteBucketResponse;
        driver_grant_bucket_access "DriverGrantBucketAccess" (cosi_v1alpha1::DriverGrantBucketAccessRequest) -> cosi_v1alpha1::DriverGrantBucketAccessResponse;
        driver_revoke_bucket_access "DriverRevokeBucketAccess" (cosi_v1alpha1::DriverRevokeBucketAccessRequest) -> cosi_v1alpha1::DriverRevokeBucketAccessResponse;
    }
}
