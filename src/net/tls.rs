//! TLS configuration: for upstreams, rustls clients with the ring provider, the webpki
//! roots, and per provider an optional extra CA bundle for private endpoints; for the
//! listener, the server certificate of `server.tls_cert_file`/`tls_key_file` (ALPN
//! `http/1.1`). Built at start-up and on each reload, shared read-only by every shard.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::RootCertStore;

use crate::config::{Config, ProviderId};

/// One TLS configuration per provider (providers without an extra CA share the default).
#[derive(Debug)]
pub struct TlsConfigs {
    default: Arc<ClientConfig>,
    /// Indexed by provider id.
    per_provider: Vec<Arc<ClientConfig>>,
    /// The listener's server configuration (`None`: plain HTTP).
    pub listener: Option<Arc<rustls::ServerConfig>>,
}

impl TlsConfigs {
    /// Builds every provider's TLS configuration; an unreadable CA file is an error naming it.
    pub fn build(config: &Config) -> Result<Self, String> {
        let default = Arc::new(client_config(None)?);
        let mut per_provider = vec![default.clone(); config.ids.provider_bound()];
        for p in &config.providers {
            if let Some(path) = &p.ca_file
                && let Some(slot) = per_provider.get_mut(usize::from(p.id.0))
            {
                *slot = Arc::new(
                    client_config(Some(path))
                        .map_err(|e| format!("providers.{}.ca_file: {e}", p.name))?,
                );
            }
        }
        let listener = match &config.server.tls {
            Some(t) => Some(Arc::new(server_config(&t.cert_file, &t.key_file)?)),
            None => None,
        };
        Ok(Self {
            default,
            per_provider,
            listener,
        })
    }

    pub fn for_provider(&self, id: ProviderId) -> Arc<ClientConfig> {
        self.per_provider
            .get(usize::from(id.0))
            .unwrap_or(&self.default)
            .clone()
    }
}

/// The listener's TLS: the PEM chain and key (PKCS#8, PKCS#1 or SEC1), ALPN `http/1.1`.
fn server_config(cert_file: &Path, key_file: &Path) -> Result<rustls::ServerConfig, String> {
    let open = |key: &str, path: &Path| {
        File::open(path)
            .map(BufReader::new)
            .map_err(|e| format!("{key}: cannot open {}: {e}", path.display()))
    };
    let mut certs = Vec::new();
    for cert in rustls_pemfile::certs(&mut open("server.tls_cert_file", cert_file)?) {
        certs.push(cert.map_err(|e| {
            format!(
                "server.tls_cert_file: bad PEM in {}: {e}",
                cert_file.display()
            )
        })?);
    }
    if certs.is_empty() {
        return Err(format!(
            "server.tls_cert_file: no certificate found in {}",
            cert_file.display()
        ));
    }
    let key = rustls_pemfile::private_key(&mut open("server.tls_key_file", key_file)?)
        .map_err(|e| {
            format!(
                "server.tls_key_file: bad PEM in {}: {e}",
                key_file.display()
            )
        })?
        .ok_or_else(|| {
            format!(
                "server.tls_key_file: no private key found in {}",
                key_file.display()
            )
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls_key_file: the key does not fit the certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

fn client_config(extra_ca: Option<&Path>) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca {
        let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let mut reader = BufReader::new(file);
        let mut added = 0usize;
        for cert in rustls_pemfile::certs(&mut reader) {
            let cert = cert.map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("bad certificate in {}: {e}", path.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!("no certificate found in {}", path.display()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}
