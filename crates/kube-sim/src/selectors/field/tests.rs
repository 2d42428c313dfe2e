use serde_json::json;

use super::*;
use crate::selectors::labels;

/// (selector, parsed terms, canonical form)
type FieldParseCase = (
    &'static str,
    &'static [(&'static str, FieldOperator, &'static str)],
    &'static str,
);

fn field_error(text: &str) -> String {
    match FieldSelector::parse(text) {
        Ok(s) => panic!("{text:?} parsed as {s:?}, expected an error"),
        Err(e) => e.to_string(),
    }
}

// fields/selector.go: parse, escaping and canonical form.
#[test]
fn field_parse_and_escaping() {
    let cases: &[FieldParseCase] = &[
        ("", &[], ""),
        (",", &[], ""),
        (
            "metadata.name=a",
            &[("metadata.name", FieldOperator::Equals, "a")],
            "metadata.name=a",
        ),
        (
            "metadata.name==a",
            &[("metadata.name", FieldOperator::DoubleEquals, "a")],
            "metadata.name=a",
        ),
        (
            "metadata.name!=a",
            &[("metadata.name", FieldOperator::NotEquals, "a")],
            "metadata.name!=a",
        ),
        (
            "spec.nodeName=",
            &[("spec.nodeName", FieldOperator::Equals, "")],
            "spec.nodeName=",
        ),
        (
            "b=2,a!=1",
            &[
                ("a", FieldOperator::NotEquals, "1"),
                ("b", FieldOperator::Equals, "2"),
            ],
            "a!=1,b=2",
        ),
        ("a=x\\,y", &[("a", FieldOperator::Equals, "x,y")], "a=x\\,y"),
        ("a=x\\=y", &[("a", FieldOperator::Equals, "x=y")], "a=x\\=y"),
        (
            "a=x\\\\y",
            &[("a", FieldOperator::Equals, "x\\y")],
            "a=x\\\\y",
        ),
        (
            "a=x\\,y,b=z",
            &[
                ("a", FieldOperator::Equals, "x,y"),
                ("b", FieldOperator::Equals, "z"),
            ],
            "a=x\\,y,b=z",
        ),
        // no whitespace trimming: the space belongs to the field and the value
        ("a = b", &[("a ", FieldOperator::Equals, " b")], "a = b"),
        // the first operator wins, `!=` before `==` before `=`
        (
            "a!=\\=b",
            &[("a", FieldOperator::NotEquals, "=b")],
            "a!=\\=b",
        ),
        (
            "a==\\=b",
            &[("a", FieldOperator::DoubleEquals, "=b")],
            "a=\\=b",
        ),
        ("=x", &[("", FieldOperator::Equals, "x")], "=x"),
    ];
    for (text, want, canonical) in cases {
        let selector = FieldSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let got: Vec<(&str, FieldOperator, &str)> = selector
            .requirements()
            .iter()
            .map(|r| (r.field.as_str(), r.operator, r.value.as_str()))
            .collect();
        assert_eq!(got.as_slice(), *want, "{text:?}");
        assert_eq!(selector.to_string(), *canonical, "{text:?}");
    }
}

#[test]
fn field_syntax_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "metadata.name",
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'",
        ),
        ("a=b,c", "invalid selector: 'a=b,c'; can't understand 'c'"),
        (", ", "invalid selector: ', '; can't understand ' '"),
        (
            "a=b=c",
            "invalid field selector: unescaped character in value: =",
        ),
        // `!=` is found first, leaving a bare `=` in the value
        (
            "a!==b",
            "invalid field selector: unescaped character in value: =",
        ),
        (
            "a=b\\x",
            "invalid field selector: invalid escape sequence: \\x",
        ),
        (
            "a=b\\",
            "invalid field selector: invalid escape sequence: \\",
        ),
        ("a>b", "invalid selector: 'a>b'; can't understand 'a>b'"),
        (
            "a in (b)",
            "invalid selector: 'a in (b)'; can't understand 'a in (b)'",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(field_error(text), *want, "{text:?}");
    }
    assert!(matches!(
        FieldSelector::parse("x"),
        Err(SelectorError::InvalidFieldSelector(_))
    ));
}

// The scheme's field label conversions (pkg/apis/core/v1/conversion.go and friends).
#[test]
fn field_labels_per_kind() {
    let default_msg = |f: &str| {
        format!(
            "\"{f}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    };
    let ok: &[(&str, &str)] = &[
        ("Pod", "metadata.name=a,metadata.namespace=b"),
        (
            "Pod",
            "spec.nodeName=n,spec.restartPolicy=Always,spec.schedulerName=s,spec.serviceAccountName=sa,spec.hostNetwork=true",
        ),
        (
            "Pod",
            "status.phase=Running,status.podIP=10.0.0.1,status.podIPs=x,status.nominatedNodeName=n",
        ),
        ("Pod", "spec.host=n"),
        ("Node", "metadata.name=n,spec.unschedulable=false"),
        ("Namespace", "metadata.name=n,status.phase=Active"),
        (
            "Secret",
            "metadata.name=s,metadata.namespace=ns,type=Opaque",
        ),
        (
            "Event",
            "involvedObject.kind=Pod,involvedObject.namespace=ns,involvedObject.name=p,involvedObject.uid=u",
        ),
        (
            "Event",
            "involvedObject.apiVersion=v1,involvedObject.resourceVersion=1,involvedObject.fieldPath=f",
        ),
        (
            "Event",
            "reason=r,reportingComponent=c,source=s,type=Normal,metadata.name=e,metadata.namespace=ns",
        ),
        (
            "Event.events.k8s.io",
            "regarding.kind=Pod,regarding.name=p,regarding.namespace=ns,regarding.uid=u",
        ),
        (
            "Event.events.k8s.io",
            "regarding.apiVersion=v1,regarding.resourceVersion=1,regarding.fieldPath=f",
        ),
        (
            "Event.events.k8s.io",
            "reason=r,reportingController=c,source=s,type=Warning,metadata.name=e",
        ),
        (
            "PersistentVolumeClaim",
            "metadata.name=a,metadata.namespace=b",
        ),
        ("PersistentVolume", "metadata.name=a,metadata.namespace="),
        ("ConfigMap", "metadata.name=a"),
        ("VolumeAttachment.storage.k8s.io", "metadata.name=a"),
        ("Lease.coordination.k8s.io", "metadata.namespace=a"),
        ("Pod", ""),
    ];
    for (kind, text) in ok {
        let selector = FieldSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(selector.validate_for(kind), Ok(()), "{kind} {text:?}");
    }
    let rejected: Vec<(&str, &str, String)> = vec![
        (
            "Pod",
            "spec.containers=x",
            "field label not supported: spec.containers".into(),
        ),
        (
            "Pod",
            "metadata.labels=x",
            "field label not supported: metadata.labels".into(),
        ),
        ("Pod", "a = b", "field label not supported: a ".into()),
        ("Pod", "=x", "field label not supported: ".into()),
        (
            "Node",
            "metadata.namespace=x",
            "field label not supported: metadata.namespace".into(),
        ),
        (
            "Node",
            "spec.podCIDR=x",
            "field label not supported: spec.podCIDR".into(),
        ),
        (
            "Namespace",
            "metadata.namespace=x",
            "field label not supported: metadata.namespace".into(),
        ),
        (
            "Secret",
            "data.x=y",
            "field label not supported: data.x".into(),
        ),
        (
            "Event",
            "regarding.name=x",
            "field label not supported: regarding.name".into(),
        ),
        ("Event", "note=x", "field label not supported: note".into()),
        (
            "Event.events.k8s.io",
            "involvedObject.name=x",
            "field label not supported: involvedObject.name".into(),
        ),
        (
            "Event.events.k8s.io",
            "reportingComponent=x",
            "field label not supported: reportingComponent".into(),
        ),
        (
            "PersistentVolumeClaim",
            "spec.volumeName=x",
            default_msg("spec.volumeName"),
        ),
        (
            "PersistentVolume",
            "spec.claimRef.name=x",
            default_msg("spec.claimRef.name"),
        ),
        (
            "Pod.example.com",
            "spec.nodeName=x",
            default_msg("spec.nodeName"),
        ),
        // upstream evaluates the sorted terms; the first bad one is reported
        (
            "Pod",
            "z.b=1,a.b=1",
            "field label not supported: a.b".into(),
        ),
    ];
    for (kind, text, want) in &rejected {
        let selector = FieldSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        match selector.validate_for(kind) {
            Ok(()) => panic!("{kind} {text:?} accepted"),
            Err(e) => {
                assert_eq!(&e.to_string(), want, "{kind} {text:?}");
                assert!(matches!(e, SelectorError::FieldLabelNotSupported { .. }));
            }
        }
    }
}

// apiextensions-apiserver conversion/converter.go: name, namespace when namespaced,
// selectableFields.
#[test]
fn field_labels_for_custom_resources() {
    let parse = |t: &str| FieldSelector::parse(t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
    let fields = [".spec.color", "spec.size"];
    assert_eq!(
        parse("metadata.name=a,metadata.namespace=b").validate_for_custom_resource(true, &[]),
        Ok(())
    );
    assert_eq!(
        parse("spec.color=red,spec.size=3").validate_for_custom_resource(false, &fields),
        Ok(())
    );
    let cluster = parse("metadata.namespace=b").validate_for_custom_resource(false, &fields);
    assert_eq!(
        cluster.map_err(|e| e.to_string()),
        Err("field label not supported: metadata.namespace".to_owned())
    );
    let other = parse("spec.shape=x").validate_for_custom_resource(true, &fields);
    assert_eq!(
        other.map_err(|e| e.to_string()),
        Err("field label not supported: spec.shape".to_owned())
    );

    let widget =
        json!({"metadata": {"name": "w"}, "spec": {"color": "red", "size": 3, "round": true}});
    let kind = qualified_kind("example.com", "Widget");
    assert!(parse("spec.color=red,spec.size=3").matches_object(&kind, &widget));
    assert!(parse("spec.round=true,metadata.name=w").matches_object(&kind, &widget));
    assert!(!parse("spec.color=blue").matches_object(&kind, &widget));
    assert!(parse("spec.missing=").matches_object(&kind, &widget));
}

fn pod(spec: Value, status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec, "status": status})
}

// The registry field sets (pkg/registry/core/*/strategy.go, pkg/apis/events/selection.go).
#[test]
fn field_matching_per_kind() {
    let scheduled = pod(
        json!({"nodeName": "node-1", "restartPolicy": "Always", "schedulerName": "default-scheduler", "serviceAccountName": "sa", "hostNetwork": true}),
        json!({"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}], "nominatedNodeName": "node-2"}),
    );
    let unscheduled = pod(
        json!({"serviceAccount": "legacy"}),
        json!({"phase": "Pending"}),
    );
    let only_pod_ips = pod(
        json!({}),
        json!({"podIPs": [{"ip": "fd00::7"}, {"ip": "10.0.0.7"}]}),
    );
    let differing_ips = pod(
        json!({}),
        json!({"podIP": "10.0.0.8", "podIPs": [{"ip": "10.0.0.9"}]}),
    );
    let node = json!({"kind": "Node", "metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
    let plain_node = json!({"kind": "Node", "metadata": {"name": "n2"}, "spec": {}});
    let namespace = json!({"metadata": {"name": "ns"}, "status": {"phase": "Terminating"}});
    let secret = json!({"metadata": {"name": "s", "namespace": "ns"}, "type": "kubernetes.io/tls"});
    let core_event = json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ns"},
        "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "u-1", "apiVersion": "v1", "resourceVersion": "42", "fieldPath": "spec.containers{c}"},
        "reason": "Scheduled", "type": "Normal", "source": {"component": "scheduler"}, "reportingComponent": "sched-rc",
    });
    let reported_event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e2"}, "reportingComponent": "csi-attacher"});
    let events_event = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e3", "namespace": "ns"},
        "regarding": {"kind": "PersistentVolumeClaim", "name": "pvc", "namespace": "ns", "uid": "u-2"},
        "reason": "Provisioning", "type": "Normal", "reportingController": "csi-provisioner",
    });
    let pvc =
        json!({"metadata": {"name": "claim", "namespace": "ns"}, "spec": {"volumeName": "pv-1"}});
    let pv = json!({"metadata": {"name": "pv-1"}});

    let cases: &[(&str, &str, &Value, bool)] = &[
        ("Pod", "spec.nodeName=node-1", &scheduled, true),
        ("Pod", "spec.nodeName=node-1", &unscheduled, false),
        // unset string fields compare as "": `spec.nodeName=` selects unscheduled pods
        ("Pod", "spec.nodeName=", &unscheduled, true),
        ("Pod", "spec.nodeName=", &scheduled, false),
        ("Pod", "spec.nodeName!=", &scheduled, true),
        ("Pod", "spec.nodeName!=", &unscheduled, false),
        ("Pod", "spec.host=node-1", &scheduled, true),
        (
            "Pod",
            "spec.restartPolicy=Always,spec.schedulerName=default-scheduler",
            &scheduled,
            true,
        ),
        ("Pod", "spec.serviceAccountName=sa", &scheduled, true),
        ("Pod", "spec.serviceAccountName=legacy", &unscheduled, true),
        ("Pod", "spec.hostNetwork=true", &scheduled, true),
        ("Pod", "spec.hostNetwork=false", &unscheduled, true),
        ("Pod", "spec.hostNetwork=", &unscheduled, false),
        ("Pod", "status.phase=Running", &scheduled, true),
        ("Pod", "status.phase!=Running", &unscheduled, true),
        ("Pod", "status.podIP=10.0.0.5", &scheduled, true),
        ("Pod", "status.podIP=", &unscheduled, true),
        ("Pod", "status.podIP=fd00::7", &only_pod_ips, true),
        ("Pod", "status.podIP=10.0.0.8", &differing_ips, true),
        ("Pod", "status.podIPs=", &scheduled, true),
        ("Pod", "status.nominatedNodeName=node-2", &scheduled, true),
        (
            "Pod",
            "metadata.name=p,metadata.namespace=ns",
            &scheduled,
            true,
        ),
        ("Pod", "metadata.namespace==other", &scheduled, false),
        ("Node", "spec.unschedulable=true", &node, true),
        ("Node", "spec.unschedulable=false", &node, false),
        ("Node", "spec.unschedulable=false", &plain_node, true),
        ("Node", "metadata.name!=n1", &plain_node, true),
        ("Namespace", "status.phase=Terminating", &namespace, true),
        ("Namespace", "status.phase=Active", &namespace, false),
        ("Secret", "type=kubernetes.io/tls", &secret, true),
        (
            "Secret",
            "type!=Opaque,metadata.namespace=ns",
            &secret,
            true,
        ),
        (
            "Event",
            "involvedObject.kind=Pod,involvedObject.name=p,involvedObject.namespace=ns,involvedObject.uid=u-1",
            &core_event,
            true,
        ),
        (
            "Event",
            "involvedObject.apiVersion=v1,involvedObject.resourceVersion=42,involvedObject.fieldPath=spec.containers{c}",
            &core_event,
            true,
        ),
        (
            "Event",
            "reason=Scheduled,type=Normal,reportingComponent=sched-rc",
            &core_event,
            true,
        ),
        ("Event", "source=scheduler", &core_event, true),
        // `source` falls back to the reporting controller
        ("Event", "source=csi-attacher", &reported_event, true),
        ("Event", "involvedObject.name=", &reported_event, true),
        (
            "Event.events.k8s.io",
            "regarding.kind=PersistentVolumeClaim,regarding.name=pvc",
            &events_event,
            true,
        ),
        (
            "Event.events.k8s.io",
            "reportingController=csi-provisioner,source=csi-provisioner",
            &events_event,
            true,
        ),
        (
            "Event.events.k8s.io",
            "regarding.name=pvc",
            &core_event,
            false,
        ),
        (
            "Event.events.k8s.io",
            "regarding.name=p,source=scheduler",
            &core_event,
            true,
        ),
        (
            "Event",
            "involvedObject.uid=u-2,reportingComponent=csi-provisioner",
            &events_event,
            true,
        ),
        ("PersistentVolumeClaim", "metadata.name=claim", &pvc, true),
        (
            "PersistentVolume",
            "metadata.name=pv-1,metadata.namespace=",
            &pv,
            true,
        ),
        ("PersistentVolume", "metadata.namespace=ns", &pv, false),
        ("Pod", "", &scheduled, true),
    ];
    for (kind, text, object, want) in cases {
        let selector = FieldSelector::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(selector.validate_for(kind), Ok(()), "{kind} {text:?}");
        assert_eq!(
            selector.matches_object(kind, object),
            *want,
            "{kind} {text:?} against {object}"
        );
    }
}

#[test]
fn field_escaped_values_match_and_precomputed_sets() {
    let selector =
        FieldSelector::parse("metadata.name=a\\,b\\=c\\\\d").unwrap_or_else(|e| panic!("{e}"));
    assert!(selector.matches_object("ConfigMap", &json!({"metadata": {"name": "a,b=c\\d"}})));
    assert!(!selector.matches_object("ConfigMap", &json!({"metadata": {"name": "a,b=c"}})));
    let fields = labels(&[("metadata.name", "a,b=c\\d")]);
    assert!(selector.matches_fields(&fields));
    assert!(
        FieldSelector::parse("spec.nodeName=").is_ok_and(|s| s.matches_fields(&BTreeMap::new()))
    );
    assert_eq!(
        selector.requires_exact_match("metadata.name"),
        Some("a,b=c\\d")
    );
    let not_equal = FieldSelector::parse("metadata.name!=x").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(not_equal.requires_exact_match("metadata.name"), None);
    assert!(FieldSelector::everything().matches_object("Pod", &json!({})));
    assert_eq!(qualified_kind("", "Pod"), "Pod");
    assert_eq!(
        qualified_kind("events.k8s.io", "Event"),
        "Event.events.k8s.io"
    );
}
