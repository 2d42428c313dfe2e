//! `metav1.LabelSelector` matching, as k8s.io/apimachinery's `LabelSelectorAsSelector` builds
//! it: every `matchLabels` pair and every `matchExpressions` requirement must hold; an empty
//! selector matches everything. A requirement that selector parsing refuses (an unknown
//! operator, `In` without values, `Exists` with values) is an error, not a silent mismatch.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("{0:?} is not a valid label selector operator")]
    Operator(String),
    #[error("for 'in', 'notin' operators, values set can't be empty (key {0:?})")]
    NoValues(String),
    #[error("values set must be empty for exists and does not exist (key {0:?})")]
    Values(String),
}

fn requirement(
    req: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(SelectorError::NoValues(req.key.clone())),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Err(SelectorError::Values(req.key.clone()))
        }
        "In" => Ok(value.is_some_and(|v| values.contains(v))),
        "NotIn" => Ok(!value.is_some_and(|v| values.contains(v))),
        "Exists" => Ok(value.is_some()),
        "DoesNotExist" => Ok(value.is_none()),
        other => Err(SelectorError::Operator(other.to_string())),
    }
}

/// Whether `labels` match `selector`. Every requirement is checked, so an invalid one is
/// reported even when an earlier one already fails.
pub fn matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut all = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    for req in selector.match_expressions.iter().flatten() {
        all &= requirement(req, labels)?;
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn selectors_match_as_apimachinery() {
        let labels = map(&[("app", "db"), ("tier", "data")]);
        let cases: Vec<(LabelSelector, Result<bool, SelectorError>)> = vec![
            (LabelSelector::default(), Ok(true)),
            (
                LabelSelector {
                    match_labels: Some(map(&[("app", "db")])),
                    ..LabelSelector::default()
                },
                Ok(true),
            ),
            (
                LabelSelector {
                    match_labels: Some(map(&[("app", "web")])),
                    ..LabelSelector::default()
                },
                Ok(false),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("tier", "In", &["data", "x"])]),
                    ..LabelSelector::default()
                },
                Ok(true),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("tier", "NotIn", &["data"])]),
                    ..LabelSelector::default()
                },
                Ok(false),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("gone", "NotIn", &["data"])]),
                    ..LabelSelector::default()
                },
                Ok(true),
            ),
            (
                LabelSelector {
                    match_labels: Some(map(&[("app", "db")])),
                    match_expressions: Some(vec![expression("backup", "DoesNotExist", &[])]),
                },
                Ok(true),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("app", "Exists", &[])]),
                    ..LabelSelector::default()
                },
                Ok(true),
            ),
            (
                LabelSelector {
                    match_labels: Some(map(&[("app", "web")])),
                    match_expressions: Some(vec![expression("app", "Matches", &["x"])]),
                },
                Err(SelectorError::Operator("Matches".into())),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("app", "In", &[])]),
                    ..LabelSelector::default()
                },
                Err(SelectorError::NoValues("app".into())),
            ),
            (
                LabelSelector {
                    match_expressions: Some(vec![expression("app", "Exists", &["db"])]),
                    ..LabelSelector::default()
                },
                Err(SelectorError::Values("app".into())),
            ),
        ];
        for (selector, expected) in cases {
            assert_eq!(matches(&selector, &labels), expected, "{selector:?}");
        }
    }
}
