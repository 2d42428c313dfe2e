//! Label selectors (`labelSelector`): lexer, parser, key and value validation, matching.
//!
//! Upstream sources followed (the behaviour, not the code):
//! `k8s.io/apimachinery/pkg/labels/selector.go` (lexer, parser, `Requirement`) and
//! `k8s.io/apimachinery/pkg/util/validation/validation.go` (key and value rules).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::{SelectorError, go_quote};

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

pub(crate) fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !crate::names::matches_dns1123_subdomain(value) {
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
pub(crate) fn qualified_name_errors(value: &str) -> Vec<String> {
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
pub(crate) fn label_value_errors(value: &str) -> Vec<String> {
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

#[cfg(test)]
mod tests;
