//! Fetching a StorageClass-referenced Secret's data (upstream `getCredentials`): one Secret GET
//! over the references and data types of `csi_kinds::secrets`.

use csi_kinds::secrets::{SecretData, SecretRef, SecretsError};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::api_errors::GoApiError;

/// GETs the referenced Secret and converts its data (upstream `getCredentials`). The caller
/// decides what a failure means: retry when provisioning, go on without secrets when deleting.
pub async fn fetch_secret_data(
    client: Client,
    secret: &SecretRef,
) -> Result<SecretData, FetchError> {
    let object = Api::<Secret>::namespaced(client, &secret.namespace)
        .get(&secret.name)
        .await
        .map_err(|source| FetchError::Get {
            secret: secret.clone(),
            source,
        })?;
    SecretData::from_secret(&object).map_err(|source| FetchError::Data {
        secret: secret.clone(),
        source,
    })
}

/// Why a Secret could not be turned into CSI secrets.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Upstream's message.
    #[error("error getting secret {} in namespace {}: {}", secret.name, secret.namespace, GoApiError(source))]
    Get {
        secret: SecretRef,
        source: kube::Error,
    },
    #[error("secret {} in namespace {}: {source}", secret.name, secret.namespace)]
    Data {
        secret: SecretRef,
        source: SecretsError,
    },
}

impl FetchError {
    /// What went wrong, without naming the Secret: the API's refusal as client-go prints it
    /// (`secrets "s" not found`), or why its data cannot be used.
    pub fn cause(&self) -> String {
        match self {
            Self::Get { source, .. } => GoApiError(source).to_string(),
            Self::Data { source, .. } => source.to_string(),
        }
    }
}
