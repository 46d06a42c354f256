//! The pod's role label (`[kubernetes] role-label`): the node keeps its own pod's label
//! `hasync.io/role` equal to `master` or `slave` as the group's state record names it, so that
//! a Service selecting `hasync.io/role: master` reaches the current master.
//!
//! One request, `PATCH /api/v1/namespaces/{namespace}/pods/{pod}` with a JSON merge patch
//! (`Content-Type: application/merge-patch+json`), over HTTPS (rustls with ring, the API
//! server verified against the service account's `ca.crt`) with the service account's bearer
//! token, read again for every request (projected tokens rotate). A small client on hyper's
//! HTTP/1 connection: no Kubernetes crate.
//!
//! [`run_role_label`] runs in its own task, fed by the member agent's view on a watch channel:
//! a slow or refusing API server never holds the agent's lease renewals. A failed PATCH is
//! logged and retried, waiting [`RETRY_FIRST`] and doubling up to [`RETRY_MAX`]; a change of
//! the wanted label cuts the wait short.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_util::sync::CancellationToken;

use crate::config::KubernetesConfig;
use crate::coordinator::view::{GroupView, RoleLabel};

/// The label the node sets on its pod.
pub const ROLE_LABEL: &str = "hasync.io/role";
/// The first wait after a failed PATCH.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// The most bytes of an answer read (the API server answers the whole pod object).
const ANSWER_MAX_BYTES: usize = 1 << 20;
/// The most characters of an error answer quoted in an error.
const QUOTE_MAX_CHARS: usize = 300;

/// Why the role label could not be set up or set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeError {
    /// What the client needs is not there (names the key or variable to set).
    #[error("kubernetes.role-label: {0}")]
    Setup(String),
    /// A service account file could not be read.
    #[error("cannot read the service account's {what} {}", path.display())]
    Read {
        /// `token`, `ca.crt`, `namespace`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no certificate the TLS client accepts.
    #[error("the service account's CA {}: {reason}", path.display())]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The API server could not be reached or the TLS handshake failed.
    #[error("cannot reach the API server {addr} ({step})")]
    Connect {
        /// host:port.
        addr: String,
        /// `connect` or `TLS handshake`.
        step: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed half-way.
    #[error("the HTTP exchange with the API server {addr} failed")]
    Http {
        /// host:port.
        addr: String,
        /// hyper's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server answered with an error status.
    #[error("the API server answered {status} to PATCH {path}: {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The request path.
        path: String,
        /// The `message` of its Status object, else the start of the answer.
        message: String,
    },
    /// The PATCH took longer than `kubernetes.timeout`.
    #[error("PATCH {path} took longer than kubernetes.timeout ({timeout:?})")]
    Timeout {
        /// The request path.
        path: String,
        /// The bound.
        timeout: Duration,
    },
}

/// Where the label goes and with which credentials: `[kubernetes]` resolved against the
/// environment and the service account's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeTarget {
    /// The API server's host (an IPv6 address without brackets).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The bearer token's file (read at every request).
    pub token_file: PathBuf,
    /// The CA certificates verifying the API server.
    pub ca_file: PathBuf,
    /// Longest one PATCH may take.
    pub timeout: Duration,
}

impl KubeTarget {
    /// Resolves `[kubernetes]`: the API server from `kubernetes.api-server`, else
    /// `KUBERNETES_SERVICE_HOST`/`_PORT`; the pod from `kubernetes.pod-name`, else `POD_NAME`,
    /// else the host name; the namespace from `kubernetes.namespace`, else the service
    /// account's `namespace` file. `env` reads an environment variable (tests pass their own).
    pub fn resolve(
        cfg: &KubernetesConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, KubeError> {
        let (host, port) = api_server(cfg, env)?;
        let dir = &cfg.service_account_dir;
        let namespace = if cfg.namespace.is_empty() {
            let path = dir.join("namespace");
            read_file("namespace", &path)?.trim().to_owned()
        } else {
            cfg.namespace.clone()
        };
        if !crate::config::is_dns_label(&namespace) {
            return Err(KubeError::Setup(format!(
                "namespace {namespace:?} is not a namespace name (kubernetes.namespace, or the \
                 service account's namespace file)"
            )));
        }
        let pod = pod_name(cfg, env)?;
        let target = Self {
            host,
            port,
            namespace,
            pod,
            token_file: dir.join("token"),
            ca_file: dir.join("ca.crt"),
            timeout: cfg.timeout,
        };
        target.token()?;
        Ok(target)
    }

    /// The pod's path on the API server.
    pub fn path(&self) -> String {
        format!("/api/v1/namespaces/{}/pods/{}", self.namespace, self.pod)
    }

    /// host:port, an IPv6 host in brackets.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The bearer token, read now.
    fn token(&self) -> Result<String, KubeError> {
        let token = read_file("token", &self.token_file)?.trim().to_owned();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KubeError::Setup(format!(
                "the service account token {} is empty or holds characters a bearer token \
                 cannot",
                self.token_file.display()
            )));
        }
        Ok(token)
    }
}

fn read_file(what: &'static str, path: &Path) -> Result<String, KubeError> {
    std::fs::read_to_string(path).map_err(|source| KubeError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn api_server(
    cfg: &KubernetesConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, u16), KubeError> {
    if !cfg.api_server.is_empty() {
        return crate::config::api_server_host_port(&cfg.api_server)
            .map_err(|reason| KubeError::Setup(format!("kubernetes.api-server {reason}")));
    }
    let Some(host) = env("KUBERNETES_SERVICE_HOST").filter(|h| !h.is_empty()) else {
        return Err(KubeError::Setup(
            "kubernetes.api-server is empty and KUBERNETES_SERVICE_HOST is not set (not in a \
             pod?): set kubernetes.api-server"
                .into(),
        ));
    };
    let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
    let port = port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
        KubeError::Setup(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))
    })?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    Ok((host, port))
}

fn pod_name(
    cfg: &KubernetesConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, KubeError> {
    let (pod, from) = if !cfg.pod_name.is_empty() {
        (cfg.pod_name.clone(), "kubernetes.pod-name")
    } else if let Some(p) = env("POD_NAME").filter(|p| !p.is_empty()) {
        (p, "POD_NAME")
    } else {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        (host.trim().to_owned(), "the host name")
    };
    if crate::config::is_dns_subdomain(&pod) {
        return Ok(pod);
    }
    Err(KubeError::Setup(format!(
        "pod name {pod:?} (from {from}) is not a pod name: set kubernetes.pod-name, or POD_NAME \
         from the downward API (fieldRef metadata.name)"
    )))
}

/// The merge patch setting the label to `role`.
pub fn patch_body(role: RoleLabel) -> Vec<u8> {
    let patch = serde_json::json!({ "metadata": { "labels": { ROLE_LABEL: role.as_str() } } });
    patch.to_string().into_bytes()
}

/// The HTTPS client of one pod's label.
#[derive(Clone)]
pub struct KubeClient {
    target: KubeTarget,
    tls: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient").field("target", &self.target).finish_non_exhaustive()
    }
}

impl KubeClient {
    /// A client of `target`; reads and checks its CA file now.
    pub fn new(target: KubeTarget) -> Result<Self, KubeError> {
        let ca = |reason: String| KubeError::Ca { path: target.ca_file.clone(), reason };
        let pem = std::fs::read(&target.ca_file).map_err(|source| KubeError::Read {
            what: "ca.crt",
            path: target.ca_file.clone(),
            source,
        })?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| ca(format!("not PEM: {e}")))?;
            roots.add(cert).map_err(|e| ca(format!("a certificate rustls refuses: {e}")))?;
        }
        if roots.is_empty() {
            return Err(ca("no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ca(format!("TLS set-up: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(target.host.clone()).map_err(|e| {
            KubeError::Setup(format!("API server host {:?} is not a TLS name: {e}", target.host))
        })?;
        Ok(Self { target, tls: TlsConnector::from(Arc::new(config)), server_name })
    }

    /// Where the label goes.
    pub fn target(&self) -> &KubeTarget {
        &self.target
    }

    /// PATCHes the pod's label to `role`, within `kubernetes.timeout`.
    pub async fn set_role_label(&self, role: RoleLabel) -> Result<(), KubeError> {
        let path = self.target.path();
        let timeout = self.target.timeout;
        match tokio::time::timeout(timeout, self.patch(&path, patch_body(role))).await {
            Ok(r) => r,
            Err(_) => Err(KubeError::Timeout { path, timeout }),
        }
    }

    async fn patch(&self, path: &str, body: Vec<u8>) -> Result<(), KubeError> {
        let token = self.target.token()?;
        let addr = self.target.authority();
        let connect = |step, source| KubeError::Connect { addr: addr.clone(), step, source };
        let tcp = TcpStream::connect((self.target.host.as_str(), self.target.port))
            .await
            .map_err(|e| connect("connect", e))?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| connect("TLS handshake", e))?;
        let http = |source: Box<dyn std::error::Error + Send + Sync>| KubeError::Http {
            addr: addr.clone(),
            source,
        };
        let io = hyper_util::rt::TokioIo::new(tls);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(io).await.map_err(|e| http(e.into()))?;
        let mut bearer =
            header::HeaderValue::try_from(format!("Bearer {token}")).map_err(|e| http(e.into()))?;
        bearer.set_sensitive(true);
        let request = hyper::Request::builder()
            .method(hyper::Method::PATCH)
            .uri(path)
            .header(header::HOST, &addr)
            .header(header::AUTHORIZATION, bearer)
            .header(header::CONTENT_TYPE, "application/merge-patch+json")
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, concat!("hasync/", env!("CARGO_PKG_VERSION")))
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| http(e.into()))?;
        // The exchange owns the sender: once it has the answer the sender is dropped, and the
        // connection (driven alongside) closes.
        let exchange = async move {
            let answer = sender.send_request(request).await?;
            let status = answer.status();
            let body = Limited::new(answer.into_body(), ANSWER_MAX_BYTES).collect().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body.to_bytes()))
        };
        let (answer, _closed) = tokio::join!(exchange, conn);
        let (status, body) = answer.map_err(http)?;
        if status.is_success() {
            return Ok(());
        }
        Err(KubeError::Refused {
            status: status.as_u16(),
            path: path.to_owned(),
            message: status_message(&body),
        })
    }
}

/// The `message` of a Kubernetes Status answer, else the start of the answer.
fn status_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if let Some(m) = parsed.as_ref().and_then(|v| v.get("message")).and_then(|m| m.as_str()) {
        return m.to_owned();
    }
    let text = String::from_utf8_lossy(body);
    let quoted: String = text.chars().take(QUOTE_MAX_CHARS).collect();
    if quoted.trim().is_empty() { "(no message)".to_owned() } else { quoted }
}

/// Keeps the pod's label equal to the label `view` asks for, until `cancel` (or until the
/// agent's channel closes). The first known label is always PATCHed (the pod may carry the
/// label of a former run); afterwards only changes. A failure is logged and retried (see the
/// module docs).
pub async fn run_role_label(
    client: KubeClient,
    mut view: watch::Receiver<GroupView>,
    cancel: CancellationToken,
) {
    let path = client.target().path();
    let mut applied: Option<RoleLabel> = None;
    let mut wait = RETRY_FIRST;
    loop {
        let wanted = view.borrow_and_update().label();
        if let Some(role) = wanted.filter(|w| Some(*w) != applied) {
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                r = client.set_role_label(role) => r,
            };
            match outcome {
                Ok(()) => {
                    tracing::info!(label = ROLE_LABEL, value = role.as_str(), pod = %path, "pod role label set");
                    applied = Some(role);
                    wait = RETRY_FIRST;
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        label = ROLE_LABEL,
                        value = role.as_str(),
                        retry_in = ?wait,
                        "cannot set the pod role label; retrying"
                    );
                    if !wait_or_relabel(&mut view, role, wait, &cancel).await {
                        return;
                    }
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
            continue;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = view.changed() => if changed.is_err() { return },
        }
    }
}

/// Waits `wait`, or less when the wanted label changes from `tried`. False: stop (cancelled,
/// or the agent's channel closed).
async fn wait_or_relabel(
    view: &mut watch::Receiver<GroupView>,
    tried: RoleLabel,
    wait: Duration,
    cancel: &CancellationToken,
) -> bool {
    let sleep = tokio::time::sleep(wait);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = &mut sleep => return true,
            changed = view.changed() => {
                if changed.is_err() {
                    return false;
                }
                if view.borrow().label() != Some(tried) {
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn service_account(dir: &Path, namespace: &str) {
        std::fs::write(dir.join("token"), "tok-1\n").unwrap();
        std::fs::write(dir.join("namespace"), namespace).unwrap();
    }

    #[test]
    fn the_patch_sets_only_the_label() {
        let body: serde_json::Value =
            serde_json::from_slice(&patch_body(RoleLabel::Master)).unwrap();
        assert_eq!(body, serde_json::json!({"metadata": {"labels": {"hasync.io/role": "master"}}}));
        let body: serde_json::Value =
            serde_json::from_slice(&patch_body(RoleLabel::Slave)).unwrap();
        assert_eq!(body["metadata"]["labels"]["hasync.io/role"], "slave");
    }

    #[test]
    fn the_target_comes_from_the_environment_and_the_service_account() {
        let dir = tempfile::tempdir().unwrap();
        service_account(dir.path(), "brokers\n");
        let cfg = KubernetesConfig {
            role_label: true,
            service_account_dir: dir.path().to_owned(),
            ..KubernetesConfig::default()
        };
        let env = env_of(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("POD_NAME", "hasync-1"),
        ]);
        let t = KubeTarget::resolve(&cfg, &env).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("10.96.0.1", 443));
        assert_eq!(t.path(), "/api/v1/namespaces/brokers/pods/hasync-1");
        assert_eq!(t.authority(), "10.96.0.1:443");
        assert_eq!(t.token().unwrap(), "tok-1");
        assert_eq!(t.ca_file, dir.path().join("ca.crt"));

        // The keys win over the environment; an IPv6 service host.
        let cfg =
            KubernetesConfig { pod_name: "hasync-0".into(), namespace: "other".into(), ..cfg };
        let env6 = env_of(&[("KUBERNETES_SERVICE_HOST", "fd00::1"), ("POD_NAME", "x")]);
        let t = KubeTarget::resolve(&cfg, &env6).unwrap();
        assert_eq!(t.path(), "/api/v1/namespaces/other/pods/hasync-0");
        assert_eq!(t.authority(), "[fd00::1]:443");
        let cfg = KubernetesConfig { api_server: "https://api.example:6443".into(), ..cfg };
        let t = KubeTarget::resolve(&cfg, &env_of(&[])).unwrap();
        assert_eq!(t.authority(), "api.example:6443");
    }

    #[test]
    fn what_is_missing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = KubernetesConfig {
            role_label: true,
            pod_name: "hasync-0".into(),
            service_account_dir: dir.path().to_owned(),
            ..KubernetesConfig::default()
        };
        let e = KubeTarget::resolve(&cfg, &env_of(&[])).unwrap_err().to_string();
        assert!(e.contains("KUBERNETES_SERVICE_HOST is not set"), "{e}");
        let env = env_of(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
        let e = KubeTarget::resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("namespace") && e.contains(&dir.path().display().to_string()), "{e}");
        std::fs::write(dir.path().join("namespace"), "Bad_NS").unwrap();
        let e = KubeTarget::resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("\"Bad_NS\" is not a namespace name"), "{e}");
        std::fs::write(dir.path().join("namespace"), "ns").unwrap();
        let e = KubeTarget::resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("token"), "{e}");
        std::fs::write(dir.path().join("token"), "  \n").unwrap();
        let e = KubeTarget::resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        std::fs::write(dir.path().join("token"), "t").unwrap();
        let bad_pod = KubernetesConfig { pod_name: String::new(), ..cfg.clone() };
        let env = env_of(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1"), ("POD_NAME", "Pod_0")]);
        let e = KubeTarget::resolve(&bad_pod, &env).unwrap_err().to_string();
        assert!(e.contains("\"Pod_0\" (from POD_NAME)"), "{e}");
        let env = env_of(&[("KUBERNETES_SERVICE_HOST", "h"), ("KUBERNETES_SERVICE_PORT", "x")]);
        let e = KubeTarget::resolve(&cfg, &env).unwrap_err().to_string();
        assert!(e.contains("KUBERNETES_SERVICE_PORT \"x\""), "{e}");

        // The CA: missing, then not PEM.
        let env = env_of(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
        let t = KubeTarget::resolve(&cfg, &env).unwrap();
        let e = KubeClient::new(t.clone()).unwrap_err().to_string();
        assert!(e.contains("ca.crt"), "{e}");
        std::fs::write(dir.path().join("ca.crt"), "hello").unwrap();
        let e = KubeClient::new(t).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
    }

    #[test]
    fn error_answers_are_quoted_by_their_message() {
        let status = br#"{"kind":"Status","status":"Failure","message":"pods \"hasync-0\" is forbidden","code":403}"#;
        assert_eq!(status_message(status), "pods \"hasync-0\" is forbidden");
        assert_eq!(status_message(b"upstream down"), "upstream down");
        assert_eq!(status_message(b""), "(no message)");
        assert_eq!(status_message(&[b'x'; 1000]).len(), QUOTE_MAX_CHARS);
    }
}
