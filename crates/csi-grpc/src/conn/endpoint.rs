//! CSI endpoint addresses: `unix:///abs/path`, `unix:/abs/path` or a bare `/abs/path`.

use std::fmt;
use std::path::{Path, PathBuf};

use super::ConnError;

/// `sun_path` holds 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// A parsed CSI endpoint: always a Unix domain socket path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    pub fn parse(address: &str) -> Result<Self, ConnError> {
        let malformed = |why: &'static str| ConnError::MalformedEndpoint {
            address: address.to_string(),
            why,
        };
        let path = if let Some(rest) = address.strip_prefix("unix://") {
            if !rest.starts_with('/') {
                return Err(malformed(
                    "unix:// must be followed by an absolute path (unix:///path)",
                ));
            }
            rest
        } else if let Some(rest) = address.strip_prefix("unix:") {
            rest
        } else if address.contains("://") {
            return Err(malformed(
                "only unix domain sockets are supported (unix:///path)",
            ));
        } else {
            address
        };
        if path.is_empty() {
            return Err(malformed("empty path"));
        }
        if !path.starts_with('/') {
            return Err(malformed("the socket path must be absolute"));
        }
        Self::from_path(path)
    }

    /// An endpoint for a socket path, checked against the Unix socket path limit.
    pub fn from_path(path: impl Into<PathBuf>) -> Result<Self, ConnError> {
        let path = path.into();
        check_socket_path(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Binds the socket for a server (a driver), replacing a stale one left by a previous run,
    /// read-write for the server's user and group only: sidecars that run as another user
    /// reach it through its group (in a pod, the fsGroup the kubelet gives the shared emptyDir,
    /// setgid, so the socket inherits it).
    pub fn listen(&self) -> std::io::Result<tokio::net::UnixListener> {
        use std::os::unix::fs::PermissionsExt as _;
        match std::fs::remove_file(&self.path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let listener = tokio::net::UnixListener::bind(&self.path)?;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o660))?;
        Ok(listener)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// Unix sockets cannot have paths longer than [`MAX_SOCKET_PATH_BYTES`]; say so instead of
/// failing later with an obscure `EINVAL`.
pub fn check_socket_path(path: &Path) -> Result<(), ConnError> {
    let length = path.as_os_str().len();
    if length > MAX_SOCKET_PATH_BYTES {
        return Err(ConnError::SocketPathTooLong {
            path: path.to_path_buf(),
            length,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        for (address, path) in [
            ("unix:///run/csi/socket", "/run/csi/socket"),
            ("unix:/run/csi/socket", "/run/csi/socket"),
            ("/run/csi/socket", "/run/csi/socket"),
        ] {
            let endpoint = Endpoint::parse(address).unwrap();
            assert_eq!(endpoint.path(), Path::new(path));
            assert_eq!(endpoint.to_string(), format!("unix://{path}"));
        }
    }

    #[test]
    fn malformed_forms_say_why() {
        for (address, why) in [
            ("", "empty path"),
            ("unix://", "absolute path"),
            ("unix://host/run/csi.sock", "absolute path"),
            ("tcp://127.0.0.1:10000", "only unix domain sockets"),
            ("dns:///csi", "only unix domain sockets"),
            ("csi.sock", "must be absolute"),
            ("unix:csi.sock", "must be absolute"),
        ] {
            let error = Endpoint::parse(address).unwrap_err().to_string();
            assert!(error.contains(why), "{address:?}: {error}");
            assert!(
                error.contains(&format!("{address:?}")),
                "{address:?}: {error}"
            );
        }
    }

    #[test]
    fn socket_path_limit() {
        let longest = format!("/{}", "a".repeat(MAX_SOCKET_PATH_BYTES - 1));
        assert!(Endpoint::parse(&longest).is_ok());
        let too_long = format!("/{}", "a".repeat(MAX_SOCKET_PATH_BYTES));
        let error = Endpoint::parse(&too_long).unwrap_err().to_string();
        assert!(error.contains("108"), "{error}");
    }
}
