//! The TLS server and client of `csi_grpc::tls` over real TCP connections: a tonic service
//! behind `incoming`, reached with `connect`; the certificate follows its files; the flags
//! restrict what a client may negotiate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_grpc::tls::{self, ReloadingCertificate, ServerTlsOptions};
use csi_proto::csi::v1 as csi;
use csi_proto::csi::v1::identity_server::{Identity, IdentityServer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

struct Plugin;

#[tonic::async_trait]
impl Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: "tls.example.com".to_owned(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// A served Identity on 127.0.0.1 with the key pair at `cert`/`key`; stops with the guard.
struct Served {
    port: u16,
    stop: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(options: &ServerTlsOptions, cert: &Path, key: &Path) -> Served {
    let provider = Arc::new(options.provider());
    let certificate = Arc::new(ReloadingCertificate::load(cert, key, provider).unwrap());
    let config = tls::server_config(options, certificate).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(Plugin))
            .serve_with_incoming_shutdown(
                tls::incoming(listener, config),
                shutdown.cancelled_owned(),
            ),
    );
    Served { port, stop }
}

/// [`serve`] with the `server-1` key pair and the options of these three flag values.
async fn serve_fixture(min_version: &str, cipher_suites: &str, curves: &str) -> Served {
    let options = ServerTlsOptions::parse(min_version, cipher_suites, curves).unwrap();
    serve(
        &options,
        &fixture("server-1.pem"),
        &fixture("server-1-key.pem"),
    )
    .await
}

async fn plugin_name(address: &str, ca: &[u8]) -> Result<String, String> {
    let channel = tls::connect(address, ca)
        .await
        .map_err(|error| format!("{error:?}"))?;
    let response = csi::identity_client::IdentityClient::new(channel)
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .map_err(|status| status.to_string())?;
    Ok(response.into_inner().name)
}

/// The end-entity certificate a plain TLS client is shown, and the version negotiated.
async fn handshake(
    port: u16,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<(CertificateDer<'static>, rustls::ProtocolVersion), std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(fixture("ca.pem")).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    let (_, connection) = stream.get_ref();
    Ok((
        connection.peer_certificates().unwrap()[0]
            .clone()
            .into_owned(),
        connection.protocol_version().unwrap(),
    ))
}

#[tokio::test]
async fn a_client_trusting_the_ca_reaches_the_service_by_name_and_address() {
    let served = serve_fixture("", "", "").await;
    for host in ["localhost", "127.0.0.1"] {
        let name = plugin_name(&format!("{host}:{}", served.port), &pem("ca.pem"))
            .await
            .unwrap();
        assert_eq!(name, "tls.example.com");
    }
}

#[tokio::test]
async fn a_client_trusting_another_ca_is_refused() {
    let served = serve_fixture("", "", "").await;
    let error = plugin_name(&format!("localhost:{}", served.port), &pem("other-ca.pem"))
        .await
        .unwrap_err();
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[tokio::test]
async fn the_certificate_follows_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(fixture("server-1.pem"), &cert).unwrap();
    std::fs::copy(fixture("server-1-key.pem"), &key).unwrap();
    let options = ServerTlsOptions::parse("", "", "").unwrap();
    let served = serve(&options, &cert, &key).await;
    let first = CertificateDer::from_pem_file(fixture("server-1.pem")).unwrap();
    let second = CertificateDer::from_pem_file(fixture("server-2.pem")).unwrap();
    let all = [&rustls::version::TLS13, &rustls::version::TLS12];
    assert_eq!(handshake(served.port, &all).await.unwrap().0, first);

    // Half a rotation (a new certificate, the old key) does not load: the old pair stays.
    std::fs::copy(fixture("server-2.pem"), dir.path().join("new.crt")).unwrap();
    std::fs::rename(dir.path().join("new.crt"), &cert).unwrap();
    assert_eq!(handshake(served.port, &all).await.unwrap().0, first);

    // The other half completes it.
    std::fs::copy(fixture("server-2-key.pem"), dir.path().join("new.key")).unwrap();
    std::fs::rename(dir.path().join("new.key"), &key).unwrap();
    assert_eq!(handshake(served.port, &all).await.unwrap().0, second);
    let name = plugin_name(&format!("localhost:{}", served.port), &pem("ca.pem"))
        .await
        .unwrap();
    assert_eq!(name, "tls.example.com");
}

#[tokio::test]
async fn min_version_tls13_refuses_a_tls12_client() {
    let served = serve_fixture("VersionTLS13", "", "").await;
    assert!(
        handshake(served.port, &[&rustls::version::TLS12])
            .await
            .is_err()
    );
    let (_, version) = handshake(served.port, &[&rustls::version::TLS13])
        .await
        .unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_3);

    let served = serve_fixture("", "", "").await;
    let (_, version) = handshake(served.port, &[&rustls::version::TLS12])
        .await
        .unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_2);
}

#[tokio::test]
async fn cipher_suites_without_an_ecdsa_suite_refuse_tls12_with_this_ecdsa_key() {
    // The fixtures are ECDSA keys: allowing only RSA suites leaves TLS 1.2 nothing to
    // negotiate, while TLS 1.3 (whose suites the setting does not touch) still works.
    let served = serve_fixture("", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "").await;
    assert!(
        handshake(served.port, &[&rustls::version::TLS12])
            .await
            .is_err()
    );
    assert!(
        handshake(served.port, &[&rustls::version::TLS13])
            .await
            .is_ok()
    );
}

#[test]
fn an_unusable_key_pair_is_refused_at_start() {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mismatched = ReloadingCertificate::load(
        fixture("server-1.pem"),
        fixture("server-2-key.pem"),
        Arc::clone(&provider),
    )
    .unwrap_err();
    assert!(
        matches!(mismatched, tls::TlsError::KeyPair { .. }),
        "{mismatched}"
    );
    let missing =
        ReloadingCertificate::load(fixture("absent.pem"), fixture("server-1-key.pem"), provider)
            .unwrap_err();
    assert!(missing.to_string().contains("absent.pem"), "{missing}");
}
