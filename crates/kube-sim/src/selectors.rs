//! Label and field selectors, parsed and evaluated the way kube-apiserver does for the
//! `labelSelector` and `fieldSelector` parameters of list and watch.
//!
//! This module is pure: it parses selector strings and evaluates them against objects held as
//! `serde_json::Value`. Every parse, validation or "unsupported field" failure is a
//! [`SelectorError`]; kube-apiserver answers all of them with 400 BadRequest and the error text as
//! the Status message.
//!
//! Upstream sources followed (the behaviour, not the code):
//! - label selectors: `k8s.io/apimachinery/pkg/labels/selector.go` (lexer, parser, `Requirement`)
//!   and `k8s.io/apimachinery/pkg/util/validation/validation.go` (key and value rules);
//! - field selectors: `k8s.io/apimachinery/pkg/fields/selector.go` (terms, escaping);
//! - which field labels a kind accepts: the field label conversion functions of the scheme,
//!   `pkg/apis/core/v1/conversion.go`, `pkg/apis/events/v1/conversion.go`,
//!   `k8s.io/apimachinery/pkg/runtime/conversion.go` (`DefaultMetaV1FieldSelectorConversion`)
//!   and, for custom resources, `apiextensions-apiserver/pkg/apiserver/conversion/converter.go`;
//! - the value of each field label: the `GetAttrs`/`ToSelectableFields` functions of
//!   `pkg/registry/core/{pod,node,namespace,secret,persistentvolume,...}/strategy.go` and
//!   `pkg/apis/events/selection.go` (formerly `pkg/registry/core/event/strategy.go`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

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

// ---------------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------------

/// The operator of one label requirement (`k8s.io/apimachinery/pkg/selection/operator.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LabelOperator {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>5`
    GreaterThan,
    /// `key<5`
    LessThan,
}

/// One requirement of a label selector: a key, an operator and its (sorted, de-duplicated)
/// values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    key: String,
    operator: LabelOperator,
    values: Vec<String>,
}

impl LabelRequirement {
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> LabelOperator {
        self.operator
    }

    /// The values, sorted and without duplicates (upstream keeps them in a string set).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Requirement semantics of labels/selector.go `Requirement.Matches`: `!=` and `notin` match
    /// when the label is absent; `>`/`<` need the label present and integer-valued.
    fn matches_with<'a>(&self, get: &impl Fn(&str) -> Option<&'a str>) -> bool {
        let has_value = |v: &str| self.values.iter().any(|x| x == v);
        match self.operator {
            LabelOperator::Equals | LabelOperator::DoubleEquals | LabelOperator::In => {
                get(&self.key).is_some_and(has_value)
            }
            LabelOperator::NotEquals | LabelOperator::NotIn => {
                get(&self.key).is_none_or(|v| !has_value(v))
            }
            LabelOperator::Exists => get(&self.key).is_some(),
            LabelOperator::DoesNotExist => get(&self.key).is_none(),
            LabelOperator::GreaterThan | LabelOperator::LessThan => {
                let Some(actual) = get(&self.key).and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let [wanted] = self.values.as_slice() else {
                    return false;
                };
                let Ok(wanted) = wanted.parse::<i64>() else {
                    return false;
                };
                if self.operator == LabelOperator::GreaterThan {
                    actual > wanted
                } else {
                    actual < wanted
                }
            }
        }
    }
}

impl fmt::Display for LabelRequirement {
    /// Upstream's canonical form (`Requirement.String`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            LabelOperator::Exists => return f.write_str(&self.key),
            LabelOperator::DoesNotExist => return write!(f, "!{}", self.key),
            LabelOperator::Equals => "=",
            LabelOperator::DoubleEquals => "==",
            LabelOperator::NotEquals => "!=",
            LabelOperator::GreaterThan => ">",
            LabelOperator::LessThan => "<",
            LabelOperator::In => " in ",
            LabelOperator::NotIn => " notin ",
        };
        let values = self.values.join(",");
        match self.operator {
            LabelOperator::In | LabelOperator::NotIn => write!(f, "{}{op}({values})", self.key),
            _ => write!(f, "{}{op}{values}", self.key),
        }
    }
}

/// A parsed `labelSelector`: the AND of its requirements. The empty selector matches everything.
///
/// Grammar, whitespace handling, validation and error messages follow
/// `k8s.io/apimachinery/pkg/labels/selector.go` (`Parse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses the string form of a label selector, e.g. `app=web,tier in (a,b),!legacy`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(text)
            .parse()
            .map_err(SelectorError::InvalidLabelSelector)?;
        // Upstream sorts by key so that the parse is deterministic (stable here).
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    /// True when the selector does not restrict anything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    /// Whether a label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let get = |key: &str| labels.get(key).map(String::as_str);
        self.requirements.iter().all(|r| r.matches_with(&get))
    }

    /// Whether an object's `metadata.labels` satisfies every requirement. A missing or non-object
    /// `metadata.labels` is the empty label set; a non-string label value counts as absent.
    pub fn matches_object(&self, object: &Value) -> bool {
        let labels = object
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|r| r.matches_with(&get))
    }
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for LabelSelector {
    /// The canonical form upstream prints: requirements sorted by key, comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

// --- lexer (labels/selector.go `Lexer`) ---

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// The literal tokens: operators, parentheses, comma and the keywords `in`/`notin`.
fn literal_token(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

/// Upstream's whitespace set: space, tab, CR, LF.
fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Bytes that start an operator token and end an identifier.
fn is_special(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// A byte lexer. As upstream, reading yields 0 at the end of input, and a NUL byte reads as the
/// end too (upstream ends the token stream there).
#[derive(Debug)]
struct Lexer<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.input.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    /// An identifier runs until whitespace, a special byte or the end; `in` and `notin` are
    /// keywords.
    fn scan_identifier_or_keyword(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        loop {
            let b = self.read();
            if b == 0 {
                break;
            }
            if is_special(b) || is_whitespace(b) {
                self.unread();
                break;
            }
            buf.push(b);
        }
        let token = literal_token(&buf).unwrap_or(Token::Identifier);
        (token, String::from_utf8_lossy(&buf).into_owned())
    }

    /// The longest run of special bytes that still forms an operator (`!=`, `==`, ...).
    fn scan_special_symbol(&mut self) -> (Token, String) {
        let mut buf = Vec::new();
        let mut last: Option<(Token, usize)> = None;
        loop {
            let b = self.read();
            if b == 0 {
                break;
            }
            if !is_special(b) {
                self.unread();
                break;
            }
            buf.push(b);
            if let Some(token) = literal_token(&buf) {
                last = Some((token, buf.len()));
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        match last {
            Some((token, len)) => (token, String::from_utf8_lossy(&buf[..len]).into_owned()),
            None => (
                Token::Error,
                format!(
                    "error expected: keyword found '{}'",
                    String::from_utf8_lossy(&buf)
                ),
            ),
        }
    }

    fn lex(&mut self) -> (Token, String) {
        let mut b = self.read();
        while is_whitespace(b) {
            b = self.read();
        }
        if b == 0 {
            return (Token::EndOfString, String::new());
        }
        self.unread();
        if is_special(b) {
            self.scan_special_symbol()
        } else {
            self.scan_identifier_or_keyword()
        }
    }
}

// --- parser (labels/selector.go `Parser`) ---

/// In the values context the keywords `in`/`notin` are plain identifiers (`x in (in)` is valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

#[derive(Debug)]
struct Parser {
    items: Vec<(Token, String)>,
    position: usize,
}

impl Parser {
    fn new(text: &str) -> Self {
        let mut lexer = Lexer {
            input: text.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Token::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Self { items, position: 0 }
    }

    fn item(&self, index: usize, context: Context) -> (Token, &str) {
        // The scan always ends with EndOfString; never read past it.
        let (token, literal) = self
            .items
            .get(index)
            .or(self.items.last())
            .map_or((Token::EndOfString, ""), |(t, l)| (*t, l.as_str()));
        match (context, token) {
            (Context::Values, Token::In | Token::NotIn) => (Token::Identifier, literal),
            _ => (token, literal),
        }
    }

    fn lookahead(&self, context: Context) -> (Token, String) {
        let (token, literal) = self.item(self.position, context);
        (token, literal.to_owned())
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let item = self.lookahead(context);
        if self.position < self.items.len() {
            self.position += 1;
        }
        item
    }

    fn parse(&mut self) -> Result<Vec<LabelRequirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{literal}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!(
                                "found '{literal}', expected: ',' or 'end of string'"
                            ));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{literal}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<LabelRequirement, String> {
        let (key, inferred) = self.parse_key_and_infer_operator()?;
        if let Some(operator) = inferred {
            return new_requirement(key, operator, Vec::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            LabelOperator::In | LabelOperator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, operator, values.into_iter().collect())
    }

    /// `[!] KEY`, inferring Exists (or keeping DoesNotExist) when no operator follows.
    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<LabelOperator>), String> {
        let mut operator = None;
        let (mut token, mut literal) = self.consume(Context::Values);
        if token == Token::DoesNotExist {
            operator = Some(LabelOperator::DoesNotExist);
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        // Upstream validates the key here with no field path, hence its "<nil>: " prefix.
        validate_label_key(&literal, "<nil>")?;
        let (next, _) = self.lookahead(Context::Values);
        if matches!(next, Token::EndOfString | Token::Comma) && operator.is_none() {
            operator = Some(LabelOperator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<LabelOperator, String> {
        let (token, literal) = self.consume(Context::KeyAndOperator);
        Ok(match token {
            Token::In => LabelOperator::In,
            Token::Equals => LabelOperator::Equals,
            Token::DoubleEquals => LabelOperator::DoubleEquals,
            Token::GreaterThan => LabelOperator::GreaterThan,
            Token::LessThan => LabelOperator::LessThan,
            Token::NotIn => LabelOperator::NotIn,
            Token::NotEquals => LabelOperator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{literal}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    /// `( VALUE [, VALUE]* )`; empty entries are the empty value, `()` is `("")`.
    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        match token {
            Token::Identifier | Token::Comma => {
                let values = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                Ok(values)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!(
                "found '{literal}', expected: ',', ')' or identifier"
            )),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut values = BTreeSet::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.insert(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => {}
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    // A leading, trailing or doubled comma stands for the empty value.
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            values.insert(String::new());
                            return Ok(values);
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            values.insert(String::new());
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    /// The single value after `=`, `==`, `!=`, `>` or `<`; nothing before `,`/end is `""`.
    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        if matches!(
            self.lookahead(Context::Values).0,
            Token::EndOfString | Token::Comma
        ) {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.consume(Context::Values) {
            (Token::Identifier, literal) => Ok(BTreeSet::from([literal])),
            (_, literal) => Err(format!("found '{literal}', expected: identifier")),
        }
    }
}

/// Upstream's `NewRequirement` checks as the parser can reach them: Gt/Lt values must be
/// integers, every value must be a valid label value. Errors are aggregated like upstream's
/// `utilerrors.Aggregate` (de-duplicated, `[a, b]` when more than one).
fn new_requirement(
    key: String,
    operator: LabelOperator,
    values: Vec<String>,
) -> Result<LabelRequirement, String> {
    let mut errors = Vec::new();
    if matches!(
        operator,
        LabelOperator::GreaterThan | LabelOperator::LessThan
    ) {
        for (i, value) in values.iter().enumerate() {
            if value.parse::<i64>().is_err() {
                errors.push(invalid_value(
                    &format!("values[{i}]"),
                    value,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                ));
            }
        }
    }
    for (i, value) in values.iter().enumerate() {
        let problems = label_value_errors(value);
        if !problems.is_empty() {
            errors.push(invalid_value(
                &format!("values[{i}][{key}]"),
                value,
                &problems.join("; "),
            ));
        }
    }
    if errors.is_empty() {
        Ok(LabelRequirement {
            key,
            operator,
            values,
        })
    } else {
        Err(aggregate(errors))
    }
}

// --- validation (k8s.io/apimachinery/pkg/util/validation/validation.go) ---

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX: usize = 63;
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Upstream's `RegexError` wording, examples included.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let mut out = format!("{message} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{example}', "));
    }
    out.push_str(&format!("regex used for validation is '{format}')"));
    out
}

fn max_len_error(max: usize) -> String {
    format!("must be no more than {max} characters")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, anchored.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !value
        .split('.')
        .all(csi_sidecar::names::matches_dns1123_label_pattern)
    {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// `IsQualifiedName`: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters.
fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errors.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errors;
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errors.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX)));
    }
    if !is_qualified_name_part(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// `IsValidLabelValue`: empty, or at most 63 characters of the qualified-name alphabet.
fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errors.push(max_len_error(LABEL_VALUE_MAX));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errors.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

fn validate_label_key(key: &str, path: &str) -> Result<(), String> {
    let problems = qualified_name_errors(key);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid_value(path, key, &problems.join("; ")))
    }
}

/// A `field.Invalid` error as upstream prints it: `<path>: Invalid value: "<value>": <detail>`.
fn invalid_value(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {}: {detail}", go_quote(value))
}

/// Joins messages like upstream's aggregate error: one stays bare, several become `[a, b]`.
fn aggregate(messages: Vec<String>) -> String {
    let mut unique: Vec<String> = Vec::with_capacity(messages.len());
    for message in messages {
        if !unique.contains(&message) {
            unique.push(message);
        }
    }
    if unique.len() == 1 {
        unique.remove(0)
    } else {
        format!("[{}]", unique.join(", "))
    }
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

// ---------------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------------

/// The operator of one field requirement (`fields/selector.go`: `=` and `==` are the same
/// term).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    Equals,
    DoubleEquals,
    NotEquals,
}

/// One `field<op>value` term; `value` is unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub operator: FieldOperator,
    pub value: String,
}

/// A parsed `fieldSelector`: the AND of its terms. The empty selector matches everything.
///
/// Syntax per `k8s.io/apimachinery/pkg/fields/selector.go` (`ParseSelector`): terms split on
/// unescaped commas, operators `=`, `==`, `!=`, values may escape `\,` `\=` `\\`. Unlike label
/// selectors no whitespace is trimmed: `a = b` names the field `a ` (with a space).
///
/// Which fields exist depends on the kind (see [`FieldSelector::validate_for`]); a field that
/// exists but is unset compares as `""`, so `spec.nodeName=` selects unscheduled pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the string form of a field selector, e.g. `metadata.name=a,status.phase!=Failed`.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(text);
        // Upstream sorts the raw terms before parsing; this decides which error is reported
        // first when several terms are wrong.
        parts.sort_unstable();
        let mut requirements = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            let Some((field, operator, raw_value)) = split_term(part) else {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            let value = unescape_value(raw_value)?;
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                operator,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// The selector that matches everything.
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, in upstream's evaluation order (sorted by their raw text).
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The value an `=`/`==` term requires of `field`, if any (upstream `RequiresExactMatch`),
    /// e.g. the name of a `metadata.name=<name>` watch.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator != FieldOperator::NotEquals)
            .map(|r| r.value.as_str())
    }

    /// Checks every field against the field labels kube-apiserver accepts for `kind`.
    ///
    /// `kind` is the object Kind for the core group (`"Pod"`, `"Event"`), or `Kind.group` for
    /// other groups (`"Event.events.k8s.io"`, `"Lease.coordination.k8s.io"`; see
    /// [`qualified_kind`]). Supported:
    /// - `Pod`: `metadata.name`, `metadata.namespace`, `spec.nodeName` (and its old alias
    ///   `spec.host`), `spec.restartPolicy`, `spec.schedulerName`, `spec.serviceAccountName`,
    ///   `spec.hostNetwork`, `status.phase`, `status.podIP`, `status.podIPs`,
    ///   `status.nominatedNodeName`;
    /// - `Node`: `metadata.name`, `spec.unschedulable` (not `metadata.namespace`);
    /// - `Namespace`: `metadata.name`, `status.phase` (not `metadata.namespace`);
    /// - `Secret`: `metadata.name`, `metadata.namespace`, `type`;
    /// - `Event` (core/v1): `metadata.name`, `metadata.namespace`, `involvedObject.{kind,
    ///   namespace,name,uid,apiVersion,resourceVersion,fieldPath}`, `reason`,
    ///   `reportingComponent`, `source`, `type`;
    /// - `Event.events.k8s.io`: `metadata.name`, `metadata.namespace`, `regarding.{kind,
    ///   namespace,name,uid,apiVersion,resourceVersion,fieldPath}`, `reason`,
    ///   `reportingController`, `source`, `type`;
    /// - any other kind (PersistentVolume, PersistentVolumeClaim, ConfigMap, storage.k8s.io,
    ///   ...): `metadata.name`, `metadata.namespace`, with upstream's default message otherwise
    ///   (`"x" is not a known field selector: only "metadata.name", "metadata.namespace"`).
    ///
    /// For custom resources use [`FieldSelector::validate_for_custom_resource`].
    pub fn validate_for(&self, kind: &str) -> Result<(), SelectorError> {
        let kind = KindFields::of(kind);
        self.requirements
            .iter()
            .try_for_each(|r| kind.convert(&r.field).map(drop))
    }

    /// Checks every field against what apiextensions-apiserver accepts for a custom resource:
    /// `metadata.name`, `metadata.namespace` when `namespaced`, and the CRD version's
    /// `selectableFields` (given as their `jsonPath`, with or without the leading `.`).
    pub fn validate_for_custom_resource(
        &self,
        namespaced: bool,
        selectable_fields: &[&str],
    ) -> Result<(), SelectorError> {
        for r in &self.requirements {
            let field = r.field.as_str();
            let ok = field == "metadata.name"
                || (namespaced && field == "metadata.namespace")
                || selectable_fields
                    .iter()
                    .any(|s| s.strip_prefix('.').unwrap_or(s) == field);
            if !ok {
                return Err(not_supported(field));
            }
        }
        Ok(())
    }

    /// Whether `object` (of `kind`, spelled as for [`FieldSelector::validate_for`]) satisfies
    /// every term. Call it with a selector that `validate_for` accepted; fields are read as
    /// the kind's `ToSelectableFields` computes them (e.g. an unset `spec.hostNetwork` is
    /// `"false"`, an unset string field is `""`), any other field (e.g. a custom resource's
    /// selectable field) as the dotted JSON path, with bools and numbers in their string form.
    pub fn matches_object(&self, kind: &str, object: &Value) -> bool {
        let kind = KindFields::of(kind);
        self.requirements.iter().all(|r| {
            let field = kind.convert(&r.field).unwrap_or(&r.field);
            r.matches_value(&kind.value(field, object))
        })
    }

    /// Whether a precomputed field set satisfies every term; a missing field is `""`.
    pub fn matches_fields(&self, fields: &BTreeMap<String, String>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches_value(fields.get(&r.field).map_or("", String::as_str)))
    }
}

impl FieldRequirement {
    fn matches_value(&self, actual: &str) -> bool {
        match self.operator {
            FieldOperator::Equals | FieldOperator::DoubleEquals => actual == self.value,
            FieldOperator::NotEquals => actual != self.value,
        }
    }
}

impl FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for FieldSelector {
    /// Upstream's canonical form: `field=value` / `field!=value` terms with the value escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if r.operator == FieldOperator::NotEquals {
                "!="
            } else {
                "="
            };
            write!(f, "{}{op}{}", r.field, escape_value(&r.value))?;
        }
        Ok(())
    }
}

/// How [`FieldSelector::validate_for`] and [`FieldSelector::matches_object`] spell a kind
/// outside the core group: `Kind.group`.
pub fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// Splits on commas not preceded by a backslash escape.
fn split_terms(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&text[start..i]);
            start = i + 1;
        }
    }
    terms.push(&text[start..]);
    terms
}

/// Finds the first operator; at each position `!=` is tried before `==` before `=`.
fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    const OPERATORS: [(&str, FieldOperator); 3] = [
        ("!=", FieldOperator::NotEquals),
        ("==", FieldOperator::DoubleEquals),
        ("=", FieldOperator::Equals),
    ];
    term.char_indices().find_map(|(i, _)| {
        let rest = &term[i..];
        OPERATORS
            .iter()
            .find(|(op, _)| rest.starts_with(op))
            .map(|(op, operator)| (&term[..i], *operator, &rest[op.len()..]))
    })
}

/// Undoes `\\`, `\,` and `\=`; any other escape, a dangling `\`, or a bare `,`/`=` is an error.
fn unescape_value(raw: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError::InvalidFieldSelector(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' || c == '=' {
            // Upstream prints the rune with %v (its code point); the character reads better.
            return Err(SelectorError::InvalidFieldSelector(format!(
                "invalid field selector: unescaped character in value: {c}"
            )));
        } else {
            out.push(c);
        }
    }
    if escaped {
        return Err(SelectorError::InvalidFieldSelector(
            "invalid field selector: invalid escape sequence: \\".to_owned(),
        ));
    }
    Ok(out)
}

fn escape_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

/// The field labels a kind accepts, and how each one reads from the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KindFields {
    Pod,
    Node,
    Namespace,
    Secret,
    CoreEvent,
    EventsEvent,
    /// Every kind without its own field label conversion.
    Default,
}

const CORE_EVENT_FIELDS: [&str; 13] = [
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.namespace",
    "metadata.name",
];

fn not_supported(field: &str) -> SelectorError {
    SelectorError::FieldLabelNotSupported {
        field: field.to_owned(),
        message: format!("field label not supported: {field}"),
    }
}

impl KindFields {
    fn of(kind: &str) -> Self {
        match kind.split_once('.').unwrap_or((kind, "")) {
            ("Pod", "") => Self::Pod,
            ("Node", "") => Self::Node,
            ("Namespace", "") => Self::Namespace,
            ("Secret", "") => Self::Secret,
            ("Event", "") => Self::CoreEvent,
            ("Event", "events.k8s.io") => Self::EventsEvent,
            _ => Self::Default,
        }
    }

    /// The scheme's field label conversion: accepts a label (possibly renaming it to the name
    /// the registry's field set uses) or rejects it with upstream's message.
    fn convert(self, field: &str) -> Result<&str, SelectorError> {
        match self {
            // pkg/apis/core/v1/conversion.go, Pod; `spec.host` is kept for old v1 clients.
            Self::Pod => match field {
                "metadata.name"
                | "metadata.namespace"
                | "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.podIPs"
                | "status.nominatedNodeName" => Ok(field),
                "spec.host" => Ok("spec.nodeName"),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, Node (cluster-scoped: no metadata.namespace).
            Self::Node => match field {
                "metadata.name" | "spec.unschedulable" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForNamespace.
            Self::Namespace => match field {
                "metadata.name" | "status.phase" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForSecret.
            Self::Secret => match field {
                "metadata.name" | "metadata.namespace" | "type" => Ok(field),
                _ => Err(not_supported(field)),
            },
            // pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForEvent.
            Self::CoreEvent => {
                if CORE_EVENT_FIELDS.contains(&field) {
                    Ok(field)
                } else {
                    Err(not_supported(field))
                }
            }
            // pkg/apis/events/v1/conversion.go: the events.k8s.io names map onto the core
            // Event field set (events.k8s.io shares the core Event storage).
            Self::EventsEvent => match field {
                "reason" | "source" | "type" | "metadata.namespace" | "metadata.name" => Ok(field),
                "reportingController" => Ok("reportingComponent"),
                "regarding.kind" => Ok("involvedObject.kind"),
                "regarding.namespace" => Ok("involvedObject.namespace"),
                "regarding.name" => Ok("involvedObject.name"),
                "regarding.uid" => Ok("involvedObject.uid"),
                "regarding.apiVersion" => Ok("involvedObject.apiVersion"),
                "regarding.resourceVersion" => Ok("involvedObject.resourceVersion"),
                "regarding.fieldPath" => Ok("involvedObject.fieldPath"),
                _ => Err(not_supported(field)),
            },
            // k8s.io/apimachinery/pkg/runtime/conversion.go, DefaultMetaV1FieldSelectorConversion.
            Self::Default => match field {
                "metadata.name" | "metadata.namespace" => Ok(field),
                _ => Err(SelectorError::FieldLabelNotSupported {
                    field: field.to_owned(),
                    message: format!(
                        "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                        go_quote(field)
                    ),
                }),
            },
        }
    }

    /// The value of a (converted) field label, as the registry's `ToSelectableFields` computes
    /// it from the typed object.
    fn value<'a>(self, field: &str, object: &'a Value) -> Cow<'a, str> {
        match (self, field) {
            // pkg/registry/core/pod/strategy.go: hostNetwork is a bool, false when unset.
            (Self::Pod, "spec.hostNetwork") => bool_field(object, &["spec", "hostNetwork"]),
            // The v1 -> internal conversion fills serviceAccountName from the deprecated
            // serviceAccount when it is empty.
            (Self::Pod, "spec.serviceAccountName") => first_non_empty(
                object,
                &[&["spec", "serviceAccountName"], &["spec", "serviceAccount"]],
            ),
            // The registry reads the first of the internal podIPs; converting from v1, a
            // non-empty podIP is authoritative, else the first of podIPs.
            (Self::Pod, "status.podIP") => first_non_empty(
                object,
                &[&["status", "podIP"], &["status", "podIPs", "0", "ip"]],
            ),
            // Accepted by the conversion but never put in the pod field set: always "".
            (Self::Pod, "status.podIPs") => Cow::Borrowed(""),
            // pkg/registry/core/node/strategy.go: unschedulable is a bool, false when unset.
            (Self::Node, "spec.unschedulable") => bool_field(object, &["spec", "unschedulable"]),
            (Self::CoreEvent | Self::EventsEvent, _) => self.event_value(field, object),
            _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
        }
    }

    /// pkg/apis/events/selection.go `EventToSelectableFields`: `source` is the source
    /// component, else the reporting controller. The object may be in core/v1 or in
    /// events.k8s.io/v1 shape (`regarding`, `reportingController`, `deprecatedSource`); its
    /// apiVersion decides, else the requested kind.
    fn event_value<'a>(self, field: &str, object: &'a Value) -> Cow<'a, str> {
        let events_shape = match object.get("apiVersion").and_then(Value::as_str) {
            Some(api_version) => api_version.starts_with("events.k8s.io/"),
            None => self == Self::EventsEvent,
        };
        if events_shape {
            if let Some(rest) = field.strip_prefix("involvedObject.") {
                return string_field(object, &["regarding", rest]);
            }
            match field {
                "reportingComponent" => string_field(object, &["reportingController"]),
                "source" => first_non_empty(
                    object,
                    &[&["deprecatedSource", "component"], &["reportingController"]],
                ),
                _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
            }
        } else {
            match field {
                "source" => {
                    first_non_empty(object, &[&["source", "component"], &["reportingComponent"]])
                }
                _ => string_field(object, &field.split('.').collect::<Vec<_>>()),
            }
        }
    }
}

/// Walks object keys; a numeric segment indexes an array.
fn path<'a>(object: &'a Value, segments: &[&str]) -> Option<&'a Value> {
    segments.iter().try_fold(object, |v, s| match v {
        Value::Array(items) => s.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => v.get(*s),
    })
}

/// A field in string form: strings as they are, bools `true`/`false`, numbers in decimal;
/// absent, null or structured values are `""`.
fn string_field<'a>(object: &'a Value, segments: &[&str]) -> Cow<'a, str> {
    match path(object, segments) {
        Some(Value::String(s)) => Cow::Borrowed(s),
        Some(Value::Bool(b)) => Cow::Borrowed(if *b { "true" } else { "false" }),
        Some(Value::Number(n)) => Cow::Owned(n.to_string()),
        _ => Cow::Borrowed(""),
    }
}

/// A Go bool field: `false` unless it is `true`.
fn bool_field<'a>(object: &'a Value, segments: &[&str]) -> Cow<'a, str> {
    let value = path(object, segments)
        .is_some_and(|v| v == &Value::Bool(true) || v.as_str() == Some("true"));
    Cow::Borrowed(if value { "true" } else { "false" })
}

fn first_non_empty<'a>(object: &'a Value, candidates: &[&[&str]]) -> Cow<'a, str> {
    candidates
        .iter()
        .map(|segments| string_field(object, segments))
        .find(|v| !v.is_empty())
        .unwrap_or(Cow::Borrowed(""))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// (selector, labels, expected match)
    type LabelCase = (&'static str, &'static [(&'static str, &'static str)], bool);
    /// (selector, parsed terms, canonical form)
    type FieldParseCase = (
        &'static str,
        &'static [(&'static str, FieldOperator, &'static str)],
        &'static str,
    );

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn label_error(text: &str) -> String {
        match LabelSelector::parse(text) {
            Ok(s) => panic!("{text:?} parsed as {s:?}, expected an error"),
            Err(e) => e.to_string(),
        }
    }

    fn field_error(text: &str) -> String {
        match FieldSelector::parse(text) {
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
        assert!(
            !selector.matches_object(&json!({"metadata": {"labels": {"app": "web", "gone": ""}}}))
        );
        assert!(!selector.matches_object(&json!({"metadata": {"name": "x"}})));
        assert!(!selector.matches_object(&json!({"metadata": {"labels": {"app": 1}}})));
        let not_in = LabelSelector::parse("app notin (web)").unwrap_or_else(|e| panic!("{e}"));
        assert!(not_in.matches_object(&json!({"metadata": {}})));
        assert!(not_in.matches_object(&json!({})));
        assert!(LabelSelector::everything().matches_object(&json!(null)));
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
        let node =
            json!({"kind": "Node", "metadata": {"name": "n1"}, "spec": {"unschedulable": true}});
        let plain_node = json!({"kind": "Node", "metadata": {"name": "n2"}, "spec": {}});
        let namespace = json!({"metadata": {"name": "ns"}, "status": {"phase": "Terminating"}});
        let secret =
            json!({"metadata": {"name": "s", "namespace": "ns"}, "type": "kubernetes.io/tls"});
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
        let pvc = json!({"metadata": {"name": "claim", "namespace": "ns"}, "spec": {"volumeName": "pv-1"}});
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
            FieldSelector::parse("spec.nodeName=")
                .is_ok_and(|s| s.matches_fields(&BTreeMap::new()))
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
}
