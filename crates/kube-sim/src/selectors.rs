//! Label and field selectors, parsed and evaluated the way kube-apiserver does for the
//! `labelSelector` and `fieldSelector` parameters of list and watch.
//!
//! This module is pure: it parses selector strings and evaluates them against objects held as
//! `serde_json::Value`. Every parse, validation or "unsupported field" failure is a
//! [`SelectorError`]; kube-apiserver answers all of them with 400 BadRequest and the error text as
//! the Status message.
//!
//! The label and field halves, each with the upstream sources it follows, are the `label` and
//! `field` submodules; their types are re-exported here.

mod field;
mod label;

pub use field::{FieldOperator, FieldRequirement, FieldSelector, qualified_kind};
pub use label::{LabelOperator, LabelRequirement, LabelSelector};
/// apimachinery's name checks, which object validation uses too.
pub(crate) use label::{dns1123_subdomain_errors, label_value_errors, qualified_name_errors};

/// A selector that kube-apiserver would reject. The message follows upstream's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The `labelSelector` does not parse or a key/value is invalid.
    #[error("{0}")]
    InvalidLabelSelector(String),
    /// The `fieldSelector` does not parse (syntax or escaping).
    #[error("{0}")]
    InvalidFieldSelector(String),
    /// The field selector names a field the kind does not support.
    #[error("{message}")]
    FieldLabelNotSupported {
        /// The field label as the client wrote it.
        field: String,
        /// Upstream's message, e.g. `field label not supported: spec.foo`.
        message: String,
    },
}

/// A double-quoted string with escapes, close to Go's `%q`.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A label (or field) set from `(key, value)` pairs, for the tests of both halves.
#[cfg(test)]
fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
