//! TLS for `--listen` (`--tls-cert-file`, `--tls-key-file`): with `--api-auth kubernetes`, clients
//! send bearer tokens, which must not cross the node's network in clear.
//!
//! rustls with the ring provider (already in the tree through the Kubernetes client); the
//! certificate chain and key are read from PEM files at start. The kubelet's probes of the agent
//! and of pods have listeners of their own and stay plain HTTP, as httpGet probes default to.

use std::{path::Path, sync::Arc};

use rustls_pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
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
}

/// An acceptor serving the chain in `cert` with the key in `key` (PEM files).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|source| TlsError::Certificates { path: cert.display().to_string(), source })?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|source| TlsError::Key { path: key.display().to_string(), source })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
