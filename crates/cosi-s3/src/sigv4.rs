//! AWS Signature Version 4, the request signing every S3 and IAM endpoint checks: the
//! canonical request, the string to sign and the derived signing key, as AWS documents them.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// An access key and its secret.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// What is signed of a request.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The URI path, already encoded ([`encode_path`]).
    pub path: &'a str,
    /// Query parameters, not encoded.
    pub query: &'a [(String, String)],
    /// Every header sent and signed, `host` among them (names in any case).
    pub headers: &'a [(String, String)],
    pub payload: &'a [u8],
}

/// Where and when a request is signed.
#[derive(Debug)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
    /// `YYYYMMDD'T'HHMMSS'Z'`, as sent in `x-amz-date`.
    pub amz_date: &'a str,
}

/// The `Authorization` header value for `request`.
pub fn authorization(
    request: &Request<'_>,
    scope: &Scope<'_>,
    credentials: &Credentials,
) -> String {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(name, value)| {
            let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
            (name.to_ascii_lowercase(), value)
        })
        .collect();
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(name, _)| name.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers
        .iter()
        .map(|(name, value)| format!("{name}:{value}\n"))
        .collect();
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        request.path,
        canonical_query(request.query),
        hex::encode(Sha256::digest(request.payload)),
    );
    let date = &scope.amz_date[..8.min(scope.amz_date.len())];
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let key = [date, scope.region, scope.service, "aws4_request"]
        .iter()
        .fold(
            format!("AWS4{}", credentials.secret_access_key).into_bytes(),
            |key, part| hmac(&key, part.as_bytes()),
        );
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{credential_scope}, SignedHeaders={signed_headers}, Signature={signature}",
        credentials.access_key_id
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// The query string in canonical form: encoded, sorted by name then value.
pub fn canonical_query(query: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(name, value)| (encode(name), encode(value)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes all but the unreserved characters (`A-Za-z0-9-_.~`), as SigV4 requires.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A path's segments encoded, the slashes kept.
pub fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// The SHA-256 of a payload, hex, as `x-amz-content-sha256` carries it.
pub fn payload_hash(payload: &[u8]) -> String {
    hex::encode(Sha256::digest(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
            .collect()
    }

    /// AWS's own example (IAM ListUsers, 2015-08-30).
    #[test]
    fn the_signature_of_aws_documented_example() {
        let credentials = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        };
        let query = strings(&[("Action", "ListUsers"), ("Version", "2010-05-08")]);
        let headers = strings(&[
            (
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            ("Host", "iam.amazonaws.com"),
            ("X-Amz-Date", "20150830T123600Z"),
        ]);
        let request = Request {
            method: "GET",
            path: "/",
            query: &query,
            headers: &headers,
            payload: b"",
        };
        let scope = Scope {
            region: "us-east-1",
            service: "iam",
            amz_date: "20150830T123600Z",
        };
        assert_eq!(
            authorization(&request, &scope, &credentials),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(encode("a b/c~d*"), "a%20b%2Fc~d%2A");
        assert_eq!(encode_path("/bucket/dir/a b.txt"), "/bucket/dir/a%20b.txt");
        assert_eq!(
            canonical_query(&strings(&[("b", "2"), ("a", "x y"), ("a", "1")])),
            "a=1&a=x%20y&b=2"
        );
    }
}
