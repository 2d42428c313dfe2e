//! Compiles the workspace's `.proto` files with protox (pure Rust, no `protoc`) and generates
//! prost messages plus tonic clients and servers.
//!
//! It also generates the `Debug` impls that keep secrets out of logs. Any message with a field
//! marked `[(csi.v1.csi_secret) = true]` (a `FieldOptions` extension, number 1059) or
//! `[(cosi.v1alpha1.cosi_secret) = true]` (number 1115), or with a field named in
//! `SECRET_FIELD_NAMES` (APIs whose published proto has no secret option), is handed to
//! prost's `skip_debug`. This file then writes a `Debug` impl for it that prints like prost's
//! derive would, except that secret fields show only a `<redacted ...>` marker.
//!
//! prost's `skip_debug` matches by path prefix, so it also drops `Debug` from every nested
//! message, enum and oneof of such a message. We generate impls for all of those too, the same
//! way, and so cover exactly the set prost skipped.
//!
//! The generated impls assume that the code for proto package `a.b` is included at
//! `crate::a::b` (see `src/lib.rs`).
//!
//! With the `v1-12` feature it also compiles the published CSI v1.12.0 proto
//! (`proto/csi/v1.12/csi.proto`), messages only, into `OUT_DIR/v1_12/`, for the module
//! `crate::csi::v1_12`. It is a second, separate protox compile because both files are proto
//! package `csi.v1`: one descriptor pool cannot hold both. Its redacting `Debug` impls are
//! generated the same way, with `csi.v1` paths pointing at `crate::csi::v1_12`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, EnumDescriptor, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    Value,
};

/// The wire APIs, relative to the workspace `proto/` directory.
const PROTOS: &[&str] = &[
    "csi/v1/csi.proto",
    "pluginregistration/v1/api.proto",
    "podmon/v1/podmon.proto",
    "cosi/v1alpha1/cosi.proto",
    "snapshotmetadata/schema.proto",
    "grpc/health/v1/health.proto",
];

/// Test-only protos, relative to this crate's `fixtures/` directory. They are compiled into the
/// hidden `redaction_fixture` module and kept out of `FILE_DESCRIPTOR_SET` and
/// `SECRET_BEARING_MESSAGES`.
const FIXTURE_PROTOS: &[&str] = &["redaction_fixture.proto"];

/// The options that mark a field as secret, and the numbers the CSI and COSI specs give them.
/// The CSI one comes first: the legacy compile has only the CSI proto.
const SECRET_OPTIONS: &[(&str, u32)] = &[
    ("csi.v1.csi_secret", 1059),
    ("cosi.v1alpha1.cosi_secret", 1115),
];

/// Secret fields of protos that have no secret option, by full protobuf name. The Kubernetes
/// SnapshotMetadata API carries the caller's service account token; its published
/// `schema.proto` imports nothing, and marking the fields with `csi.v1.csi_secret` would make it
/// import `csi.proto` (a different descriptor, and a dependency every user of our copy would
/// have to carry) for no change on the wire. Naming them here leaves the file as published.
const SECRET_FIELD_NAMES: &[&str] = &[
    "snapshotmetadata.GetMetadataAllocatedRequest.security_token",
    "snapshotmetadata.GetMetadataDeltaRequest.security_token",
];

/// The published CSI v1.12.0 proto, relative to `proto/`; compiled only with the `v1-12` feature.
const LEGACY_CSI_PROTO: &str = "csi/v1.12/csi.proto";

/// Path of the generated helpers module (hand-written, `src/redact.rs`).
const HELPERS: &str = "crate::redact";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let proto_dir = manifest_dir.join("../../proto");
    let fixture_dir = manifest_dir.join("fixtures");
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    println!("cargo:rerun-if-changed={}", fixture_dir.display());

    let mut compiler = protox::Compiler::new([&proto_dir, &fixture_dir])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTOS.iter().chain(FIXTURE_PROTOS))?;
    let pool = compiler.descriptor_pool();
    let fds = compiler.file_descriptor_set();

    // The descriptor set we export: the wire APIs and their imports, without fixtures or
    // comments (source info), to keep the binary small.
    let mut public_fds = fds.clone();
    public_fds
        .file
        .retain(|file| !FIXTURE_PROTOS.contains(&file.name()));
    for file in &mut public_fds.file {
        file.source_code_info = None;
    }
    fs::write(
        out_dir.join("file_descriptor_set.bin"),
        public_fds.encode_to_vec(),
    )?;

    let redaction = Redaction::analyse(&pool, SECRET_OPTIONS, SECRET_FIELD_NAMES, None)?;
    redaction.write_debug(&pool, &out_dir)?;
    redaction.write_lists(&pool, &out_dir)?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(redaction.skip_debug_paths())
        .compile_fds(fds)?;

    if env::var_os("CARGO_FEATURE_V1_12").is_some() {
        compile_legacy_csi(&proto_dir, &out_dir)?;
    }
    Ok(())
}

/// CSI v1.12.0 messages (no clients or servers: a v1.13 service answers on the same method
/// paths, so only the message shapes of the old generation are needed) into `OUT_DIR/v1_12/`.
fn compile_legacy_csi(proto_dir: &Path, out_dir: &Path) -> Result<(), Box<dyn Error>> {
    let legacy_dir = out_dir.join("v1_12");
    fs::create_dir_all(&legacy_dir)?;
    let mut compiler = protox::Compiler::new([proto_dir])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files([LEGACY_CSI_PROTO])?;
    let pool = compiler.descriptor_pool();
    let redaction = Redaction::analyse(
        &pool,
        &SECRET_OPTIONS[..1],
        &[],
        Some(("csi.v1", "crate::csi::v1_12")),
    )?;
    redaction.write_debug(&pool, &legacy_dir)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .out_dir(&legacy_dir)
        .skip_debug(redaction.skip_debug_paths())
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// What has to be redacted, read from the descriptor pool.
struct Redaction {
    secret_options: Vec<ExtensionDescriptor>,
    /// Full names of fields that are secret without an option (`SECRET_FIELD_NAMES`).
    secret_fields: BTreeSet<String>,
    /// Full names of messages with at least one secret field (no leading dot).
    secret_bearing: BTreeSet<String>,
    /// A proto package whose code is included somewhere other than its default module, and
    /// that module's Rust path (`("csi.v1", "crate::csi::v1_12")` for the legacy compile).
    relocated: Option<(&'static str, &'static str)>,
}

impl Redaction {
    fn analyse(
        pool: &DescriptorPool,
        options: &[(&str, u32)],
        field_names: &[&str],
        relocated: Option<(&'static str, &'static str)>,
    ) -> Result<Self, Box<dyn Error>> {
        let mut secret_options = Vec::new();
        for (name, number) in options {
            let option = pool
                .get_extension_by_name(name)
                .ok_or_else(|| format!("extension {name} not found in the protos"))?;
            if option.containing_message().full_name() != "google.protobuf.FieldOptions"
                || option.number() != *number
                || option.kind() != Kind::Bool
            {
                return Err(format!(
                    "{name} must be `bool` on google.protobuf.FieldOptions with number {number}"
                )
                .into());
            }
            secret_options.push(option);
        }
        let mut secret_fields = BTreeSet::new();
        for name in field_names {
            // A renamed or mistyped field must fail the build, not silently stop redacting.
            let (message, field) = name
                .rsplit_once('.')
                .ok_or_else(|| format!("secret field name {name} has no message part"))?;
            let field = pool
                .get_message_by_name(message)
                .and_then(|m| m.get_field_by_name(field))
                .ok_or_else(|| format!("secret field {name} not found in the protos"))?;
            if !matches!(field.kind(), Kind::String | Kind::Bytes) || field.is_list() {
                return Err(
                    format!("secret field {name} must be a singular string or bytes").into(),
                );
            }
            secret_fields.insert((*name).to_owned());
        }
        let mut redaction = Redaction {
            secret_options,
            secret_fields,
            secret_bearing: BTreeSet::new(),
            relocated,
        };
        for message in pool.all_messages() {
            if message.fields().any(|field| redaction.is_secret(&field)) {
                if message.is_map_entry() {
                    return Err(format!(
                        "unexpected secret inside map entry {}",
                        message.full_name()
                    )
                    .into());
                }
                redaction
                    .secret_bearing
                    .insert(message.full_name().to_owned());
            }
        }
        Ok(redaction)
    }

    fn is_secret(&self, field: &FieldDescriptor) -> bool {
        if self.secret_fields.contains(field.full_name()) {
            return true;
        }
        let options = field.options();
        self.secret_options.iter().any(|option| {
            options.has_extension(option)
                && matches!(*options.get_extension(option), Value::Bool(true))
        })
    }

    /// Paths for prost's `skip_debug` (fully qualified, leading dot).
    fn skip_debug_paths(&self) -> Vec<String> {
        self.secret_bearing
            .iter()
            .map(|name| format!(".{name}"))
            .collect()
    }

    /// True if prost drops the derived `Debug` of this type: it is a secret-bearing message or
    /// nested (at any depth) inside one. This mirrors prost-build's prefix matching.
    fn debug_skipped(&self, full_name: &str) -> bool {
        self.secret_bearing.iter().any(|root| {
            full_name == root
                || full_name
                    .strip_prefix(root.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }

    /// Writes `<package>.debug.rs` for every package.
    fn write_debug(&self, pool: &DescriptorPool, out_dir: &Path) -> Result<(), Box<dyn Error>> {
        // One file per package (even when empty), so lib.rs can include them unconditionally.
        let mut per_package: BTreeMap<String, String> = pool
            .files()
            .filter(|file| !file.package_name().starts_with("google."))
            .map(|file| (file.package_name().to_owned(), String::new()))
            .collect();
        for message in pool.all_messages() {
            if message.is_map_entry() || !self.debug_skipped(message.full_name()) {
                continue;
            }
            let out = per_package
                .get_mut(message.package_name())
                .ok_or_else(|| format!("no output for package of {}", message.full_name()))?;
            self.message_debug(&message, out)?;
            self.oneof_debugs(&message, out)?;
        }
        for enumeration in pool.all_enums() {
            if self.debug_skipped(enumeration.full_name()) {
                let out = per_package
                    .get_mut(enumeration.package_name())
                    .ok_or_else(|| {
                        format!("no output for package of {}", enumeration.full_name())
                    })?;
                enum_debug(&enumeration, out)?;
            }
        }
        for (package, code) in &per_package {
            let header = "// @generated by csi-proto's build.rs: Debug impls that redact fields \
                          marked (csi.v1.csi_secret) or (cosi.v1alpha1.cosi_secret), or \
                          listed as secret by name.\n";
            fs::write(
                out_dir.join(format!("{package}.debug.rs")),
                format!("{header}{code}"),
            )?;
        }
        Ok(())
    }

    /// Writes the lists of secret-bearing messages and secret fields.
    fn write_lists(&self, pool: &DescriptorPool, out_dir: &Path) -> Result<(), Box<dyn Error>> {
        let fixture_packages: HashSet<String> = pool
            .files()
            .filter(|file| FIXTURE_PROTOS.contains(&file.name()))
            .map(|file| file.package_name().to_owned())
            .collect();
        let is_fixture = |name: &str| {
            pool.get_message_by_name(name)
                .is_some_and(|m| fixture_packages.contains(m.package_name()))
        };
        let (fixture, public): (Vec<&String>, Vec<&String>) = self
            .secret_bearing
            .iter()
            .partition(|name| is_fixture(name));
        fs::write(
            out_dir.join("secret_bearing_messages.rs"),
            str_slice(&public),
        )?;
        fs::write(
            out_dir.join("fixture_secret_bearing_messages.rs"),
            str_slice(&fixture),
        )?;

        let secret_fields: Vec<String> = public
            .iter()
            .filter_map(|name| pool.get_message_by_name(name))
            .flat_map(|m| {
                m.fields()
                    .filter(|f| self.is_secret(f))
                    .map(|f| f.full_name().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        fs::write(
            out_dir.join("secret_fields.rs"),
            str_slice(&secret_fields.iter().collect::<Vec<_>>()),
        )?;
        Ok(())
    }

    /// `impl Debug` for a message struct: fields in prost's struct order (plain fields in
    /// declaration order, then one entry per oneof), secrets redacted.
    fn message_debug(
        &self,
        message: &MessageDescriptor,
        out: &mut String,
    ) -> Result<(), Box<dyn Error>> {
        let struct_name = to_upper_camel(message.name());
        writeln!(
            out,
            "impl ::core::fmt::Debug for {} {{\n    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{\n        let mut builder = f.debug_struct({:?});",
            rel_path(message.full_name(), message.package_name()),
            struct_name,
        )?;
        for field in message.fields() {
            let proto = field.field_descriptor_proto();
            if proto.oneof_index.is_some() && !proto.proto3_optional() {
                continue; // printed with its oneof below
            }
            let ident = to_snake(field.name());
            let access = format!("self.{ident}");
            let value = if self.is_secret(&field) {
                redacted_field(&field, &access)?
            } else {
                self.plain_field(&field, &access)?
            };
            writeln!(out, "        builder.field({ident:?}, &{value});")?;
        }
        for oneof in message.oneofs().filter(|o| !o.is_synthetic()) {
            let ident = to_snake(oneof.name());
            writeln!(out, "        builder.field({ident:?}, &self.{ident});")?;
        }
        writeln!(out, "        builder.finish()\n    }}\n}}\n")?;
        Ok(())
    }

    /// `impl Debug` for each (non-synthetic) oneof enum of a skipped message, mirroring prost's
    /// `Variant(value)` tuple format.
    fn oneof_debugs(
        &self,
        message: &MessageDescriptor,
        out: &mut String,
    ) -> Result<(), Box<dyn Error>> {
        let proto = message.descriptor_proto();
        for oneof in message.oneofs().filter(|o| !o.is_synthetic()) {
            // prost appends `OneOf` when the oneof's type name collides with a nested type.
            let mut type_name = to_upper_camel(oneof.name());
            let collides = proto
                .nested_type
                .iter()
                .map(|t| t.name())
                .chain(proto.enum_type.iter().map(|e| e.name()))
                .any(|nested| to_upper_camel(nested) == type_name);
            if collides {
                type_name.push_str("OneOf");
            }
            let module = rel_module(message.full_name(), message.package_name());
            writeln!(
                out,
                "impl ::core::fmt::Debug for {module}::{type_name} {{\n    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{\n        match self {{"
            )?;
            for field in oneof.fields() {
                let variant = to_upper_camel(field.name());
                let (binding, value) = if self.is_secret(&field) {
                    ("_", format!("&{HELPERS}::Redacted::value(true)"))
                } else if let Kind::Enum(e) = field.kind() {
                    (
                        "value",
                        format!("&{HELPERS}::Enum::<{}>::new(value)", self.abs_path(&e)),
                    )
                } else {
                    ("value", "value".to_owned())
                };
                writeln!(
                    out,
                    "            Self::{variant}({binding}) => f.debug_tuple({variant:?}).field({value}).finish(),"
                )?;
            }
            writeln!(out, "        }}\n    }}\n}}\n")?;
        }
        Ok(())
    }
}

impl Redaction {
    /// Debug expression for a non-secret field, equivalent to prost-derive's output.
    fn plain_field(&self, field: &FieldDescriptor, access: &str) -> Result<String, Box<dyn Error>> {
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                return Err(
                    format!("map field {} without entry message", field.full_name()).into(),
                );
            };
            return Ok(match entry.map_entry_value_field().kind() {
                Kind::Enum(e) => format!(
                    "{HELPERS}::EnumValueMap::<_, {}>::new(&{access})",
                    self.abs_path(&e)
                ),
                _ => access.to_owned(),
            });
        }
        if field.is_group() {
            return Err(format!("group field {} is not supported", field.full_name()).into());
        }
        let Kind::Enum(e) = field.kind() else {
            return Ok(access.to_owned());
        };
        let enum_path = self.abs_path(&e);
        Ok(if field.is_list() {
            format!("{HELPERS}::EnumList::<{enum_path}>::new(&{access})")
        } else if field.supports_presence() {
            format!("{HELPERS}::OptionalEnum::<{enum_path}>::new(&{access})")
        } else {
            format!("{HELPERS}::Enum::<{enum_path}>::new(&{access})")
        })
    }

    /// Absolute Rust path of an enum (enum fields may use another package's enum).
    fn abs_path(&self, enumeration: &EnumDescriptor) -> String {
        let package = enumeration.package_name();
        let relative = rel_path(enumeration.full_name(), package);
        if package == "google.protobuf" {
            return format!("::prost_types::{relative}");
        }
        if let Some((_, module)) = self
            .relocated
            .filter(|(relocated, _)| *relocated == package)
        {
            return format!("{module}::{relative}");
        }
        let mut path = String::from("crate");
        for part in package.split('.').filter(|p| !p.is_empty()) {
            path.push_str("::");
            path.push_str(&to_snake(part));
        }
        format!("{path}::{relative}")
    }
}

/// Debug expression for a secret field: shape only (count or presence), never content.
fn redacted_field(field: &FieldDescriptor, access: &str) -> Result<String, Box<dyn Error>> {
    if field.is_group() {
        return Err(format!("group field {} is not supported", field.full_name()).into());
    }
    Ok(if field.is_map() {
        format!("{HELPERS}::Redacted::map({access}.len())")
    } else if field.is_list() {
        format!("{HELPERS}::Redacted::list({access}.len())")
    } else if field.supports_presence() {
        // Messages and `optional` scalars are `Option<_>`.
        format!("{HELPERS}::Redacted::value({access}.is_some())")
    } else if matches!(field.kind(), Kind::String | Kind::Bytes) {
        format!("{HELPERS}::Redacted::value(!{access}.is_empty())")
    } else {
        format!("{HELPERS}::Redacted::value(true)")
    })
}

/// `impl Debug` for a fieldless prost enum, identical to `#[derive(Debug)]`.
fn enum_debug(enumeration: &EnumDescriptor, out: &mut String) -> Result<(), Box<dyn Error>> {
    let enum_name = to_upper_camel(enumeration.name());
    writeln!(
        out,
        "impl ::core::fmt::Debug for {} {{\n    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{\n        f.write_str(match self {{",
        rel_path(enumeration.full_name(), enumeration.package_name())
    )?;
    // Same variant naming as prost-build: aliases skipped, enum-name prefix stripped.
    let mut seen = HashSet::new();
    for value in enumeration.values() {
        if !seen.insert(value.number()) {
            continue;
        }
        let variant = strip_enum_prefix(&enum_name, &to_upper_camel(value.name()));
        writeln!(out, "            Self::{variant} => {variant:?},")?;
    }
    writeln!(out, "        }})\n    }}\n}}\n")?;
    Ok(())
}

/// Rust path of a message or enum relative to its package's module, e.g.
/// `csi.v1.VolumeCapability.AccessMode` → `volume_capability::AccessMode`.
fn rel_path(full_name: &str, package: &str) -> String {
    let local = local_name(full_name, package);
    let mut parts: Vec<String> = local.split('.').map(str::to_owned).collect();
    let last = parts.pop().unwrap_or_default();
    parts = parts.iter().map(to_snake).collect();
    parts.push(to_upper_camel(&last));
    parts.join("::")
}

/// Module holding a message's nested types, relative to its package's module.
fn rel_module(full_name: &str, package: &str) -> String {
    local_name(full_name, package)
        .split('.')
        .map(to_snake)
        .collect::<Vec<_>>()
        .join("::")
}

fn local_name<'a>(full_name: &'a str, package: &str) -> &'a str {
    if package.is_empty() {
        full_name
    } else {
        full_name
            .strip_prefix(package)
            .and_then(|rest| rest.strip_prefix('.'))
            .unwrap_or(full_name)
    }
}

fn str_slice(items: &[&String]) -> String {
    let mut out = String::from("&[\n");
    for item in items {
        out.push_str(&format!("    {item:?},\n"));
    }
    out.push(']');
    out
}

// Identifier rules copied from prost-build (src/ident.rs) so our paths match its output.

fn sanitize_identifier(ident: &str) -> String {
    match ident {
        "as" | "break" | "const" | "continue" | "else" | "enum" | "false" | "fn" | "for" | "if"
        | "impl" | "in" | "let" | "loop" | "match" | "mod" | "move" | "mut" | "pub" | "ref"
        | "return" | "static" | "struct" | "trait" | "true" | "type" | "unsafe" | "use"
        | "where" | "while" | "dyn" | "abstract" | "become" | "box" | "do" | "final" | "macro"
        | "override" | "priv" | "typeof" | "unsized" | "virtual" | "yield" | "async" | "await"
        | "try" | "gen" => format!("r#{ident}"),
        "_" | "super" | "self" | "Self" | "extern" | "crate" => format!("{ident}_"),
        s if s.starts_with(|c: char| c.is_numeric()) => format!("_{ident}"),
        _ => ident.to_owned(),
    }
}

fn to_snake(s: impl AsRef<str>) -> String {
    sanitize_identifier(&s.as_ref().to_snake_case())
}

fn to_upper_camel(s: impl AsRef<str>) -> String {
    sanitize_identifier(&s.as_ref().to_upper_camel_case())
}

fn strip_enum_prefix(prefix: &str, name: &str) -> String {
    let stripped = name.strip_prefix(prefix).unwrap_or(name);
    let stripped = if stripped.chars().next().is_some_and(char::is_uppercase) {
        stripped
    } else {
        name
    };
    sanitize_identifier(stripped)
}
