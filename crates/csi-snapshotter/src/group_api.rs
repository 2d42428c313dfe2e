//! Whether the cluster serves, and lets us list, the groupsnapshot.storage.k8s.io kinds a
//! controller watches: a list of one of each. Without them (no CRDs, or RBAC without the group
//! rules) the controller runs without groups and says so, where a watch would wait forever for
//! its caches (upstream's v8.6 controller exits; its next release warns and runs on, as here).

use std::fmt::Debug;

use kube::Client;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

use csi_kinds::groupsnapshot::{
    VolumeGroupSnapshot, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
};

async fn list_one<K>(client: &Client) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    Api::<K>::all(client.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map(|_| ())
}

/// The group contents and classes, and with `groups` the VolumeGroupSnapshots too.
pub(crate) async fn served(client: &Client, groups: bool) -> bool {
    let listed = async {
        if groups {
            list_one::<VolumeGroupSnapshot>(client).await?;
        }
        list_one::<VolumeGroupSnapshotContent>(client).await?;
        list_one::<VolumeGroupSnapshotClass>(client).await
    };
    match listed.await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "the groupsnapshot.storage.k8s.io/v1 API is not served to us: running without volume group snapshots");
            false
        }
    }
}
