//! The dynamic configuration: the driver ConfigMap's file (`--driver-config-params`), with
//! Dell's `PODMON_*` keys plus ours, re-read when its content changes (a ConfigMap volume
//! updates in place). A bad file at startup is fatal (as Dell); later it is logged and the
//! previous settings stay — all of them: a bad key never applies half a file.
//!
//! Log keys (`PODMON_*_LOG_LEVEL/FORMAT`, `CSI_LOG_LEVEL/FORMAT`) are validated, but the log
//! level comes from `-v`/`RUST_LOG`; a change is reported, not applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The settings the file may change while podmon runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Tunables {
    pub poll_rate: Duration,
    pub loss_threshold: u32,
    pub skip_validation: bool,
    /// Cluster-wide pause of cleanups (`PODMON_MAINTENANCE`).
    pub maintenance: bool,
    pub max_evacuated_fraction: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

const LOG_LEVELS: [&str; 7] = [
    "panic", "fatal", "error", "warn", "warning", "info", "debug",
];

/// `base` with the file's keys applied.
pub fn apply(base: &Tunables, text: &str) -> Result<Tunables, String> {
    let values: BTreeMap<String, serde_norway::Value> = if text.trim().is_empty() {
        BTreeMap::new()
    } else {
        serde_norway::from_str(text).map_err(|e| format!("not a YAML map of keys: {e}"))?
    };
    let mut next = base.clone();
    for (key, value) in &values {
        let text = match value {
            serde_norway::Value::String(s) => s.clone(),
            serde_norway::Value::Number(n) => n.to_string(),
            serde_norway::Value::Bool(b) => b.to_string(),
            other => return Err(format!("{key}: {other:?} is not a scalar")),
        };
        let positive = |text: &str| -> Result<u64, String> {
            text.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{key}: {text:?} is not a positive integer"))
        };
        let boolean =
            |text: &str| csi_grpc::flags::parse_go_bool(text).map_err(|e| format!("{key}: {e}"));
        match key.as_str() {
            "PODMON_ARRAY_CONNECTIVITY_POLL_RATE" => {
                next.poll_rate = Duration::from_secs(positive(&text)?)
            }
            "PODMON_ARRAY_CONNECTIVITY_CONNECTION_LOSS_THRESHOLD" => {
                next.loss_threshold =
                    u32::try_from(positive(&text)?).map_err(|e| format!("{key}: {e}"))?
            }
            "PODMON_SKIP_ARRAY_CONNECTION_VALIDATION" => next.skip_validation = boolean(&text)?,
            "PODMON_MAINTENANCE" => next.maintenance = boolean(&text)?,
            "PODMON_MAX_EVACUATED_FRACTION" => {
                next.max_evacuated_fraction = text
                    .parse::<f64>()
                    .ok()
                    .filter(|f| *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| format!("{key}: {text:?} is not in (0, 1]"))?
            }
            "PODMON_CONTROLLER_LOG_LEVEL" | "PODMON_NODE_LOG_LEVEL" | "CSI_LOG_LEVEL" => {
                if !LOG_LEVELS.contains(&text.to_ascii_lowercase().as_str()) {
                    return Err(format!("{key}: {text:?} is not a log level"));
                }
            }
            "PODMON_CONTROLLER_LOG_FORMAT" | "PODMON_NODE_LOG_FORMAT" | "CSI_LOG_FORMAT" => {
                if !["json", "text"].contains(&text.to_ascii_lowercase().as_str()) {
                    return Err(format!("{key}: {text:?} is neither json nor text"));
                }
            }
            _ => tracing::debug!(%key, "ignoring a key podmon does not use"),
        }
    }
    Ok(next)
}

/// The live settings: loaded from `path` (if any) at startup, then re-read every `period`.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    current: Arc<RwLock<Tunables>>,
}

impl LiveConfig {
    pub fn fixed(tunables: Tunables) -> Self {
        Self {
            current: Arc::new(RwLock::new(tunables)),
        }
    }

    /// Loads `path` over `base` (an error is fatal) and keeps re-reading it until `shutdown`.
    pub fn load(
        base: Tunables,
        path: &Path,
        period: Duration,
        shutdown: CancellationToken,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let tunables = apply(&base, &text).map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        tracing::info!(path = %path.display(), ?tunables, "loaded the dynamic configuration");
        let live = Self::fixed(tunables);
        let watched = live.clone();
        let path = path.to_path_buf();
        tokio::spawn(async move {
            let mut last = text;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(period) => {}
                }
                let Ok(text) = tokio::fs::read_to_string(&path).await else {
                    tracing::warn!(path = %path.display(), "cannot read the dynamic configuration; keeping the current one");
                    continue;
                };
                if text == last {
                    continue;
                }
                match apply(&base, &text) {
                    Ok(tunables) => {
                        tracing::info!(path = %path.display(), ?tunables, "reloaded the dynamic configuration");
                        watched.set(tunables);
                    }
                    Err(message) => {
                        tracing::warn!(path = %path.display(), %message, "invalid dynamic configuration; keeping the current one")
                    }
                }
                last = text;
            }
        });
        Ok(live)
    }

    pub fn get(&self) -> Tunables {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the settings (what a reload does; tests flip switches with it).
    pub fn set(&self, tunables: Tunables) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = tunables;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Tunables {
        Tunables {
            poll_rate: Duration::from_secs(15),
            loss_threshold: 3,
            skip_validation: false,
            maintenance: false,
            max_evacuated_fraction: 0.3333,
        }
    }

    #[test]
    fn keys_override_the_flags() {
        let text = "PODMON_ARRAY_CONNECTIVITY_POLL_RATE: 60\nPODMON_ARRAY_CONNECTIVITY_CONNECTION_LOSS_THRESHOLD: \"5\"\nPODMON_SKIP_ARRAY_CONNECTION_VALIDATION: true\nPODMON_MAINTENANCE: \"true\"\nPODMON_MAX_EVACUATED_FRACTION: 0.5\nPODMON_CONTROLLER_LOG_LEVEL: Debug\nCSI_LOG_FORMAT: JSON\nX_CSI_OTHER: anything\n";
        let tunables = apply(&base(), text).unwrap();
        assert_eq!(tunables.poll_rate, Duration::from_secs(60));
        assert_eq!(tunables.loss_threshold, 5);
        assert!(tunables.skip_validation && tunables.maintenance);
        assert_eq!(tunables.max_evacuated_fraction, 0.5);
        assert_eq!(apply(&base(), "").unwrap(), base());
    }

    #[test]
    fn bad_values_are_refused_whole() {
        for (text, expected) in [
            (
                "PODMON_ARRAY_CONNECTIVITY_POLL_RATE: 0",
                "not a positive integer",
            ),
            (
                "PODMON_ARRAY_CONNECTIVITY_CONNECTION_LOSS_THRESHOLD: 5.323",
                "not a positive integer",
            ),
            ("PODMON_SKIP_ARRAY_CONNECTION_VALIDATION: maybe", "maybe"),
            ("PODMON_NODE_LOG_LEVEL: loud", "not a log level"),
            ("PODMON_NODE_LOG_FORMAT: xml", "neither json nor text"),
            ("PODMON_MAX_EVACUATED_FRACTION: 2", "not in (0, 1]"),
            ("[1, 2]", "not a YAML map"),
            ("PODMON_MAINTENANCE: [true]", "not a scalar"),
        ] {
            let error = apply(&base(), text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded_and_a_bad_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("driver-config-params.yaml");
        std::fs::write(&path, "PODMON_MAINTENANCE: false\n").unwrap();
        let shutdown = CancellationToken::new();
        let live =
            LiveConfig::load(base(), &path, Duration::from_millis(20), shutdown.clone()).unwrap();
        assert!(!live.get().maintenance);
        std::fs::write(&path, "PODMON_MAINTENANCE: true\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !live.get().maintenance {
            assert!(std::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::write(&path, "PODMON_MAINTENANCE: perhaps\n").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(live.get().maintenance, "a bad file keeps the last settings");
        shutdown.cancel();
        assert!(
            LiveConfig::load(
                base(),
                &dir.path().join("missing"),
                Duration::from_secs(1),
                CancellationToken::new()
            )
            .is_err()
        );
    }
}
