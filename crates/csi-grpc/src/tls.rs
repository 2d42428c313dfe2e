//! TLS for the suite's gRPC endpoints on TCP (the csi-snapshot-metadata sidecar serves backup
//! applications over TLS), with rustls and its *ring* provider.
//!
//! Server side: [`TlsServerArgs`] (upstream's `--tls-*` flags), [`ServerTlsOptions`] (those
//! flags read with Go's names: `--tls-min-version`, `--tls-cipher-suites`,
//! `--tls-curve-preferences`), [`ReloadingCertificate`] (the key pair, read again when its
//! files change, as upstream's certificate watcher does), [`server_config`] and [`incoming`]
//! (TLS connections for tonic's `serve_with_incoming`).
//!
//! Client side: [`client_config`] trusts a PEM CA bundle (a SnapshotMetadataService's
//! `caCert`), [`connect`] opens a gRPC channel with it.
//!
//! Go's crypto/tls and rustls differ in what they implement; where a name Go accepts has no
//! rustls counterpart (the CBC cipher suites, the curves P-521 and X25519MLKEM768), it is
//! skipped with a warning, and only a list left with nothing usable is an error.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use clap::Args;
use hyper_util::rt::TokioIo;
use rustls::crypto::{CryptoProvider, SupportedKxGroup, ring};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The TLS flags of upstream's external-snapshot-metadata sidecar, for a binary to flatten
/// into its own arguments.
#[derive(Args, Debug, Clone, PartialEq, Default)]
pub struct TlsServerArgs {
    /// Path to the TLS certificate file. Can also be set with the environment variable
    /// TLS_CERT_PATH.
    #[arg(
        long,
        env = "TLS_CERT_PATH",
        default_value = "",
        hide_env_values = true
    )]
    pub tls_cert: String,

    /// Path to the TLS private key file. Can also be set with the environment variable
    /// TLS_KEY_PATH.
    #[arg(long, env = "TLS_KEY_PATH", default_value = "", hide_env_values = true)]
    pub tls_key: String,

    /// Minimum TLS version. Accepted values: VersionTLS12, VersionTLS13. Empty: TLS 1.2.
    #[arg(long, default_value = "")]
    pub tls_min_version: String,

    /// Comma-separated list of allowed TLS 1.2 cipher suites (Go names). Empty: the defaults.
    /// Ignored when a TLS 1.3 connection is negotiated.
    #[arg(long, default_value = "")]
    pub tls_cipher_suites: String,

    /// Comma-separated list of preferred elliptic curves for ECDHE (e.g. X25519,CurveP256).
    /// Empty: the defaults.
    #[arg(long, default_value = "")]
    pub tls_curve_preferences: String,
}

impl TlsServerArgs {
    /// The version, suite and curve settings (the certificate is read by
    /// [`ReloadingCertificate::load`]).
    pub fn options(&self) -> Result<ServerTlsOptions, TlsError> {
        ServerTlsOptions::parse(
            &self.tls_min_version,
            &self.tls_cipher_suites,
            &self.tls_curve_preferences,
        )
    }
}

/// What can go wrong setting up TLS. The flag messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("unsupported TLS version {0:?}, must be one of: VersionTLS12, VersionTLS13")]
    Version(String),
    #[error("unsupported or insecure cipher suite: {0:?}")]
    CipherSuite(String),
    #[error("unsupported curve {0:?}, must be one of: {CURVE_NAMES}")]
    Curve(String),
    #[error("none of the curves {0:?} is implemented here (X25519, CurveP256 and CurveP384 are)")]
    NoCurve(String),
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("no PEM certificate in {0}")]
    NoCertificate(PathBuf),
    #[error("no PEM private key in {path}: {message}")]
    NoKey { path: PathBuf, message: String },
    #[error("the key pair {cert} / {key} is not usable: {source}")]
    KeyPair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("no PEM certificate in the CA bundle")]
    NoCaCertificate,
    #[error("CA bundle: {0}")]
    CaBundle(String),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Go's curve names, sorted, as upstream lists them in its error.
const CURVE_NAMES: &str = "CurveP256, CurveP384, CurveP521, X25519, X25519MLKEM768";

/// What a Go cipher suite name stands for here.
#[derive(Clone, Copy, Debug)]
enum GoSuite {
    /// A TLS 1.3 suite: Go's setting does not apply to TLS 1.3, every TLS 1.3 suite stays on.
    Tls13,
    Tls12(SupportedCipherSuite),
    /// A suite Go calls secure that rustls does not implement (the CBC ones).
    NotImplemented,
}

/// The suites of Go's `tls.CipherSuites()` (the ones it does not call insecure), by name.
fn go_cipher_suite(name: &str) -> Option<GoSuite> {
    use ring::cipher_suite as suite;
    Some(match name {
        "TLS_AES_128_GCM_SHA256" | "TLS_AES_256_GCM_SHA384" | "TLS_CHACHA20_POLY1305_SHA256" => {
            GoSuite::Tls13
        }
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => {
            GoSuite::Tls12(suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
        }
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => {
            GoSuite::Tls12(suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => {
            GoSuite::Tls12(suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)
        }
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => {
            GoSuite::Tls12(suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384)
        }
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            GoSuite::Tls12(suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
        }
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            GoSuite::Tls12(suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
        }
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA" => GoSuite::NotImplemented,
        _ => return None,
    })
}

/// Go's curve names; `None` inside for the ones *ring* does not implement.
fn go_curve(name: &str) -> Option<Option<&'static dyn SupportedKxGroup>> {
    Some(match name {
        "X25519" => Some(ring::kx_group::X25519),
        "CurveP256" => Some(ring::kx_group::SECP256R1),
        "CurveP384" => Some(ring::kx_group::SECP384R1),
        "CurveP521" | "X25519MLKEM768" => None,
        _ => return None,
    })
}

/// The items of a Go comma-separated flag: trimmed, empty ones dropped (as upstream).
fn csv_items(csv: &str) -> impl Iterator<Item = &str> {
    csv.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The server's protocol versions, cipher suites and key exchange groups.
#[derive(Clone)]
pub struct ServerTlsOptions {
    tls13_only: bool,
    /// The TLS 1.2 suites allowed, in preference order; `None`: the provider's.
    tls12_suites: Option<Vec<SupportedCipherSuite>>,
    /// `None`: the provider's.
    kx_groups: Option<Vec<&'static dyn SupportedKxGroup>>,
    /// Names accepted but not implemented here, for a warning.
    not_implemented: Vec<String>,
}

impl fmt::Debug for ServerTlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTlsOptions")
            .field("tls13_only", &self.tls13_only)
            .field(
                "tls12_suites",
                &self
                    .tls12_suites
                    .as_ref()
                    .map(|s| s.iter().map(|s| s.suite()).collect::<Vec<_>>()),
            )
            .field(
                "kx_groups",
                &self
                    .kx_groups
                    .as_ref()
                    .map(|g| g.iter().map(|g| g.name()).collect::<Vec<_>>()),
            )
            .field("not_implemented", &self.not_implemented)
            .finish()
    }
}

impl ServerTlsOptions {
    /// Reads the three flags as upstream does: an empty value keeps the default, an unknown
    /// name is an error.
    pub fn parse(
        min_version: &str,
        cipher_suites: &str,
        curve_preferences: &str,
    ) -> Result<Self, TlsError> {
        let tls13_only = match min_version {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            other => return Err(TlsError::Version(other.to_owned())),
        };
        let mut not_implemented = Vec::new();

        let mut named_suite = false;
        let mut tls12_suites = Vec::new();
        for name in csv_items(cipher_suites) {
            named_suite = true;
            match go_cipher_suite(name).ok_or_else(|| TlsError::CipherSuite(name.to_owned()))? {
                GoSuite::Tls13 => {}
                GoSuite::Tls12(suite) => tls12_suites.push(suite),
                GoSuite::NotImplemented => not_implemented.push(name.to_owned()),
            }
        }

        let mut named_curve = false;
        let mut kx_groups = Vec::new();
        for name in csv_items(curve_preferences) {
            named_curve = true;
            match go_curve(name).ok_or_else(|| TlsError::Curve(name.to_owned()))? {
                Some(group) => kx_groups.push(group),
                None => not_implemented.push(name.to_owned()),
            }
        }
        if named_curve && kx_groups.is_empty() {
            return Err(TlsError::NoCurve(curve_preferences.to_owned()));
        }

        Ok(Self {
            tls13_only,
            tls12_suites: named_suite.then_some(tls12_suites),
            kx_groups: named_curve.then_some(kx_groups),
            not_implemented,
        })
    }

    /// Names the flags accepted (Go implements them) that this implementation skips.
    pub fn not_implemented(&self) -> &[String] {
        &self.not_implemented
    }

    /// True when cipher suites were given although only TLS 1.3 is allowed, which ignores them
    /// (upstream warns about this).
    pub fn suites_ignored(&self) -> bool {
        self.tls13_only && self.tls12_suites.is_some()
    }

    /// The *ring* provider restricted to these options: every TLS 1.3 suite, then the TLS 1.2
    /// suites given (Go's setting applies to TLS 1.2 only).
    pub fn provider(&self) -> CryptoProvider {
        let mut provider = ring::default_provider();
        if let Some(tls12) = &self.tls12_suites {
            provider
                .cipher_suites
                .retain(|suite| suite.version() == &rustls::version::TLS13);
            provider.cipher_suites.extend(tls12.iter().copied());
        }
        if let Some(groups) = &self.kx_groups {
            provider.kx_groups.clone_from(groups);
        }
        provider
    }

    fn versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        if self.tls13_only {
            TLS13_ONLY
        } else {
            rustls::ALL_VERSIONS
        }
    }
}

/// Identity of a file's current content, cheap to read with one `stat` (through symlinks, so
/// a Kubernetes Secret volume's `..data` swap shows as a new inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        })
    }
}

#[derive(Debug)]
struct Loaded {
    stamps: (Option<FileStamp>, Option<FileStamp>),
    key: Arc<CertifiedKey>,
}

/// The server's certificate and key, read from two PEM files and read again at the next
/// handshake after either file changed (a `stat` of each per handshake). A pair that fails to
/// load (half-written, mismatched) keeps the previous one in service, with a warning.
#[derive(Debug)]
pub struct ReloadingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

impl ReloadingCertificate {
    /// Reads the pair; an unusable pair is an error here (upstream's certificate watcher
    /// refuses to start without one).
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let stamps = (
            FileStamp::of(&cert_path).ok(),
            FileStamp::of(&key_path).ok(),
        );
        let key = Arc::new(read_key_pair(&cert_path, &key_path, &provider)?);
        Ok(Self {
            cert_path,
            key_path,
            provider,
            loaded: Mutex::new(Loaded { stamps, key }),
        })
    }

    /// The pair to serve now, reloaded first if a file changed since it was read.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (
            FileStamp::of(&self.cert_path).ok(),
            FileStamp::of(&self.key_path).ok(),
        );
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if loaded.stamps != stamps {
            // Remember the stamps either way: a bad pair is reported once per change, and the
            // next change (the other half of a rotation) is tried again.
            loaded.stamps = stamps;
            match read_key_pair(&self.cert_path, &self.key_path, &self.provider) {
                Ok(key) => {
                    tracing::info!(
                        cert = %self.cert_path.display(),
                        key = %self.key_path.display(),
                        "Reloaded the TLS certificate"
                    );
                    loaded.key = Arc::new(key);
                }
                Err(error) => tracing::warn!(
                    %error,
                    "Keeping the previous TLS certificate: the changed files do not load"
                ),
            }
        }
        Arc::clone(&loaded.key)
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_key_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&read_file(cert_path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| TlsError::NoCertificate(cert_path.to_owned()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_owned()));
    }
    // The key's bytes are secret: errors name the file, never its content.
    let key =
        PrivateKeyDer::from_pem_slice(&read_file(key_path)?).map_err(|error| TlsError::NoKey {
            path: key_path.to_owned(),
            message: error.to_string(),
        })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|source| TlsError::KeyPair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        source,
    })
}

/// The server's TLS configuration: no client certificates (callers authenticate with their
/// token), ALPN `h2` as gRPC clients require.
pub fn server_config(
    options: &ServerTlsOptions,
    certificate: Arc<ReloadingCertificate>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(options.provider()))
        .with_protocol_versions(options.versions())?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How long a client may take to complete its TLS handshake (grpc-go's default
/// ConnectionTimeout, which upstream's server keeps).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(120);

/// Handshakes finished but not yet taken by the server.
const PENDING_CONNECTIONS: usize = 16;

/// A TLS connection accepted by [`incoming`].
#[derive(Debug)]
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The TLS connections of `listener`, for `tonic`'s `serve_with_incoming`. Each handshake runs
/// in its own task (a slow client holds up no one); failed handshakes are logged and dropped,
/// accept errors are passed on (tonic retries the transient ones). Accepting stops when the
/// stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> impl Stream<Item = io::Result<TlsConnection>> + Send + 'static {
    let (sender, receiver) = mpsc::channel(PENDING_CONNECTIONS);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = sender.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote_addr) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    if sender.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                if let Some(connection) = handshake(&acceptor, tcp, remote_addr).await {
                    // A closed receiver means the server stopped: the connection just drops.
                    let _ = sender.send(Ok(connection)).await;
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}

async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    remote_addr: SocketAddr,
) -> Option<TlsConnection> {
    let info = TcpConnectInfo {
        local_addr: tcp.local_addr().ok(),
        remote_addr: Some(remote_addr),
    };
    // Without Nagle's delay, as tonic sets for the connections it accepts itself.
    let _ = tcp.set_nodelay(true);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(TlsConnection { stream, info }),
        Ok(Err(error)) => {
            tracing::debug!(%remote_addr, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%remote_addr, "TLS handshake timed out");
            None
        }
    }
}

/// A client configuration that trusts exactly the CA certificates of a PEM bundle, with ALPN
/// `h2`.
pub fn client_config(ca_bundle_pem: &[u8]) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_bundle_pem) {
        let certificate = certificate.map_err(|error| TlsError::CaBundle(error.to_string()))?;
        roots
            .add(certificate)
            .map_err(|error| TlsError::CaBundle(error.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCaCertificate);
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid address {address:?}: {message}")]
    Address { address: String, message: String },
    #[error("connecting to {address}: {source}")]
    Connect {
        address: String,
        source: tonic::transport::Error,
    },
}

/// A gRPC channel to `address` (`host:port`, a SnapshotMetadataService's `spec.address`) over
/// TLS, verifying the server's certificate for `host` against `ca_bundle_pem`.
pub async fn connect(
    address: &str,
    ca_bundle_pem: &[u8],
) -> Result<tonic::transport::Channel, ConnectError> {
    let invalid = |message: String| ConnectError::Address {
        address: address.to_owned(),
        message,
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{address}"))
        .map_err(|error| invalid(error.to_string()))?;
    let uri = endpoint.uri();
    let host = uri
        .host()
        .ok_or_else(|| invalid("no host".to_owned()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri
        .port_u16()
        .ok_or_else(|| invalid("no port".to_owned()))?;
    let server_name =
        ServerName::try_from(host.clone()).map_err(|error| invalid(error.to_string()))?;
    let connector = TlsConnector::from(client_config(ca_bundle_pem)?);
    let connect = tower::service_fn(move |_| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        let host = host.clone();
        async move {
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    });
    endpoint
        .connect_with_connector(connect)
        .await
        .map_err(|source| ConnectError::Connect {
            address: address.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(options: &ServerTlsOptions) -> Vec<rustls::CipherSuite> {
        options
            .provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect()
    }

    fn groups(options: &ServerTlsOptions) -> Vec<rustls::NamedGroup> {
        options
            .provider()
            .kx_groups
            .iter()
            .map(|g| g.name())
            .collect()
    }

    #[test]
    fn versions_as_upstream() {
        for (flag, tls13_only) in [("", false), ("VersionTLS12", false), ("VersionTLS13", true)] {
            let options = ServerTlsOptions::parse(flag, "", "").unwrap();
            assert_eq!(options.tls13_only, tls13_only, "{flag:?}");
        }
        for bad in ["VersionTLS11", "TLS13", "versiontls13"] {
            let error = ServerTlsOptions::parse(bad, "", "").unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "unsupported TLS version \"{bad}\", must be one of: VersionTLS12, VersionTLS13"
                )
            );
        }
    }

    #[test]
    fn empty_flags_keep_the_provider_defaults() {
        let options = ServerTlsOptions::parse("", "", " , ").unwrap();
        let defaults = ring::default_provider();
        assert_eq!(options.provider().cipher_suites, defaults.cipher_suites);
        assert_eq!(groups(&options).len(), defaults.kx_groups.len());
        assert!(options.not_implemented().is_empty());
    }

    #[test]
    fn cipher_suites_restrict_tls12_only_in_the_given_order() {
        let options = ServerTlsOptions::parse(
            "",
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 , TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256,",
            "",
        )
        .unwrap();
        use rustls::CipherSuite as C;
        assert_eq!(
            suites(&options),
            [
                C::TLS13_AES_256_GCM_SHA384,
                C::TLS13_AES_128_GCM_SHA256,
                C::TLS13_CHACHA20_POLY1305_SHA256,
                C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
                C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            ]
        );
        assert!(!options.suites_ignored());
    }

    #[test]
    fn cbc_suites_are_accepted_and_skipped() {
        let options = ServerTlsOptions::parse(
            "",
            "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            "",
        )
        .unwrap();
        assert_eq!(
            options.not_implemented(),
            ["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]
        );
        assert_eq!(
            suites(&options).last(),
            Some(&rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
        );
    }

    #[test]
    fn insecure_or_unknown_suites_are_refused_with_upstreams_message() {
        for bad in [
            "TLS_RSA_WITH_RC4_128_SHA",
            "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
            "tls_aes_128_gcm_sha256",
        ] {
            let error = ServerTlsOptions::parse("", bad, "").unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("unsupported or insecure cipher suite: \"{bad}\"")
            );
        }
    }

    #[test]
    fn suites_with_tls13_only_are_flagged_as_ignored() {
        let options =
            ServerTlsOptions::parse("VersionTLS13", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "")
                .unwrap();
        assert!(options.suites_ignored());
    }

    #[test]
    fn curves_as_upstream() {
        use rustls::NamedGroup as G;
        let options = ServerTlsOptions::parse("", "", "CurveP384 , X25519").unwrap();
        assert_eq!(groups(&options), [G::secp384r1, G::X25519]);

        let options = ServerTlsOptions::parse("", "", "CurveP521,CurveP256").unwrap();
        assert_eq!(groups(&options), [G::secp256r1]);
        assert_eq!(options.not_implemented(), ["CurveP521"]);

        let error = ServerTlsOptions::parse("", "", "X25519MLKEM768").unwrap_err();
        assert!(matches!(error, TlsError::NoCurve(_)), "{error}");

        let error = ServerTlsOptions::parse("", "", "InvalidCurve").unwrap_err();
        assert_eq!(
            error.to_string(),
            "unsupported curve \"InvalidCurve\", must be one of: CurveP256, CurveP384, CurveP521, X25519, X25519MLKEM768"
        );
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_refused() {
        assert!(matches!(
            client_config(b"not a certificate"),
            Err(TlsError::NoCaCertificate)
        ));
    }
}
