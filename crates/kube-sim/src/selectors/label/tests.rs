use serde_json::json;

use super::*;
use crate::selectors::labels;

/// (selector, labels, expected match)
type LabelCase = (&'static str, &'static [(&'static str, &'static str)], bool);

fn label_error(text: &str) -> String {
    match LabelSelector::parse(text) {
        Ok(s) => panic!("{text:?} parsed as {s:?}, expected an error"),
        Err(e) => e.to_string(),
    }
}

// Requirement.Matches semantics, labels/selector.go: one table of (selector, labels, match).
#[test]
fn label_operators_match_like_upstream() {
    let cases: &[LabelCase] = &[
        // empty selector
        ("", &[], true),
        ("", &[("a", "b")], true),
        ("   ", &[("a", "b")], true),
        // = and ==
        ("app=web", &[("app", "web")], true),
        ("app=web", &[("app", "db")], false),
        ("app=web", &[], false),
        ("app==web", &[("app", "web")], true),
        ("app==web", &[("app", "db")], false),
        // != matches objects without the label
        ("app!=web", &[("app", "db")], true),
        ("app!=web", &[("app", "web")], false),
        ("app!=web", &[], true),
        ("app!=web", &[("other", "x")], true),
        // in / notin (notin also matches without the label)
        ("env in (prod,staging)", &[("env", "prod")], true),
        ("env in (prod,staging)", &[("env", "dev")], false),
        ("env in (prod,staging)", &[], false),
        ("env notin (prod,staging)", &[("env", "dev")], true),
        ("env notin (prod,staging)", &[("env", "prod")], false),
        ("env notin (prod,staging)", &[], true),
        ("env in (prod)", &[("env", "prod")], true),
        // existence / non-existence
        ("app", &[("app", "")], true),
        ("app", &[("app", "x")], true),
        ("app", &[], false),
        ("!app", &[], true),
        ("!app", &[("app", "x")], false),
        // Gt / Lt: integer comparison, label must exist and be an integer
        ("replicas>3", &[("replicas", "4")], true),
        ("replicas>3", &[("replicas", "3")], false),
        ("replicas>3", &[("replicas", "10")], true),
        ("replicas>3", &[], false),
        ("replicas>3", &[("replicas", "many")], false),
        ("replicas<3", &[("replicas", "2")], true),
        ("replicas<3", &[("replicas", "3")], false),
        ("replicas<3", &[("replicas", "-7")], true),
        ("replicas<10", &[("replicas", "9")], true),
        ("replicas<3", &[], false),
        // empty values
        ("app=", &[("app", "")], true),
        ("app=", &[("app", "x")], false),
        ("app=", &[], false),
        ("app!=", &[("app", "x")], true),
        ("app!=", &[], true),
        ("app in ()", &[("app", "")], true),
        ("app in (a,)", &[("app", "")], true),
        ("app in (,a)", &[("app", "a")], true),
        ("app in (a,,b)", &[("app", "")], true),
        // conjunction
        ("a=1,b=2", &[("a", "1"), ("b", "2")], true),
        ("a=1,b=2", &[("a", "1")], false),
        (
            "a=1,!b,c in (x,y),d notin (z)",
            &[("a", "1"), ("c", "y")],
            true,
        ),
        (
            "a=1,!b,c in (x,y),d notin (z)",
            &[("a", "1"), ("b", ""), ("c", "y")],
            false,
        ),
        // keywords are plain identifiers where a key or value is expected
        ("in in (in,notin)", &[("in", "notin")], true),
        ("notin=in", &[("notin", "in")], true),
        // prefixed keys
        (
            "app.kubernetes.io/name=web",
            &[("app.kubernetes.io/name", "web")],
            true,
        ),
        ("example.com/MyName", &[("example.com/MyName", "v")], true),
    ];
    for (text, set, want) in cases {
        let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(
            selector.matches(&labels(set)),
            *want,
            "{text:?} against {set:?}"
        );
        let object = json!({"metadata": {"labels": labels(set)}});
        assert_eq!(
            selector.matches_object(&object),
            *want,
            "{text:?} against object {object}"
        );
    }
}

// Lexer whitespace rules, labels/selector.go `isWhitespace` and tokenisation.
#[test]
fn label_whitespace_is_tolerated() {
    let cases: &[(&str, &str)] = &[
        ("  app = web  ", "app=web"),
        ("app\t==\tweb", "app==web"),
        ("app\n!=\r\nweb", "app!=web"),
        ("env in(prod,  staging )", "env in (prod,staging)"),
        ("env   notin   ( a , b )", "env notin (a,b)"),
        ("a , b", "a,b"),
        (" ! a", "!a"),
        ("x >  5", "x>5"),
        ("b=1,a=2", "a=2,b=1"),
        ("x in (b,a,b)", "x in (a,b)"),
    ];
    for (text, canonical) in cases {
        let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(selector.to_string(), *canonical, "{text:?}");
        let reparsed: LabelSelector = canonical
            .parse()
            .unwrap_or_else(|e| panic!("{canonical:?}: {e}"));
        assert_eq!(reparsed, selector, "{canonical:?} round trip");
    }
}

// Parser errors, labels/selector.go `parse*`; messages as upstream words them.
#[test]
fn label_syntax_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "x in (a",
            "unable to parse requirement: found '', expected: ',' or ')'",
        ),
        (
            "x in (a b)",
            "unable to parse requirement: found 'b', expected: ',' or ')'",
        ),
        (
            "x in a",
            "unable to parse requirement: found 'a' expected: '('",
        ),
        (
            "x in",
            "unable to parse requirement: found '' expected: '('",
        ),
        (
            "x in (=)",
            "unable to parse requirement: found '=', expected: ',', ')' or identifier",
        ),
        (
            "x in (a,=)",
            "unable to parse requirement: found '=', expected: ',', or identifier",
        ),
        (
            "x y",
            "unable to parse requirement: found 'y', expected: in, notin, =, ==, !=, gt, lt",
        ),
        (
            "x=(a)",
            "unable to parse requirement: found '(', expected: identifier",
        ),
        (
            "!",
            "unable to parse requirement: found '', expected: identifier",
        ),
        (
            "!!x",
            "unable to parse requirement: found '!', expected: identifier",
        ),
        (
            "=a",
            "found '=', expected: !, identifier, or 'end of string'",
        ),
        (
            ",a",
            "found ',', expected: !, identifier, or 'end of string'",
        ),
        ("a,", "found '', expected: identifier after ','"),
        ("a,,b", "found ',', expected: identifier after ','"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        (
            "a<=5",
            "unable to parse requirement: found '=', expected: identifier",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(label_error(text), *want, "{text:?}");
    }
}

// Key and value validation, util/validation/validation.go IsQualifiedName / IsValidLabelValue.
#[test]
fn label_keys_and_values_are_validated() {
    let name_regex = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let value_regex = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    let long = "a".repeat(64);
    let cases: Vec<(String, String)> = vec![
        ("app:web".into(), format!("unable to parse requirement: <nil>: Invalid value: \"app:web\": {name_regex}")),
        ("-app=x".into(), format!("unable to parse requirement: <nil>: Invalid value: \"-app\": {name_regex}")),
        ("app-=x".into(), format!("unable to parse requirement: <nil>: Invalid value: \"app-\": {name_regex}")),
        (
            "/app".into(),
            "unable to parse requirement: <nil>: Invalid value: \"/app\": prefix part must be non-empty".into(),
        ),
        (
            "example.com/".into(),
            format!("unable to parse requirement: <nil>: Invalid value: \"example.com/\": name part must be non-empty; {name_regex}"),
        ),
        (
            "Example.com/app".into(),
            "unable to parse requirement: <nil>: Invalid value: \"Example.com/app\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into(),
        ),
        (
            "a/b/c".into(),
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into(),
        ),
        (
            long.clone(),
            format!("unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters"),
        ),
        ("app=-web".into(), format!("unable to parse requirement: values[0][app]: Invalid value: \"-web\": {value_regex}")),
        ("app=web_".into(), format!("unable to parse requirement: values[0][app]: Invalid value: \"web_\": {value_regex}")),
        ("app=a/b".into(), format!("unable to parse requirement: values[0][app]: Invalid value: \"a/b\": {value_regex}")),
        (
            format!("app={long}"),
            format!("unable to parse requirement: values[0][app]: Invalid value: \"{long}\": must be no more than 63 characters"),
        ),
        (
            "app in (ok,b@d,-x)".into(),
            format!(
                "unable to parse requirement: [values[0][app]: Invalid value: \"-x\": {value_regex}, values[1][app]: Invalid value: \"b@d\": {value_regex}]"
            ),
        ),
        // Gt/Lt need an integer; a negative one is not a valid label value upstream either.
        (
            "x>abc".into(),
            "unable to parse requirement: values[0]: Invalid value: \"abc\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
        ),
        (
            "x<".into(),
            "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer".into(),
        ),
        ("x>-1".into(), format!("unable to parse requirement: values[0][x]: Invalid value: \"-1\": {value_regex}")),
    ];
    for (text, want) in &cases {
        assert_eq!(&label_error(text), want, "{text:?}");
    }
    // Limits are inclusive.
    let max = "a".repeat(63);
    assert!(LabelSelector::parse(&format!("{max}={max}")).is_ok());
    assert!(LabelSelector::parse(&format!("{}/{max}", "a".repeat(253))).is_ok());
    assert!(LabelSelector::parse(&format!("{}/{max}", "a".repeat(254))).is_err());
    assert!(matches!(
        LabelSelector::parse("a b"),
        Err(SelectorError::InvalidLabelSelector(_))
    ));
}

// The lexer treats a NUL byte as the end of input, as upstream's `read` returns 0 there.
#[test]
fn label_nul_ends_input() {
    let selector = LabelSelector::parse("a \u{0} garbage(").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(selector.to_string(), "a");
}

#[test]
fn label_matches_object_reads_metadata_labels() {
    let selector = LabelSelector::parse("app=web,!gone").unwrap_or_else(|e| panic!("{e}"));
    assert!(selector.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
    assert!(!selector.matches_object(&json!({"metadata": {"labels": {"app": "web", "gone": ""}}})));
    assert!(!selector.matches_object(&json!({"metadata": {"name": "x"}})));
    assert!(!selector.matches_object(&json!({"metadata": {"labels": {"app": 1}}})));
    let not_in = LabelSelector::parse("app notin (web)").unwrap_or_else(|e| panic!("{e}"));
    assert!(not_in.matches_object(&json!({"metadata": {}})));
    assert!(not_in.matches_object(&json!({})));
    assert!(LabelSelector::everything().matches_object(&json!(null)));
}
