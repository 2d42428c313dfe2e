//! Kubernetes name rules (apimachinery `validation.IsDNS1123Label` / `IsDNS1123Subdomain`),
//! shared by the secret resolver and kube-sim's API server.

/// At most 63 characters of `[a-z0-9-]`, alphanumeric at both ends (namespaces, labels).
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && matches_dns1123_label_pattern(s)
}

/// At most 253 characters of dot-separated label-shaped parts (most object names); the regex
/// puts no 63-character limit on a part.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(matches_dns1123_label_pattern)
}

/// The DNS-1123 label pattern without the length limit.
pub fn matches_dns1123_label_pattern(s: &str) -> bool {
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|c| alnum(c) || *c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_names() {
        let table = [
            ("a", true, true),
            ("a-b", true, true),
            ("a.b", false, true),
            ("-a", false, false),
            ("a-", false, false),
            ("A", false, false),
            ("", false, false),
            ("a..b", false, false),
        ];
        for (value, label, subdomain) in table {
            assert_eq!(is_dns1123_label(value), label, "label {value}");
            assert_eq!(is_dns1123_subdomain(value), subdomain, "subdomain {value}");
        }
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(
            is_dns1123_subdomain(&"a".repeat(64)),
            "no per-part limit in a subdomain"
        );
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }
}
