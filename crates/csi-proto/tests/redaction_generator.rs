//! Exercises the build script's `Debug` generator on the hidden fixture protos
//! (`fixtures/redaction_fixture.proto`). These use field kinds that CSI itself doesn't have
//! today (enums, optionals, oneofs, nested types, secrets of every shape).

use std::collections::{BTreeSet, HashMap};

use csi_proto::redaction_fixture::{self as fx, Color};

/// Builds a `Plain` or `Mirror` (same fields, except `Mirror` has one secret) with every field
/// set. Maps have one entry each so their iteration order is deterministic.
macro_rules! populated {
    ($module:ident :: $ty:ident) => {
        fx::$ty {
            r#type: "kind-1".to_owned(),
            color: Color::Red as i32,
            maybe_color: Some(Color::Green as i32),
            colors: vec![Color::Red as i32, 99, Color::Unspecified as i32],
            color_by_name: HashMap::from([("leaf".to_owned(), Color::Green as i32)]),
            blob: vec![1, 2, 3],
            maybe_text: Some("hello".to_owned()),
            capability: Some(csi_proto::csi::v1::VolumeCapability {
                access_type: Some(csi_proto::csi::v1::volume_capability::AccessType::Block(
                    Default::default(),
                )),
                access_mode: Some(csi_proto::csi::v1::volume_capability::AccessMode { mode: 5 }),
            }),
            inner: Some(fx::$module::Inner {
                shade: fx::$module::inner::Shade::Dark as i32,
                note: "n".to_owned(),
            }),
            shade: fx::$module::inner::Shade::Light as i32,
            inners: vec![
                fx::$module::Inner::default(),
                fx::$module::Inner {
                    shade: 42,
                    note: String::new(),
                },
            ],
            by_number: HashMap::from([(7, "seven".to_owned())]),
            ..Default::default()
        }
    };
}

/// `Mirror`'s generated `Debug` must print its non-secret fields exactly like prost's derived
/// `Debug` prints the same fields of `Plain`.
#[test]
fn generated_debug_matches_prost_derive() {
    let choices: [(Option<fx::plain::Choice>, Option<fx::mirror::Choice>); 5] = [
        (None, None),
        (
            Some(fx::plain::Choice::Text("t".to_owned())),
            Some(fx::mirror::Choice::Text("t".to_owned())),
        ),
        (
            Some(fx::plain::Choice::Picked(Color::Green as i32)),
            Some(fx::mirror::Choice::Picked(Color::Green as i32)),
        ),
        (
            Some(fx::plain::Choice::Picked(1234)),
            Some(fx::mirror::Choice::Picked(1234)),
        ),
        (
            Some(fx::plain::Choice::Nested(fx::plain::Inner {
                shade: 1,
                note: "deep".to_owned(),
            })),
            Some(fx::mirror::Choice::Nested(fx::mirror::Inner {
                shade: 1,
                note: "deep".to_owned(),
            })),
        ),
    ];
    for (plain_choice, mirror_choice) in choices {
        let mut plain = populated!(plain::Plain);
        plain.choice = plain_choice;
        let mut mirror = populated!(mirror::Mirror);
        mirror.choice = mirror_choice;
        mirror.zz_secrets = HashMap::from([("password".to_owned(), "s3cr3t".to_owned())]);

        let expected = format!("{plain:?}")
            .replacen("Plain {", "Mirror {", 1)
            .replacen(", choice: ", ", zz_secrets: <redacted 1 key>, choice: ", 1);
        assert_eq!(format!("{mirror:?}"), expected);

        let expected_pretty = format!("{plain:#?}")
            .replacen("Plain {", "Mirror {", 1)
            .replacen(
                "\n    choice: ",
                "\n    zz_secrets: <redacted 1 key>,\n    choice: ",
                1,
            );
        assert_eq!(format!("{mirror:#?}"), expected_pretty);

        // Defaults too (empty oneof, zero enums, None optionals).
        let expected_default = format!("{:?}", fx::Plain::default())
            .replacen("Plain {", "Mirror {", 1)
            .replacen(", choice: ", ", zz_secrets: <redacted 0 keys>, choice: ", 1);
        assert_eq!(format!("{:?}", fx::Mirror::default()), expected_default);
    }
}

#[test]
fn every_secret_shape_is_redacted() {
    let message = fx::AllSecretKinds {
        name: "visible-name".to_owned(),
        map_secret: HashMap::from([
            ("k1-s3cr3t".to_owned(), "v1-s3cr3t".to_owned()),
            ("k2-s3cr3t".to_owned(), "v2-s3cr3t".to_owned()),
        ]),
        string_secret: "s3cr3t".to_owned(),
        bytes_secret: b"s3cr3t".to_vec(),
        list_secret: vec!["s3cr3t".to_owned()],
        optional_secret: Some("s3cr3t".to_owned()),
        message_secret: Some(fx::all_secret_kinds::Holder {
            label: "s3cr3t".to_owned(),
            pin: "s3cr3t".to_owned(),
        }),
        number_secret: 31337,
        enum_secret: Color::Green as i32,
        holder: Some(fx::all_secret_kinds::Holder {
            label: "visible-label".to_owned(),
            pin: "s3cr3t".to_owned(),
        }),
        credential: Some(fx::all_secret_kinds::Credential::Password(
            "s3cr3t".to_owned(),
        )),
    };
    let compact = format!("{message:?}");
    assert_eq!(
        compact,
        "AllSecretKinds { name: \"visible-name\", map_secret: <redacted 2 keys>, \
         string_secret: <redacted>, bytes_secret: <redacted>, list_secret: <redacted 1 item>, \
         optional_secret: <redacted>, message_secret: <redacted>, number_secret: <redacted>, \
         enum_secret: <redacted>, holder: Some(Holder { label: \"visible-label\", pin: <redacted> }), \
         credential: Some(Password(<redacted>)) }"
    );
    let pretty = format!("{message:#?}");
    for rendered in [&compact, &pretty] {
        for leaked in ["s3cr3t", "31337", "Green", "115, 51"] {
            assert!(!rendered.contains(leaked), "{leaked} leaked: {rendered}");
        }
    }

    // Empty secrets say so, without a value.
    let empty = fx::AllSecretKinds {
        credential: Some(fx::all_secret_kinds::Credential::Username(
            "visible-user".to_owned(),
        )),
        ..Default::default()
    };
    assert_eq!(
        format!("{empty:?}"),
        "AllSecretKinds { name: \"\", map_secret: <redacted 0 keys>, string_secret: <empty>, \
         bytes_secret: <empty>, list_secret: <redacted 0 items>, optional_secret: <empty>, \
         message_secret: <empty>, number_secret: <redacted>, enum_secret: <redacted>, \
         holder: None, credential: Some(Username(\"visible-user\")) }"
    );
}

#[test]
fn fixture_secret_bearing_messages() {
    let declared: BTreeSet<&str> = fx::SECRET_BEARING_MESSAGES.iter().copied().collect();
    let expected = BTreeSet::from([
        "redaction_fixture.AllSecretKinds",
        "redaction_fixture.AllSecretKinds.Holder",
        "redaction_fixture.Mirror",
    ]);
    assert_eq!(declared, expected);
    // Fixtures stay out of the public list.
    assert!(
        csi_proto::SECRET_BEARING_MESSAGES
            .iter()
            .all(|name| !name.starts_with("redaction_fixture."))
    );
}
