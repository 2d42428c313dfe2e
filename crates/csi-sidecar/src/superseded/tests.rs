use super::*;
use k8s_openapi::api::core::v1::ConfigMap;

fn at(version: &str) -> ConfigMap {
    let mut object = ConfigMap::default();
    object.metadata.resource_version = Some(version.into());
    object
}

#[test]
fn a_replaced_version_is_stale_until_the_cache_moves_past_it() {
    let superseded = Superseded::default();
    superseded.wrote("a", &at("1"), &at("2"));
    assert!(superseded.is_stale(&"a", Some("1")));
    assert!(superseded.contains(&"a", Some("1")));
    assert!(!superseded.is_stale(&"a", Some("2")));
    assert!(
        !superseded.contains(&"a", Some("1")),
        "moving past forgets the replaced versions"
    );
}

#[test]
fn a_no_op_write_supersedes_nothing() {
    let superseded = Superseded::default();
    superseded.wrote("a", &at("1"), &at("1"));
    assert!(!superseded.is_stale(&"a", Some("1")));
    superseded.supersede("b", &at("7"));
    superseded.forget(&"b");
    assert!(!superseded.is_stale(&"b", Some("7")));
}

/// What the watch brings after a write, as the informer callback reports it.
enum Step {
    Watch(&'static str),
    Relist,
    /// A relist begun before the write: it shows the copy the write replaced.
    EarlyRelist(&'static str),
    Gone,
}

/// A write built from `from`, answered with `answer` (`None`: the object was gone), with
/// `before` delivered by the watch while it was under way and `after` once answered; then
/// whether a sync reading the cache at `cached` would miss the write.
fn lags(
    from: &str,
    answer: Option<&str>,
    before: &[&'static str],
    after: &[Step],
    cached: &str,
) -> bool {
    let superseded = Superseded::default();
    let write = superseded.writing("claim", &at(from));
    for version in before {
        superseded.observed(&"claim", Some(version), Observed::Changed);
    }
    write.answered(answer.map(at).as_ref());
    for step in after {
        match step {
            Step::Watch(version) => superseded.observed(&"claim", Some(version), Observed::Changed),
            Step::Relist => superseded.observed(&"claim", Some(cached), Observed::Listed),
            Step::EarlyRelist(version) => {
                superseded.observed(&"claim", Some(version), Observed::Listed);
            }
            Step::Gone => superseded.observed(&"claim", None, Observed::Deleted),
        }
    }
    superseded.lags(&"claim", true, Some(cached))
}

/// A write and what followed it: built from `from`, answered with `answer`, the watch
/// bringing `before` while it was under way and `after` once answered; whether a sync reading
/// the cache at `cached` `lags`.
struct Row {
    what: &'static str,
    from: &'static str,
    answer: Option<&'static str>,
    before: &'static [&'static str],
    after: &'static [Step],
    cached: &'static str,
    lags: bool,
}

#[test]
fn a_cache_lags_a_write_until_the_watch_brings_the_answer() {
    use Step::*;
    let row = |what, from, answer, before, after, cached, lags| Row {
        what,
        from,
        answer,
        before,
        after,
        cached,
        lags,
    };
    let rows = [
        row(
            "the copy the write was built from",
            "7",
            Some("9"),
            &[],
            &[],
            "7",
            true,
        ),
        row(
            "a version in between: kube-controller-manager bound the claim",
            "7",
            Some("9"),
            &[],
            &[Watch("8")],
            "8",
            true,
        ),
        row(
            "the answer brought",
            "7",
            Some("9"),
            &[],
            &[Watch("8"), Watch("9")],
            "9",
            false,
        ),
        row(
            "a version after the answer",
            "7",
            Some("9"),
            &[],
            &[Watch("9"), Watch("12")],
            "12",
            false,
        ),
        row(
            "opaque versions in between",
            "a",
            Some("c"),
            &[],
            &[Watch("b")],
            "b",
            true,
        ),
        row(
            "opaque versions, the answer brought",
            "a",
            Some("c"),
            &[],
            &[Watch("b"), Watch("c")],
            "c",
            false,
        ),
        row(
            "the watch ahead of the response",
            "7",
            Some("9"),
            &["8", "9"],
            &[],
            "9",
            false,
        ),
        row(
            "the watch ahead of the response, then more",
            "7",
            Some("9"),
            &["9", "10"],
            &[],
            "10",
            false,
        ),
        row(
            "a relist shows the object as it is",
            "7",
            Some("9"),
            &[],
            &[Relist],
            "12",
            false,
        ),
        row(
            "a relist begun before the write",
            "7",
            Some("9"),
            &[],
            &[EarlyRelist("7")],
            "7",
            true,
        ),
        row(
            "a relist begun before the write, then the answer",
            "7",
            Some("9"),
            &[],
            &[EarlyRelist("7"), Watch("9")],
            "9",
            false,
        ),
        row(
            "gone and listed again",
            "7",
            Some("9"),
            &[],
            &[Gone],
            "7",
            false,
        ),
        row("a no-op write", "7", Some("7"), &[], &[], "7", false),
        row(
            "the object was gone: its old copy only",
            "7",
            None,
            &[],
            &[],
            "7",
            true,
        ),
        row(
            "the object was gone: another version",
            "7",
            None,
            &[],
            &[],
            "8",
            false,
        ),
    ];
    for r in rows {
        assert_eq!(
            lags(r.from, r.answer, r.before, r.after, r.cached),
            r.lags,
            "{}",
            r.what
        );
    }
}

#[test]
fn a_failed_write_leaves_no_trace() {
    let superseded = Superseded::default();
    drop(superseded.writing("claim", &at("7")));
    assert!(!superseded.lags(&"claim", true, Some("7")));
    assert!(lock(&superseded.entries).is_empty());
}

#[test]
fn caught_up_keys_are_forgotten() {
    let superseded = Superseded::default();
    superseded
        .writing("claim", &at("7"))
        .answered(Some(&at("9")));
    superseded.observed(&"claim", Some("9"), Observed::Changed);
    assert!(!superseded.lags(&"claim", true, Some("9")));
    assert!(lock(&superseded.entries).is_empty());
}

#[test]
fn created_and_deleted_objects_lag_until_the_cache_shows_them() {
    let superseded = Superseded::default();
    superseded.created("pv-a");
    assert!(superseded.lags(&"pv-a", false, None), "not cached yet");
    assert!(!superseded.lags(&"pv-a", true, Some("3")), "cached");
    assert!(lock(&superseded.entries).is_empty());
    superseded.deleted("pv-b");
    assert!(superseded.lags(&"pv-b", true, Some("4")), "still cached");
    assert!(!superseded.lags(&"pv-b", false, None), "gone");
}

#[test]
fn keys_the_cache_caught_up_with_are_forgotten_in_one_sweep() {
    let superseded = Superseded::default();
    superseded.created("created, cached");
    superseded.created("created, not cached");
    superseded.deleted("deleted, gone");
    superseded
        .writing("written, answer not brought", &at("7"))
        .answered(Some(&at("9")));
    superseded
        .writing("written, object gone", &at("7"))
        .answered(Some(&at("9")));
    superseded.forget_caught_up(|key| match *key {
        "created, cached" => Some(Some("1".to_string())),
        "written, answer not brought" => Some(Some("8".to_string())),
        _ => None,
    });
    let mut left: Vec<_> = lock(&superseded.entries).keys().copied().collect();
    left.sort_unstable();
    assert_eq!(left, ["created, not cached", "written, answer not brought"]);
}
