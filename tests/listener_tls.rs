//! Listener TLS: with `server.tls_cert_file` / `tls_key_file` the gateway speaks TLS (ALPN
//! `http/1.1`) to clients that verify its certificate; SIGHUP loads a renewed certificate;
//! a non-loopback listener without TLS is warned about.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use support::{Gateway, TempDir, eventually, run_check, secs};

/// A CA and a leaf for `localhost` / `127.0.0.1`: (CA PEM, leaf chain PEM, leaf key PEM).
fn material() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "listener test CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key).unwrap();
    (ca_cert.pem(), leaf_cert.pem(), leaf_key.serialize_pem())
}

fn config(cert: &std::path::Path, key: &std::path::Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
tls_cert_file = "{}"
tls_key_file = "{}"

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "mock"
format = "mock"

[[connections]]
id = "m"
provider = "mock"
"#,
        cert.display(),
        key.display()
    )
}

/// One HTTPS request with a client that trusts only `ca_pem` and offers ALPN http/1.1:
/// (negotiated ALPN, raw response) or the TLS/IO error.
fn https(
    addr: SocketAddr,
    ca_pem: &str,
    request: &str,
) -> Result<(Option<Vec<u8>>, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).map_err(|e| e.to_string())?;
    Ok((
        tls.conn.alpn_protocol().map(<[u8]>::to_vec),
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// `workers` in [`config`].
const SHARDS: usize = 2;
/// What a shard logs (DEBUG) when it adopts a reloaded configuration.
const ADOPTED: &str = "reloaded configuration adopted";

const HEALTH: &str = "GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";

#[test]
fn the_listener_speaks_tls_to_a_verifying_client_and_reloads_its_certificate() {
    let dir = TempDir::new("listener-tls");
    let (ca, chain, key) = material();
    let cert_path = dir.write("cert.pem", &chain);
    let key_path = dir.write("key.pem", &key);
    // Each shard adopts a reload as soon as it gets it and says so at DEBUG: the test
    // waits for every shard before it asks that the old certificate is never served again.
    let mut gw = Gateway::start_with_env(
        &config(&cert_path, &key_path),
        &[("TIDEGATE_LOG", "info,tidegate::server=debug")],
    );

    let (alpn, resp) = https(gw.addr(), &ca, HEALTH).unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let body = r#"{"model":"mock/echo","messages":[{"role":"user","content":"over tls"}]}"#;
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer test-key\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (_, resp) = https(gw.addr(), &ca, &chat).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("over tls"), "{resp}");

    // Plain HTTP to the TLS listener gets no HTTP answer.
    let mut plain = TcpStream::connect(gw.addr()).unwrap();
    plain.set_read_timeout(Some(secs(10))).unwrap();
    plain.write_all(HEALTH.as_bytes()).unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));

    // A renewed certificate from another CA: after SIGHUP new connections present it.
    let (ca2, chain2, key2) = material();
    std::fs::write(&cert_path, chain2).unwrap();
    std::fs::write(&key_path, key2).unwrap();
    gw.signal(libc::SIGHUP);
    gw.wait_for_log("configuration reloaded", secs(10));
    eventually(secs(10), "both shards to adopt the reload", || {
        (gw.logs().matches(ADOPTED).count() == SHARDS).then_some(())
    });
    for _ in 0..6 {
        let (_, resp) = https(gw.addr(), &ca2, HEALTH).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
    for _ in 0..6 {
        assert!(
            https(gw.addr(), &ca, HEALTH).is_err(),
            "the old certificate is still served"
        );
    }
}

#[test]
fn a_non_loopback_listener_without_tls_is_warned_about() {
    let cfg = r#"
[server]
listen = "0.0.0.0:8787"

[[client_keys]]
id = "t"
key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

[[providers]]
id = "mock"
format = "mock"

[[connections]]
id = "m"
provider = "mock"
"#;
    let (code, _out, err) = run_check(cfg);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("without TLS"), "{err}");
}

#[test]
fn a_certificate_without_its_key_is_a_config_error() {
    let dir = TempDir::new("listener-tls-half");
    let (_, chain, _) = material();
    let cert = dir.write("cert.pem", &chain);
    let cfg = config(&cert, &cert).replace(&format!("tls_key_file = \"{}\"\n", cert.display()), "");
    let (code, _out, err) = run_check(&cfg);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("server.tls_key_file"), "{err}");
}

/// `check` reads the certificate and key as `serve` does: a file that is there but holds no
/// certificate, or a key that does not fit the certificate, fails `check` (exit 2, naming the
/// key) as it fails `serve` (exit 1) — not `ok` and then a failed start.
#[test]
fn check_reads_the_listener_certificate_and_key_as_serve_does() {
    let dir = TempDir::new("listener-tls-check");
    let (_, chain, key_pem) = material();
    let (_, _, other_key) = material();
    let cert = dir.write("cert.pem", &chain);
    let key = dir.write("key.pem", &key_pem);
    let junk = dir.write("junk.pem", "not a PEM file\n");
    let wrong_key = dir.write("other-key.pem", &other_key);

    let (code, _out, err) = run_check(&config(&cert, &key));
    assert_eq!(code, 0, "{err}");
    let cases = [
        (
            config(&junk, &key),
            "server.tls_cert_file: no certificate found in",
        ),
        (
            config(&cert, &junk),
            "server.tls_key_file: no private key found in",
        ),
        (
            config(&cert, &wrong_key),
            "server.tls_key_file: the key does not fit",
        ),
    ];
    for (cfg, needle) in cases {
        let (code, _out, err) = run_check(&cfg);
        assert_eq!(code, 2, "{needle}: {err}");
        assert!(err.contains(needle), "{needle}: {err}");
        let Err(failure) = Gateway::try_start(&cfg, &[]) else {
            panic!("{needle}: serve started");
        };
        assert_eq!(
            failure.status.and_then(|s| s.code()),
            Some(1),
            "{}",
            failure.logs
        );
        assert!(failure.logs.contains(needle), "{needle}: {}", failure.logs);
    }
}
