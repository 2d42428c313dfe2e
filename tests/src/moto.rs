//! A real S3 server on loopback for the COSI scenarios: moto in server mode with IAM
//! enforcement on (`INITIAL_NO_AUTH_ACTION_COUNT`: after the set-up's calls, every request must
//! be signed by a key IAM knows and allows), and its administrator, as cosi-s3 runs it. `make
//! test` installs moto (scripts/install-moto.sh); elsewhere a scenario that needs it says so
//! and skips, but under CI=true it fails.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cosi_s3::client::AwsClient;
use cosi_s3::sigv4::Credentials;

/// A running moto_server, stopped when dropped.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    pub endpoint: http::Uri,
    /// The administrator cosi-s3 runs as (allowed everything).
    pub admin: AwsClient,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls made before IAM enforcement starts: the administrator's user, policy and key.
const SET_UP_CALLS: &str = "3";

pub fn keys(id: &str, secret: &str) -> Credentials {
    Credentials {
        access_key_id: id.into(),
        secret_access_key: secret.into(),
    }
}

impl Moto {
    /// Starts moto, or `None` (a skip, said on stderr) where it is not installed outside CI.
    pub async fn start() -> Option<Self> {
        let server = std::env::var_os("MOTO_SERVER")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../.tools/moto/bin/moto_server")
            });
        if !server.exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{} is missing under CI: make test installs it (scripts/install-moto.sh)",
                server.display()
            );
            eprintln!(
                "SKIPPED: needs moto (scripts/install-moto.sh, or MOTO_SERVER=/path/to/moto_server)"
            );
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", SET_UP_CALLS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let endpoint: http::Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let anyone = AwsClient::new(
            endpoint.clone(),
            endpoint.clone(),
            "us-east-1",
            keys("set-up", "set-up"),
        )
        .expect("a client");
        let mut moto = Self {
            child,
            endpoint,
            admin: anyone.clone(),
        };
        let mut listening = false;
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                listening = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(listening, "moto_server did not listen on {port}");
        anyone
            .iam("CreateUser", &[("UserName", "cosi-admin")])
            .await
            .expect("CreateUser");
        let everything = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#;
        anyone
            .iam(
                "PutUserPolicy",
                &[
                    ("UserName", "cosi-admin"),
                    ("PolicyName", "all"),
                    ("PolicyDocument", everything),
                ],
            )
            .await
            .expect("PutUserPolicy");
        let answer = anyone
            .iam("CreateAccessKey", &[("UserName", "cosi-admin")])
            .await
            .expect("CreateAccessKey");
        let value = |tag| cosi_s3::client::xml_values(&answer, tag).remove(0);
        moto.admin =
            anyone.with_credentials(keys(&value("AccessKeyId"), &value("SecretAccessKey")));
        Some(moto)
    }
}
