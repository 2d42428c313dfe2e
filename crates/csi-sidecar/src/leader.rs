//! Lease-based leader election with client-go's semantics (`tools/leaderelection`), so our
//! sidecars and the Go ones agree on a shared Lease: holder identity, lease duration, acquire
//! and renew times, transitions. The decisions are pure functions ([`Candidate::plan`],
//! [`renewal_expired`], [`LeaderStatus::check_at`]); [`run`] is the thin API loop around them.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ObjectMeta, PostParams};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecorder, EventType};
use crate::feature_gates::{FeatureGate, Stage};
use csi_kinds::go_duration::format_go_duration;

/// Feature gate shared by the controller sidecars: on SIGTERM, drain and release the Lease.
pub const RELEASE_ON_EXIT_GATE: FeatureGate = FeatureGate {
    name: "ReleaseLeaderElectionOnExit",
    default: false,
    stage: Stage::Alpha,
    locked: false,
};

/// client-go's `JitterFactor`: acquisition attempts wait retry_period * [1, 1.2).
const JITTER_FACTOR: f64 = 1.2;

/// Reason of the Events on the Lease (client-go's resource locks).
pub const LEADER_ELECTION_REASON: &str = "LeaderElection";

/// How long past lease expiry `/healthz/leader-election` still reports healthy
/// (csi-lib-utils' healthz adaptor timeout).
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("lost leadership of lease {namespace}/{name}")]
    Lost { namespace: String, name: String },
}

/// The three timings of leader election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderElectionTimings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElectionTimings {
    /// client-go's `NewLeaderElector` checks.
    pub fn validate(&self) -> Result<(), String> {
        let show = |d: Duration| format_go_duration(d);
        if self.retry_period.is_zero() || self.renew_deadline.is_zero() {
            return Err(
                "leader election retry period and renew deadline must be greater than zero".into(),
            );
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "leader election lease duration ({}) must be greater than the renew deadline ({})",
                show(self.lease_duration),
                show(self.renew_deadline)
            ));
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return Err(format!(
                "leader election renew deadline ({}) must be greater than {JITTER_FACTOR} x the retry period ({})",
                show(self.renew_deadline),
                show(self.retry_period)
            ));
        }
        Ok(())
    }
}

/// Everything [`run`] needs.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    /// `source.component` of the `LeaderElection` Events: `<lock name>/<host name>`, both
    /// unsanitized, as csi-lib-utils names its recorder.
    pub event_source: String,
    pub labels: BTreeMap<String, String>,
    pub timings: LeaderElectionTimings,
    /// Release the Lease when the work ends or on shutdown (`ReleaseLeaderElectionOnExit`).
    pub release_on_exit: bool,
}

impl LeaderElectionConfig {
    /// The configuration upstream derives from the flags for a given lock name:
    /// `namespace_flag` is `--leader-election-namespace` (empty: POD_NAMESPACE, then the
    /// service account's namespace), `labels` `--leader-election-labels`.
    pub fn new(
        lock_name: &str,
        namespace_flag: &str,
        labels: BTreeMap<String, String>,
        timings: LeaderElectionTimings,
        release_on_exit: bool,
    ) -> Self {
        let host = hostname();
        Self {
            lease_name: sanitize_name(lock_name),
            namespace: resolve_namespace(
                namespace_flag,
                std::env::var("POD_NAMESPACE").ok(),
                std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE).ok(),
            ),
            identity: sanitize_name(&host),
            event_source: format!("{lock_name}/{host}"),
            labels,
            timings,
            release_on_exit,
        }
    }
}

/// csi-lib-utils' rule for the Lease name and the holder identity: every character outside
/// `[A-Za-z0-9-]` becomes `-`, and a trailing `-` gets an `X` appended.
pub fn sanitize_name(name: &str) -> String {
    let mut sanitized: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if sanitized.is_empty() || sanitized.ends_with('-') {
        sanitized.push('X');
    }
    sanitized
}

/// The Lease namespace: the flag, else `POD_NAMESPACE`, else the service account's namespace,
/// else `default`.
pub fn resolve_namespace(
    flag: &str,
    pod_namespace: Option<String>,
    service_account_namespace: Option<String>,
) -> String {
    [
        Some(flag.to_string()),
        pod_namespace,
        service_account_namespace,
    ]
    .into_iter()
    .flatten()
    .map(|ns| ns.trim().to_string())
    .find(|ns| !ns.is_empty())
    .unwrap_or_else(|| "default".to_string())
}

/// The host name, the identity upstream uses for the Lease holder.
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

/// What to do with the Lease in one acquire-or-renew attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    /// No Lease exists: create it with this spec.
    Create(LeaseSpec),
    /// Take or keep the Lease: write this spec over the observed version.
    Update(LeaseSpec),
    /// Another candidate holds an unexpired Lease.
    HeldBy(String),
}

/// One candidate's view of the Lease. The expiry of someone else's lease is measured on our
/// own monotonic clock from when we last saw the record change, never from the timestamps in
/// it, so clock skew between hosts does not matter; and for the duration the record states,
/// not our own, so candidates with different `--leader-election-lease-duration` (a rolling
/// upgrade) never lead at once (as client-go).
#[derive(Debug, Clone)]
pub struct Candidate {
    identity: String,
    lease_duration: Duration,
    observed: Option<(LeaseSpec, Instant)>,
}

impl Candidate {
    pub fn new(identity: impl Into<String>, lease_duration: Duration) -> Self {
        Self {
            identity: identity.into(),
            lease_duration,
            observed: None,
        }
    }

    /// Decides the next write given the Lease as just read (`None`: it does not exist).
    pub fn plan(&mut self, current: Option<&LeaseSpec>, now: Instant, wall: Timestamp) -> Attempt {
        let lease_seconds = self.lease_seconds();
        let Some(current) = current else {
            return Attempt::Create(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(lease_seconds),
                acquire_time: Some(MicroTime(wall)),
                renew_time: Some(MicroTime(wall)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            });
        };
        if self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| seen != current)
        {
            self.observed = Some((current.clone(), now));
        }
        let observed_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
        let holder = current.holder_identity.clone().unwrap_or_default();
        let held_by_me = holder == self.identity;
        if !holder.is_empty() && !held_by_me && observed_at + record_duration(current) > now {
            return Attempt::HeldBy(holder);
        }
        let transitions = current.lease_transitions.unwrap_or(0);
        Attempt::Update(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(lease_seconds),
            acquire_time: if held_by_me {
                current.acquire_time.clone()
            } else {
                Some(MicroTime(wall))
            },
            renew_time: Some(MicroTime(wall)),
            lease_transitions: Some(if held_by_me {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        })
    }

    /// client-go's fast path: while the record we last saw or wrote is ours and unexpired, the
    /// leader renews by writing over it without reading the Lease first; `None` otherwise.
    pub fn renewal(&self, now: Instant, wall: Timestamp) -> Option<LeaseSpec> {
        let (observed, observed_at) = self.observed.as_ref()?;
        let ours = observed.holder_identity.as_deref() == Some(self.identity.as_str());
        (ours && *observed_at + record_duration(observed) > now).then(|| LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_seconds()),
            acquire_time: observed.acquire_time.clone(),
            renew_time: Some(MicroTime(wall)),
            lease_transitions: observed.lease_transitions,
            ..LeaseSpec::default()
        })
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Records our own successful write, so the next plan compares against it.
    pub fn wrote(&mut self, spec: LeaseSpec, now: Instant) {
        self.observed = Some((spec, now));
    }

    /// The spec that gives the Lease up (client-go's release: no holder, 1s duration), if we
    /// hold it.
    pub fn release(&self, wall: Timestamp) -> Option<LeaseSpec> {
        let (current, _) = self.observed.as_ref()?;
        (current.holder_identity.as_deref() == Some(self.identity.as_str())).then(|| LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(wall)),
            renew_time: Some(MicroTime(wall)),
            lease_transitions: current.lease_transitions,
            ..LeaseSpec::default()
        })
    }
}

/// The duration a Lease record states; a record without one has expired, as in client-go
/// (zero seconds).
fn record_duration(record: &LeaseSpec) -> Duration {
    Duration::from_secs(
        record
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(0),
    )
}

/// A leader whose renewal attempts started at `renewal_started` and have not succeeded by
/// `now` has lost leadership once the renew deadline has passed.
pub fn renewal_expired(renewal_started: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now >= renewal_started + renew_deadline
}

/// The label of `leader_election_master_status`: client-go's `LeaderElectionConfig.Name`,
/// which csi-lib-utils never sets, so the Go sidecars report `name=""`.
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ElectionLabel {
    name: String,
}

/// Shared leadership state, for `/healthz/leader-election`, `leader_election_master_status`,
/// `leader_election_slowpath_total` and logs.
#[derive(Debug)]
pub struct LeaderStatus {
    lease_duration: Duration,
    state: Mutex<LeadState>,
    master_status: Family<ElectionLabel, Gauge>,
    slowpath: Family<ElectionLabel, Counter>,
}

#[derive(Debug, Clone, Copy, Default)]
struct LeadState {
    leading: bool,
    renewed_at: Option<Instant>,
}

impl LeaderStatus {
    pub fn new(lease_duration: Duration) -> Arc<Self> {
        Arc::new(Self {
            lease_duration,
            state: Mutex::new(LeadState::default()),
            master_status: Family::default(),
            slowpath: Family::default(),
        })
    }

    /// Serves `leader_election_master_status` (component-base's family) from `registry`: 1
    /// while leading, 0 while electing, no series without leader election.
    pub fn register(&self, registry: &mut Registry) {
        csi_grpc::metrics::register_as_upstream(
            registry,
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            self.master_status.clone(),
        );
        csi_grpc::metrics::register_as_upstream(
            registry,
            "leader_election_slowpath",
            "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
            self.slowpath.clone(),
        );
    }

    /// A renewal that had to read the Lease first (the fast path's write failed).
    fn slowpath_exercised(&self) {
        self.slowpath.get_or_create(&ElectionLabel::default()).inc();
    }

    pub fn is_leader(&self) -> bool {
        self.lock().leading
    }

    pub(crate) fn set(&self, leading: bool, renewed_at: Option<Instant>) {
        *self.lock() = LeadState {
            leading,
            renewed_at,
        };
        self.master_status
            .get_or_create(&ElectionLabel::default())
            .set(i64::from(leading));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeadState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The health check: a non-leader is healthy; a leader is unhealthy once its last renewal
    /// is older than the lease duration plus [`HEALTH_TOLERANCE`].
    pub fn check_at(&self, now: Instant) -> Result<(), String> {
        let state = *self.lock();
        match state.renewed_at {
            Some(renewed)
                if state.leading && now > renewed + self.lease_duration + HEALTH_TOLERANCE =>
            {
                Err(format!(
                    "failed to renew leadership: last renewal {} ago",
                    format_go_duration(Duration::from_secs(now.duration_since(renewed).as_secs()))
                ))
            }
            _ => Ok(()),
        }
    }

    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }
}

/// Runs `work` only while this process holds the Lease. Returns `Ok` when the work ends or
/// `shutdown` fires, and [`LeaderElectionError::Lost`] when renewal fails past the deadline
/// (the caller exits non-zero, as upstream). `work` gets a token cancelled when leadership or
/// the process ends.
pub async fn run<W, F>(
    client: Client,
    config: LeaderElectionConfig,
    status: Arc<LeaderStatus>,
    shutdown: CancellationToken,
    work: W,
) -> Result<(), LeaderElectionError>
where
    W: FnOnce(CancellationToken) -> F,
    F: Future<Output = ()>,
{
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let timings = config.timings;
    let mut lock = LeaseLock {
        candidate: Candidate::new(config.identity.clone(), timings.lease_duration),
        written: None,
    };
    let lease = format!("{}/{}", config.namespace, config.lease_name);
    tracing::info!(%lease, identity = %config.identity, "attempting to acquire leader lease");
    status.set(false, None);

    let mut held = loop {
        let attempt = tokio::time::timeout(
            timings.renew_deadline,
            try_acquire_or_renew(&api, &config, &mut lock, &status),
        )
        .await;
        match attempt {
            Ok(Ok(Some(held))) => break held,
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::warn!(%lease, %error, "error acquiring leader lease"),
            Err(_) => tracing::warn!(%lease, "timed out acquiring leader lease"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(jittered(timings.retry_period)) => {}
        }
    };
    tracing::info!(%lease, "successfully acquired lease, started leading");
    status.set(true, Some(Instant::now()));
    // client-go's resource lock records both transitions as Events on the Lease.
    let events = EventRecorder::new(client, config.event_source.clone(), "");
    let transition = |what: &str| format!("{} {what}", config.identity);
    events
        .publish(
            &held,
            EventType::Normal,
            LEADER_ELECTION_REASON,
            &transition("became leader"),
        )
        .await;

    let work_token = shutdown.child_token();
    let work = work(work_token.clone());
    tokio::pin!(work);
    let ended = {
        let renewing = keep_renewing(&api, &config, &mut lock, &status, &mut held);
        tokio::pin!(renewing);
        tokio::select! {
            () = &mut work => Ended::WorkDone,
            lost = &mut renewing => Ended::Lost(lost),
            _ = shutdown.cancelled() => Ended::Shutdown,
        }
    };
    work_token.cancel();
    if matches!(ended, Ended::Shutdown) {
        // Let the work drain, bounded, before giving up the Lease.
        let _ = tokio::time::timeout(csi_grpc::shutdown::GRACE_PERIOD, &mut work).await;
    }
    status.set(false, None);
    events
        .publish(
            &held,
            EventType::Normal,
            LEADER_ELECTION_REASON,
            &transition("stopped leading"),
        )
        .await;
    match ended {
        // No waiting for the Event: a leader that lost its Lease stops at once, before a new
        // leader may start (the Go sidecars exit at once and lose it as well).
        Ended::Lost(error) => {
            tracing::error!(%error, "leader election lost");
            Err(error)
        }
        Ended::WorkDone | Ended::Shutdown => {
            if config.release_on_exit {
                release(&api, &config, &lock).await;
            }
            // The process usually exits next: write the Event first, bounded.
            let _ = tokio::time::timeout(timings.renew_deadline, events.flush()).await;
            Ok(())
        }
    }
}

enum Ended {
    WorkDone,
    Lost(LeaderElectionError),
    Shutdown,
}

/// The leader's renew loop: every retry period, renew; a renewal that has not succeeded within
/// the renew deadline (retrying every retry period) means leadership is lost. `held` follows
/// each renewal, so the "stopped leading" Event names the Lease as last written (as client-go's
/// lock keeps the object it last read or wrote).
async fn keep_renewing(
    api: &Api<Lease>,
    config: &LeaderElectionConfig,
    lock: &mut LeaseLock,
    status: &LeaderStatus,
    held: &mut ObjectReference,
) -> LeaderElectionError {
    let timings = config.timings;
    loop {
        tokio::time::sleep(timings.retry_period).await;
        let started = Instant::now();
        loop {
            let deadline = started + timings.renew_deadline;
            match tokio::time::timeout_at(deadline, try_acquire_or_renew(api, config, lock, status))
                .await
            {
                Ok(Ok(Some(renewed))) => {
                    *held = renewed;
                    status.set(true, Some(Instant::now()));
                    break;
                }
                Ok(Ok(None)) => {
                    tracing::warn!(lease = %config.lease_name, "lease was taken by another candidate")
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = %config.lease_name, %error, "failed to renew lease")
                }
                Err(_) => tracing::warn!(lease = %config.lease_name, "timed out renewing lease"),
            }
            let now = Instant::now();
            if renewal_expired(started, now, timings.renew_deadline) {
                return LeaderElectionError::Lost {
                    namespace: config.namespace.clone(),
                    name: config.lease_name.clone(),
                };
            }
            tokio::time::sleep_until((now + timings.retry_period).min(deadline)).await;
        }
    }
}

/// Our side of the Lease: the candidate's view, and the Lease as we last wrote it (client-go's
/// resource lock keeps it, so the leader's renewal is a single write).
struct LeaseLock {
    candidate: Candidate,
    written: Option<Lease>,
}

impl LeaseLock {
    /// Records a successful write; the Lease as the involved object of Events.
    fn wrote(&mut self, written: Lease) -> ObjectReference {
        let reference = lease_reference(&written.metadata);
        let spec = written.spec.clone().unwrap_or_default();
        self.candidate.wrote(spec, Instant::now());
        self.written = Some(written);
        reference
    }
}

/// One client-go `tryAcquireOrRenew`: the Lease we hold afterwards, or `None`. The leader first
/// writes over the Lease it last wrote, unread (the fast path: one request per renewal); when
/// that fails (someone else wrote it meanwhile), it reads the Lease and decides afresh (the
/// slow path, counted in `leader_election_slowpath_total`). Conflicts (someone else wrote
/// first) are "not acquired", not errors.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaderElectionConfig,
    lock: &mut LeaseLock,
    status: &LeaderStatus,
) -> Result<Option<ObjectReference>, ::kube::Error> {
    let renewal = lock.candidate.renewal(Instant::now(), Timestamp::now());
    if let (Some(spec), Some(written)) = (renewal, &lock.written) {
        let mut lease = written.clone();
        lease.spec = Some(spec);
        match api
            .replace(&config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => return Ok(Some(lock.wrote(written))),
            Err(error) => {
                tracing::debug!(lease = %config.lease_name, error = %crate::api_errors::GoApiError(&error), "failed to update the lease optimistically, falling back to the slow path");
            }
        }
    }
    let existing = api.get_opt(&config.lease_name).await?;
    let current = existing.as_ref().and_then(|lease| lease.spec.as_ref());
    let renewing =
        current.and_then(|spec| spec.holder_identity.as_deref()) == Some(config.identity.as_str());
    let plan = lock
        .candidate
        .plan(current, Instant::now(), Timestamp::now());
    let result = match plan {
        Attempt::HeldBy(holder) => {
            tracing::debug!(lease = %config.lease_name, %holder, "lease is held by another candidate");
            return Ok(None);
        }
        Attempt::Create(spec) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.lease_name.clone()),
                    namespace: Some(config.namespace.clone()),
                    labels: (!config.labels.is_empty()).then(|| config.labels.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await
        }
        Attempt::Update(spec) => {
            if renewing {
                status.slowpath_exercised();
            }
            let mut lease = existing.unwrap_or_default();
            lease.spec = Some(spec);
            api.replace(&config.lease_name, &PostParams::default(), &lease)
                .await
        }
    };
    match result {
        Ok(written) => Ok(Some(lock.wrote(written))),
        Err(::kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(error) => Err(error),
    }
}

/// The Lease as the involved object of an Event.
fn lease_reference(metadata: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some("coordination.k8s.io/v1".to_string()),
        kind: Some("Lease".to_string()),
        name: metadata.name.clone(),
        namespace: metadata.namespace.clone(),
        uid: metadata.uid.clone(),
        resource_version: metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// Gives the Lease up by writing over the Lease as we last wrote it (client-go's release, no
/// read): if someone else wrote it since, the write conflicts and their Lease stays as is.
async fn release(api: &Api<Lease>, config: &LeaderElectionConfig, lock: &LeaseLock) {
    let (Some(spec), Some(written)) = (lock.candidate.release(Timestamp::now()), &lock.written)
    else {
        return;
    };
    let mut lease = written.clone();
    lease.spec = Some(spec);
    let params = PostParams::default();
    let result = api.replace(&config.lease_name, &params, &lease);
    match tokio::time::timeout(config.timings.renew_deadline, result).await {
        Ok(Ok(_)) => tracing::info!(lease = %config.lease_name, "released leader lease"),
        Ok(Err(::kube::Error::Api(status))) if status.code == 409 => {
            tracing::info!(lease = %config.lease_name, "leader lease was written by another candidate; not released")
        }
        Ok(Err(error)) => {
            tracing::warn!(lease = %config.lease_name, %error, "failed to release leader lease")
        }
        Err(_) => tracing::warn!(lease = %config.lease_name, "timed out releasing leader lease"),
    }
}

/// `period * [1, JITTER_FACTOR)`, so standby candidates do not retry in lockstep.
fn jittered(period: Duration) -> Duration {
    crate::backoff::jitter(period, JITTER_FACTOR - 1.0)
}

#[cfg(test)]
mod tests;
