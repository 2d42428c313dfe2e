//! `--feature-gates` with component-base `featuregate` semantics: every gate set knows the
//! special `AllAlpha` and `AllBeta` gates (they switch every alpha or beta gate not named
//! explicitly), an unknown name is refused, a gate locked to its default refuses any other
//! value, and setting a GA or deprecated gate is allowed with a warning.

use std::collections::BTreeMap;

/// A gate's maturity, as component-base's `PreRelease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

/// One entry of a component's feature-gate table, as in effect at the upstream release it
/// mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGate {
    pub name: &'static str,
    pub default: bool,
    pub stage: Stage,
    /// Locked to its default: any other value is refused.
    pub locked: bool,
}

impl FeatureGate {
    pub const fn new(name: &'static str, default: bool, stage: Stage, locked: bool) -> Self {
        Self {
            name,
            default,
            stage,
            locked,
        }
    }
}

/// component-base's special gates, known to every gate set.
const ALL_ALPHA: &str = "AllAlpha";
const ALL_BETA: &str = "AllBeta";

/// A gate set that component-base logs a warning for (GA or deprecated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateWarning {
    pub name: String,
    pub value: bool,
    pub stage: Stage,
}

/// `--feature-gates` resolved against a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedGates {
    /// Every gate of the table with its value (the special gates are not listed).
    pub enabled: BTreeMap<&'static str, bool>,
    pub warnings: Vec<GateWarning>,
}

impl ResolvedGates {
    /// The value of `gate` (its default if the table did not hold it).
    pub fn get(&self, gate: FeatureGate) -> bool {
        self.enabled.get(gate.name).copied().unwrap_or(gate.default)
    }
}

/// Resolves `given` against `table` as component-base's `SetFromMap` does: the first unknown
/// name is the error ("unrecognized feature gate: X"); otherwise every change to a locked gate
/// is ("cannot set feature gate X to V, feature is locked to D"), several as `[a, b]`.
/// Gates named explicitly win over `AllAlpha`/`AllBeta`. Pure.
pub fn resolve_gates(
    given: &BTreeMap<String, bool>,
    table: &[FeatureGate],
) -> Result<ResolvedGates, String> {
    let special = |name: &str| name == ALL_ALPHA || name == ALL_BETA;
    if let Some(unknown) = given
        .keys()
        .find(|name| !special(name) && !table.iter().any(|gate| gate.name == *name))
    {
        return Err(format!("unrecognized feature gate: {unknown}"));
    }
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut enabled: BTreeMap<&'static str, bool> =
        table.iter().map(|gate| (gate.name, gate.default)).collect();
    for gate in table {
        let explicit = given.get(gate.name).copied();
        let by_stage = match gate.stage {
            Stage::Alpha => given.get(ALL_ALPHA),
            Stage::Beta => given.get(ALL_BETA),
            Stage::Ga | Stage::Deprecated => None,
        };
        let Some(value) = explicit.or(by_stage.copied()) else {
            continue;
        };
        if gate.locked && value != gate.default {
            // AllAlpha/AllBeta pass over a locked gate; naming it is the error.
            if explicit.is_some() {
                errors.push(format!(
                    "cannot set feature gate {} to {value}, feature is locked to {}",
                    gate.name, gate.default
                ));
            }
            continue;
        }
        if explicit.is_some() && matches!(gate.stage, Stage::Ga | Stage::Deprecated) {
            warnings.push(GateWarning {
                name: gate.name.to_string(),
                value,
                stage: gate.stage,
            });
        }
        enabled.insert(gate.name, value);
    }
    match errors.len() {
        0 => Ok(ResolvedGates { enabled, warnings }),
        1 => Err(errors.remove(0)),
        _ => Err(format!("[{}]", errors.join(", "))),
    }
}

impl ResolvedGates {
    /// Logs the warnings as component-base does when the gates are set.
    pub fn log_warnings(&self) {
        for warning in &self.warnings {
            let stage = match warning.stage {
                Stage::Deprecated => "deprecated",
                _ => "GA",
            };
            tracing::warn!(
                featureGate = %warning.name,
                value = warning.value,
                "setting {stage} feature gate. It will be removed in a future release."
            );
        }
    }
}

/// [`resolve_gates`], logging its warnings.
pub fn resolve_feature_gates(
    given: &BTreeMap<String, bool>,
    table: &[FeatureGate],
) -> Result<ResolvedGates, String> {
    resolve_gates(given, table).inspect(ResolvedGates::log_warnings)
}
