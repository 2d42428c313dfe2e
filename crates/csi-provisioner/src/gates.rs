//! external-provisioner's `--feature-gates` table: every gate v6.3.0 accepts, with the default,
//! stage and lock in effect at its component-base version (1.36). Its own four gates
//! (`pkg/features/features.go`) come first; then the generic gates that linking
//! `k8s.io/apiserver/pkg/server` v0.36.1 registers in the same gate set
//! (`k8s.io/apiserver/pkg/features` and `k8s.io/component-base/zpages/features`): upstream
//! accepts them and they change nothing there, nor here. `AllAlpha` and `AllBeta` are
//! component-base's own ([`csi_sidecar::feature_gates::resolve_gates`]).

use csi_sidecar::feature_gates::{FeatureGate, Stage};
pub use csi_sidecar::leader::RELEASE_ON_EXIT_GATE;

/// GA, default on, not locked: off, the provisioner ignores the driver's topology support
/// (upstream's `SupportsTopology`).
pub const TOPOLOGY: FeatureGate = FeatureGate::new("Topology", true, Stage::Ga, false);
pub const CROSS_NAMESPACE_VOLUME_DATA_SOURCE: FeatureGate =
    FeatureGate::new("CrossNamespaceVolumeDataSource", false, Stage::Alpha, false);
pub const VOLUME_ATTRIBUTES_CLASS: FeatureGate =
    FeatureGate::new("VolumeAttributesClass", true, Stage::Ga, false);

/// Every gate upstream accepts.
pub const TABLE: &[FeatureGate] = &[
    TOPOLOGY,
    CROSS_NAMESPACE_VOLUME_DATA_SOURCE,
    VOLUME_ATTRIBUTES_CLASS,
    RELEASE_ON_EXIT_GATE,
    // k8s.io/apiserver/pkg/features v0.36.1, at emulation version 1.36.
    FeatureGate::new("APIResponseCompression", true, Stage::Beta, false),
    FeatureGate::new("APIServerIdentity", true, Stage::Beta, false),
    FeatureGate::new("APIServerTracing", true, Stage::Ga, true),
    FeatureGate::new("APIServingWithRoutine", false, Stage::Alpha, false),
    FeatureGate::new(
        "AggregatedDiscoveryRemoveBetaType",
        true,
        Stage::Deprecated,
        true,
    ),
    FeatureGate::new("AllowParsingUserUIDFromCertAuth", true, Stage::Beta, false),
    FeatureGate::new(
        "AllowUnsafeMalformedObjectDeletion",
        false,
        Stage::Alpha,
        false,
    ),
    FeatureGate::new("AnonymousAuthConfigurableEndpoints", true, Stage::Ga, true),
    FeatureGate::new("AuthorizeWithSelectors", true, Stage::Ga, true),
    FeatureGate::new("BtreeWatchCache", true, Stage::Ga, true),
    FeatureGate::new("CBORServingAndStorage", false, Stage::Alpha, false),
    FeatureGate::new("ConcurrentWatchObjectDecode", false, Stage::Beta, false),
    FeatureGate::new("ConsistentListFromCache", true, Stage::Ga, true),
    FeatureGate::new("ConstrainedImpersonation", true, Stage::Beta, false),
    FeatureGate::new("CoordinatedLeaderElection", false, Stage::Beta, false),
    FeatureGate::new("DeclarativeValidation", true, Stage::Ga, true),
    FeatureGate::new("DeclarativeValidationBeta", true, Stage::Beta, false),
    FeatureGate::new(
        "DeclarativeValidationTakeover",
        false,
        Stage::Deprecated,
        false,
    ),
    FeatureGate::new("DetectCacheInconsistency", true, Stage::Beta, false),
    FeatureGate::new("KMSv1", false, Stage::Deprecated, false),
    FeatureGate::new("ListFromCacheSnapshot", true, Stage::Beta, false),
    FeatureGate::new(
        "ManifestBasedAdmissionControlConfig",
        false,
        Stage::Alpha,
        false,
    ),
    FeatureGate::new("MutatingAdmissionPolicy", true, Stage::Ga, false),
    FeatureGate::new("OpenAPIEnums", true, Stage::Beta, false),
    FeatureGate::new("RemoteRequestHeaderUID", true, Stage::Beta, false),
    FeatureGate::new("ResilientWatchCacheInitialization", true, Stage::Ga, true),
    FeatureGate::new("RetryGenerateName", true, Stage::Ga, true),
    FeatureGate::new("SeparateCacheWatchRPC", false, Stage::Deprecated, true),
    FeatureGate::new("ShardedListAndWatch", false, Stage::Alpha, false),
    FeatureGate::new("SizeBasedListCostEstimate", true, Stage::Beta, false),
    FeatureGate::new("StorageVersionAPI", false, Stage::Alpha, false),
    FeatureGate::new("StorageVersionHash", true, Stage::Beta, false),
    FeatureGate::new("StreamingCollectionEncodingToJSON", true, Stage::Ga, true),
    FeatureGate::new(
        "StreamingCollectionEncodingToProtobuf",
        true,
        Stage::Ga,
        true,
    ),
    FeatureGate::new(
        "StructuredAuthenticationConfiguration",
        true,
        Stage::Ga,
        true,
    ),
    FeatureGate::new(
        "StructuredAuthenticationConfigurationEgressSelector",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new(
        "StructuredAuthenticationConfigurationJWKSMetrics",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new(
        "TokenRequestServiceAccountUIDValidation",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new(
        "UnauthenticatedHTTP2DOSMitigation",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new(
        "UnknownVersionInteroperabilityProxy",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new(
        "WatchCacheInitializationPostStartHook",
        true,
        Stage::Beta,
        false,
    ),
    FeatureGate::new("WatchList", true, Stage::Beta, false),
    // k8s.io/component-base/zpages/features v0.36.1.
    FeatureGate::new("ComponentFlagz", true, Stage::Beta, false),
    FeatureGate::new("ComponentStatusz", true, Stage::Beta, false),
];
