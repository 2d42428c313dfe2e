//! The few S3 and IAM calls cosi-s3 makes (and a workload's put and get), over HTTP or HTTPS,
//! signed with SigV4: path-style S3 requests, and IAM's query API (form-encoded POSTs).

use bytes::Bytes;
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;

use crate::sigv4::{self, Credentials, Request, Scope};

/// IAM is global: its requests are signed for this region.
const IAM_REGION: &str = "us-east-1";
const IAM_VERSION: &str = "2010-05-08";

#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("{service} {operation}: {source}")]
    Http {
        service: &'static str,
        operation: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{service} {operation}: {status} {code}: {message}")]
    Api {
        service: &'static str,
        operation: String,
        status: StatusCode,
        code: String,
        message: String,
    },
}

impl AwsError {
    /// The service's error code (`NoSuchBucket`, `EntityAlreadyExists`, ...), if it answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            Self::Http { .. } => None,
        }
    }
}

/// A signed client of one S3 endpoint (and the IAM endpoint beside it).
#[derive(Clone)]
pub struct AwsClient {
    s3: Uri,
    iam: Uri,
    region: String,
    credentials: Credentials,
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for AwsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsClient")
            .field("s3", &self.s3)
            .field("iam", &self.iam)
            .field("region", &self.region)
            .field("credentials", &self.credentials)
            .finish()
    }
}

/// One request.
struct Call<'a> {
    service: &'static str,
    operation: &'a str,
    method: Method,
    path: &'a str,
    query: &'a [(String, String)],
    content_type: Option<&'a str>,
    payload: Vec<u8>,
}

impl<'a> Call<'a> {
    /// An S3 request without a content type.
    fn s3(operation: &'a str, method: Method, path: &'a str, payload: Vec<u8>) -> Self {
        Self {
            service: "s3",
            operation,
            method,
            path,
            query: &[],
            content_type: None,
            payload,
        }
    }
}

impl AwsClient {
    /// `s3` and `iam`: `http(s)://host[:port]` endpoints.
    pub fn new(
        s3: Uri,
        iam: Uri,
        region: &str,
        credentials: Credentials,
    ) -> Result<Self, std::io::Error> {
        let tls = if [&s3, &iam]
            .iter()
            .any(|endpoint| endpoint.scheme() == Some(&http::uri::Scheme::HTTPS))
        {
            hyper_rustls::HttpsConnectorBuilder::new().with_native_roots()?
        } else {
            // Plain HTTP endpoints need no trust store, so an image without CA certificates
            // (a minimal one, or a test node's) still serves them.
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        };
        let https = tls.https_or_http().enable_http1().build();
        Ok(Self {
            s3,
            iam,
            region: region.to_string(),
            credentials,
            http: Client::builder(TokioExecutor::new()).build(https),
        })
    }

    /// The same endpoints with other credentials (a workload's).
    pub fn with_credentials(&self, credentials: Credentials) -> Self {
        Self {
            credentials,
            ..self.clone()
        }
    }

    pub fn s3_endpoint(&self) -> &Uri {
        &self.s3
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    async fn send(&self, call: Call<'_>) -> Result<Bytes, AwsError> {
        let Call {
            service,
            operation,
            method,
            path,
            query,
            content_type,
            payload,
        } = call;
        let (endpoint, region) = match service {
            "iam" => (&self.iam, IAM_REGION),
            _ => (&self.s3, self.region.as_str()),
        };
        let failed = |source: Box<dyn std::error::Error + Send + Sync>| AwsError::Http {
            service,
            operation: operation.to_string(),
            source,
        };
        let host = endpoint
            .authority()
            .ok_or_else(|| failed(format!("{endpoint} names no host").into()))?
            .to_string();
        let amz_date = Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
        let mut headers = vec![
            ("host".to_string(), host),
            ("x-amz-date".to_string(), amz_date.clone()),
            (
                "x-amz-content-sha256".to_string(),
                sigv4::payload_hash(&payload),
            ),
        ];
        if let Some(content_type) = content_type {
            headers.push(("content-type".to_string(), content_type.to_string()));
        }
        let path = sigv4::encode_path(path);
        let authorization = sigv4::authorization(
            &Request {
                method: method.as_str(),
                path: &path,
                query,
                headers: &headers,
                payload: &payload,
            },
            &Scope {
                region,
                service,
                amz_date: &amz_date,
            },
            &self.credentials,
        );
        let query = sigv4::canonical_query(query);
        let scheme = endpoint.scheme_str().unwrap_or("http");
        let authority = endpoint.authority().map(|a| a.as_str()).unwrap_or_default();
        let uri = if query.is_empty() {
            format!("{scheme}://{authority}{path}")
        } else {
            format!("{scheme}://{authority}{path}?{query}")
        };
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in headers.iter().filter(|(name, _)| name != "host") {
            request = request.header(name, value);
        }
        let request = request
            .header(http::header::AUTHORIZATION, authorization)
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| failed(e.into()))?;
        let response = self
            .http
            .request(request)
            .await
            .map_err(|e| failed(e.into()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.into()))?
            .to_bytes();
        if status.is_success() {
            return Ok(body);
        }
        let text = String::from_utf8_lossy(&body);
        Err(AwsError::Api {
            service,
            operation: operation.to_string(),
            status,
            code: xml_values(&text, "Code")
                .into_iter()
                .next()
                .unwrap_or_else(|| status.as_str().to_string()),
            message: xml_values(&text, "Message")
                .into_iter()
                .next()
                .unwrap_or_default(),
        })
    }

    /// Creates a bucket; one this account already owns is fine.
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), AwsError> {
        match self
            .send(Call::s3(
                "CreateBucket",
                Method::PUT,
                &format!("/{bucket}"),
                Vec::new(),
            ))
            .await
        {
            Err(error) if error.code() == Some("BucketAlreadyOwnedByYou") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Deletes a bucket and every object in it; one already gone is fine.
    pub async fn delete_bucket(&self, bucket: &str) -> Result<(), AwsError> {
        loop {
            let keys = match self.list_objects(bucket).await {
                Err(error) if error.code() == Some("NoSuchBucket") => return Ok(()),
                other => other?,
            };
            if keys.is_empty() {
                break;
            }
            for key in keys {
                self.send(Call::s3(
                    "DeleteObject",
                    Method::DELETE,
                    &format!("/{bucket}/{key}"),
                    Vec::new(),
                ))
                .await?;
            }
        }
        match self
            .send(Call::s3(
                "DeleteBucket",
                Method::DELETE,
                &format!("/{bucket}"),
                Vec::new(),
            ))
            .await
        {
            Err(error) if error.code() == Some("NoSuchBucket") => Ok(()),
            other => other.map(drop),
        }
    }

    /// The keys of (the first thousand) objects in a bucket.
    pub async fn list_objects(&self, bucket: &str) -> Result<Vec<String>, AwsError> {
        let path = format!("/{bucket}");
        let query = [("list-type".to_string(), "2".to_string())];
        let answer = self
            .send(Call {
                query: &query,
                ..Call::s3("ListObjectsV2", Method::GET, &path, Vec::new())
            })
            .await?;
        Ok(xml_values(&String::from_utf8_lossy(&answer), "Key"))
    }

    pub async fn put_object(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), AwsError> {
        self.send(Call::s3(
            "PutObject",
            Method::PUT,
            &format!("/{bucket}/{key}"),
            data.to_vec(),
        ))
        .await
        .map(drop)
    }

    pub async fn get_object(&self, bucket: &str, key: &str) -> Result<Bytes, AwsError> {
        let answer = self
            .send(Call::s3(
                "GetObject",
                Method::GET,
                &format!("/{bucket}/{key}"),
                Vec::new(),
            ))
            .await?;
        Ok(answer)
    }

    /// One IAM action; returns its XML answer.
    pub async fn iam(&self, action: &str, parameters: &[(&str, &str)]) -> Result<String, AwsError> {
        let mut form: Vec<(String, String)> = vec![
            ("Action".to_string(), action.to_string()),
            ("Version".to_string(), IAM_VERSION.to_string()),
        ];
        form.extend(
            parameters
                .iter()
                .map(|(name, value)| ((*name).to_string(), (*value).to_string())),
        );
        let body = sigv4::canonical_query(&form).into_bytes();
        let answer = self
            .send(Call {
                service: "iam",
                operation: action,
                method: Method::POST,
                path: "/",
                query: &[],
                content_type: Some("application/x-www-form-urlencoded; charset=utf-8"),
                payload: body,
            })
            .await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}

/// The text of every `<tag>` element of a small XML answer, entities resolved.
pub fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut values = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else {
            break;
        };
        values.push(
            after[..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[end + close.len()..];
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_an_answer() {
        let xml = "<CreateAccessKeyResult><AccessKey><UserName>ba-1</UserName>\
                   <AccessKeyId>AKIA1</AccessKeyId><SecretAccessKey>s&amp;x</SecretAccessKey>\
                   </AccessKey></CreateAccessKeyResult>";
        assert_eq!(xml_values(xml, "AccessKeyId"), vec!["AKIA1"]);
        assert_eq!(xml_values(xml, "SecretAccessKey"), vec!["s&x"]);
        assert!(xml_values(xml, "Missing").is_empty());
        let list = "<Contents><Key>a</Key></Contents><Contents><Key>b c</Key></Contents>";
        assert_eq!(xml_values(list, "Key"), vec!["a", "b c"]);
    }
}
