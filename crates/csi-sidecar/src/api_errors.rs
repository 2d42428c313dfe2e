//! Kubernetes API errors as client-go prints them, for messages and Events that quote them.

/// An API error as client-go's `err.Error()` prints it: a refusal is its Status message
/// (`secrets "s" not found`), anything else kube's own text. Events that quote an API error
/// read as upstream's then.
#[derive(Debug, Clone, Copy)]
pub struct GoApiError<'a>(pub &'a ::kube::Error);

impl std::fmt::Display for GoApiError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            ::kube::Error::Api(status) if !status.message.is_empty() => {
                f.write_str(&status.message)
            }
            other => other.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_read_as_client_go_prints_them() {
        let not_found = ::kube::Error::Api(Box::new(::kube::core::Status {
            code: 404,
            message: r#"secrets "creds" not found"#.into(),
            reason: "NotFound".into(),
            ..Default::default()
        }));
        assert_eq!(
            GoApiError(&not_found).to_string(),
            r#"secrets "creds" not found"#
        );
        let other = ::kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(GoApiError(&other).to_string(), other.to_string());
    }
}
