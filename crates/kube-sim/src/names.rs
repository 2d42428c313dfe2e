//! apimachinery's DNS-1123 name rules (k8s.io/apimachinery/pkg/util/validation
//! `IsDNS1123Label`, `IsDNS1123Subdomain`) for the names the API server validates: object
//! names, namespaces, label-key prefixes. kube-sim keeps its own rather than the sidecars', so
//! that a bug there is not mirrored by the API server they are tested against.

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` with at most 63 characters (namespace names).
pub fn is_dns1123_label(value: &str) -> bool {
    value.len() <= 63 && is_label_shaped(value)
}

/// At most 253 characters matching [`matches_dns1123_subdomain`] (most object names).
pub fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253 && matches_dns1123_subdomain(value)
}

/// The subdomain regex alone, `<label>(\.<label>)*`: no length limit, on a part either.
pub fn matches_dns1123_subdomain(value: &str) -> bool {
    value.split('.').all(is_label_shaped)
}

/// The label regex alone: lower-case alphanumerics and `-`, alphanumeric at both ends.
fn is_label_shaped(value: &str) -> bool {
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = value.as_bytes();
    bytes.first().is_some_and(alphanumeric)
        && bytes.last().is_some_and(alphanumeric)
        && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
}

#[cfg(test)]
mod tests {
    //! Vectors from apimachinery's pkg/util/validation/validation_test.go
    //! (TestIsDNS1123Label, TestIsDNS1123Subdomain).

    use super::*;

    const LABELS: [&str; 12] = [
        "a",
        "ab",
        "abc",
        "a1",
        "a-1",
        "a--1--2--b",
        "0",
        "01",
        "012",
        "1a",
        "1-a",
        "1--a--b--2",
    ];

    const NEITHER: [&str; 33] = [
        "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a",
        "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "1.", ".1", " ", "a ", " a", "a b", "1 ", " 1",
        "1 2", "a..b", "1..2",
    ];

    #[test]
    fn dns1123_labels() {
        for good in LABELS.into_iter().chain([&*"a".repeat(63)]) {
            assert!(is_dns1123_label(good), "{good:?}");
        }
        let dotted = ["a.b", "1.2"];
        for bad in NEITHER.into_iter().chain(dotted).chain([&*"a".repeat(64)]) {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn dns1123_subdomains() {
        let dotted = [
            "a.a",
            "ab.a",
            "abc.a",
            "a1.a",
            "a-1.a",
            "a--1--2--b.a",
            "a.1",
            "ab.1",
            "abc.1",
            "a1.1",
            "a-1.1",
            "a--1--2--b.1",
            "0.a",
            "01.a",
            "012.a",
            "1a.a",
            "1-a.a",
            "0.1",
            "01.1",
            "012.1",
            "1a.1",
            "1-a.1",
            "1--a--b--2.1",
            "a.b.c.d.e",
            "aa.bb.cc.dd.ee",
            "1.2.3.4.5",
            "11.22.33.44.55",
        ];
        let long = "a".repeat(253);
        for good in LABELS.into_iter().chain(dotted).chain([&*long]) {
            assert!(is_dns1123_subdomain(good), "{good:?}");
        }
        let upper = [
            "A.a",
            "aB.a",
            "ab.A",
            "A1.a",
            "a1.A",
            "A.1",
            "aB.1",
            "A1.1",
            "1A.1",
            "0.A",
            "01.A",
            "012.A",
            "1A.a",
            "1a.A",
            "A.B.C.D.E",
            "AA.BB.CC.DD.EE",
            "a.B.c.d.e",
            "aa.bB.cc.dd.ee",
            "a@b",
            "a,b",
            "a_b",
            "a;b",
            "a:b",
            "a%b",
            "a?b",
            "a$b",
        ];
        let too_long = "a".repeat(254);
        for bad in NEITHER.into_iter().chain(upper).chain([&*too_long]) {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        assert!(
            matches_dns1123_subdomain(&too_long),
            "the regex alone has no limit"
        );
    }
}
