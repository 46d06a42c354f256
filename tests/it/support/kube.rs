//! A fake Kubernetes API server for the pod role label: TLS on 127.0.0.1 (an OS port) with an
//! rcgen certificate, a service account directory (token, ca.crt, namespace) in its own temp
//! dir, and a raw HTTP/1.1 reader, so that a test sees exactly what went over the wire.
//! Answers are scripted ([`FakeApiServer::answer_next`]); unscripted requests get 200.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hasync::config::KubernetesConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_util::sync::CancellationToken;

/// The most bytes of one request the fake reads.
const REQUEST_MAX_BYTES: usize = 64 * 1024;
/// How long the fake waits for a whole request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// The fake API server (stopped on drop).
pub struct FakeApiServer {
    pub addr: SocketAddr,
    /// The service account directory.
    pub dir: tempfile::TempDir,
    seen: Arc<Mutex<Vec<Seen>>>,
    answers: Arc<Mutex<VecDeque<(u16, String)>>>,
    stop: CancellationToken,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeApiServer {
    /// Serves on 127.0.0.1; the service account says `namespace` and `token`.
    pub async fn start(namespace: &str, token: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ck.cert.pem()).unwrap();
        std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
        std::fs::write(dir.path().join("namespace"), namespace).unwrap();
        let cert = CertificateDer::from(ck.cert.der().to_vec());
        let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answers: Arc<Mutex<VecDeque<(u16, String)>>> = Arc::new(Mutex::new(VecDeque::new()));
        let stop = CancellationToken::new();
        let (s, a, st) = (Arc::clone(&seen), Arc::clone(&answers), stop.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = st.cancelled() => return,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let (acceptor, s, a) = (acceptor.clone(), Arc::clone(&s), Arc::clone(&a));
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let read = tokio::time::timeout(REQUEST_DEADLINE, read_request(&mut tls));
                    let Ok(Some(req)) = read.await else { return };
                    s.lock().unwrap().push(req);
                    let (code, body) =
                        a.lock().unwrap().pop_front().unwrap_or((200, "{\"kind\":\"Pod\"}".into()));
                    let answer = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self { addr, dir, seen, answers, stop }
    }

    /// `[kubernetes]` of a node labelling pod `pod` through this server.
    pub fn kubernetes_config(&self, pod: &str) -> KubernetesConfig {
        KubernetesConfig {
            role_label: true,
            pod_name: pod.to_owned(),
            api_server: format!("https://{}", self.addr),
            service_account_dir: self.dir.path().to_owned(),
            timeout: Duration::from_secs(3),
            ..KubernetesConfig::default()
        }
    }

    /// The next request is answered `code` with `body`.
    pub fn answer_next(&self, code: u16, body: &str) {
        self.answers.lock().unwrap().push_back((code, body.to_owned()));
    }

    /// Rotates the service account token.
    pub fn set_token(&self, token: &str) {
        std::fs::write(self.dir.path().join("token"), token).unwrap();
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (bounded) until `done` holds for the requests so far, and returns them.
    pub async fn wait_until(&self, within: Duration, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = Instant::now() + within;
        loop {
            let seen = self.seen();
            if done(&seen) {
                return seen;
            }
            assert!(Instant::now() < deadline, "not within {within:?}; requests: {seen:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The label value of the last PATCH of pod `pod`, if any.
    pub fn last_label(&self, pod: &str) -> Option<String> {
        let path = format!("/pods/{pod}");
        self.seen()
            .iter()
            .rev()
            .find(|s| s.path.ends_with(&path))
            .map(|s| s.json()["metadata"]["labels"]["hasync.io/role"].as_str().unwrap().to_owned())
    }
}

/// Reads one HTTP/1.1 request with a Content-Length body; None when the peer sent none.
async fn read_request(io: &mut (impl AsyncReadExt + Unpin)) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > REQUEST_MAX_BYTES {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length && body.len() <= REQUEST_MAX_BYTES {
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Seen { method, path, headers, body })
}
