//! TLS for `--listen`: with `--api-auth kubernetes`, clients send bearer tokens, which must not
//! cross the node's network in clear.
//!
//! The certificate is the operator's (`--tls-cert-file`, `--tls-key-file`, read from PEM files
//! at start) or, when auth is on and none is given, made here at start: a CA of this agent's own
//! whose key signs one serving certificate and is then dropped, naming every address of the
//! host. The CA certificate is written beside the handoff socket (`serving-ca.crt`), where
//! `status` on the node finds it; clients elsewhere go through the API server's proxy, which
//! does not check it. rustls with the ring provider (already in the tree through the Kubernetes
//! client). The same listener also speaks plain HTTP (`http.rs` tells them apart by the first
//! byte) for Prometheus and host-network pods' probes; the kubelet's probes of the agent and of
//! pods have listeners of their own and stay plain HTTP, as httpGet probes default to.

use std::{net::IpAddr, path::Path, sync::Arc};

use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::{rustls, TlsAcceptor};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file could not be read or holds no certificate.
    #[error("cannot read a PEM certificate chain from {path}")]
    Certificates {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The key file could not be read or holds no private key.
    #[error("cannot read a PEM private key from {path}")]
    Key {
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// rustls refused the pair (the key does not match, an unsupported algorithm).
    #[error("the certificate and key cannot serve TLS")]
    Config(#[source] rustls::Error),
    /// The certificate made at start could not be made.
    #[error("cannot make a serving certificate")]
    Generate(#[source] rcgen::Error),
}

/// A serving certificate made at start, and the CA that signed it.
pub(crate) struct Generated {
    pub acceptor: TlsAcceptor,
    /// The CA's certificate (PEM): what a client trusts to reach this agent.
    pub ca_pem: String,
    /// The names and addresses the serving certificate is valid for.
    pub names: Vec<String>,
}

/// Where `status` looks for the CA of the certificate an agent made (`Generated::ca_pem`), in
/// the agent's `--handoff-dir`.
pub(crate) const GENERATED_CA_FILE: &str = "serving-ca.crt";

/// Makes a CA and a serving certificate it signs for `names` (DNS names and IP addresses), and
/// an acceptor serving it. The CA's key is dropped at once: nothing else can be signed with it.
/// Validity is rcgen's default (a span no agent outlives), since a certificate that expires
/// under a running agent would cut every client off, and a new one is made at every start.
pub(crate) fn generate(names: Vec<String>) -> Result<Generated, TlsError> {
    let ca_key = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(TlsError::Generate)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "lifecycle-agent serving CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(TlsError::Generate)?;
    let key = rcgen::KeyPair::generate().map_err(TlsError::Generate)?;
    let mut params = rcgen::CertificateParams::new(names.clone()).map_err(TlsError::Generate)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "lifecycle-agent");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let certificate = params.signed_by(&key, &ca).map_err(TlsError::Generate)?;
    let chain = vec![certificate.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let acceptor = serving(chain, key)?;
    Ok(Generated { acceptor, ca_pem: ca.pem(), names })
}

/// The names a certificate made at start is valid for: `localhost`, the host's name, the node's
/// name when known, and every address of the host's interfaces (the agent runs in the host's
/// network namespace) or only `listen`'s address when it is bound to one.
pub(crate) fn serving_names(listen: IpAddr, node_name: Option<&str>) -> Vec<String> {
    let mut names = vec!["localhost".to_owned()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(host.trim().to_owned());
    }
    names.extend(node_name.map(str::to_owned));
    let addresses = if listen.is_unspecified() {
        if_addrs::get_if_addrs().map(|interfaces| interfaces.iter().map(|i| i.ip()).collect()).unwrap_or_default()
    } else {
        vec![listen]
    };
    names.extend(addresses.iter().map(IpAddr::to_string));
    names.extend(["127.0.0.1".to_owned(), "::1".to_owned()]);
    // Only what a certificate can carry (a DNS name or an address), each once.
    names.retain(|name| !name.is_empty() && name.len() <= 253 && name.is_ascii());
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

/// An acceptor serving the chain in `cert` with the key in `key` (PEM files).
pub(crate) fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|source| TlsError::Certificates { path: cert.display().to_string(), source })?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|source| TlsError::Key { path: key.display().to_string(), source })?;
    serving(chain, key)
}

fn serving(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Result<TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_certificate_names_the_host_and_its_ca_is_pem() {
        let names = serving_names("0.0.0.0".parse().expect("ip"), Some("node-a"));
        for must in ["localhost", "node-a", "127.0.0.1", "::1"] {
            assert!(names.iter().any(|n| n == must), "{must} in {names:?}");
        }
        let bound = serving_names("10.1.2.3".parse().expect("ip"), None);
        assert!(bound.iter().any(|n| n == "10.1.2.3"));
        let generated = generate(names).expect("generate");
        assert!(generated.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"), "{}", generated.ca_pem);
        assert_eq!(CertificateDer::pem_slice_iter(generated.ca_pem.as_bytes()).count(), 1);
    }
}
