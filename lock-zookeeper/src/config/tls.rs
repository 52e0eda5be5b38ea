//! TLS settings of a `zks://` configuration: the CA every server's
//! certificate must chain to (and be issued for the host the connect string
//! names), and a client certificate to present where the servers ask for
//! one (`ssl.clientAuth=need`). All PEM, checked when given, so a bad file
//! is an [`InvalidConfig`](LockError::InvalidConfig) at the builder call,
//! not a failed handshake at connect.

use std::fmt;
use std::sync::Arc;

use lockcore::LockError;
use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use zookeeper_client as zk;

/// The PEM given so far, and what the client and the connect diagnosis
/// build from it.
#[derive(Clone)]
pub(crate) struct Tls {
    ca_pem: String,
    identity: Option<(String, String)>,
    /// What `zookeeper-client` connects with.
    pub(crate) options: zk::TlsOptions,
    /// The same trust and identity for this adapter's own handshake, which
    /// says why the client got no session (it only reports that).
    pub(crate) diagnosis: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// Trusts the CA certificates in `ca_pem` (only them), keeping the
    /// client identity of `previous`, if any.
    pub(crate) fn with_ca(previous: Option<Tls>, ca_pem: &[u8]) -> Result<Tls, LockError> {
        let ca_pem = utf8("the root CA", ca_pem)?;
        Tls::build(ca_pem, previous.and_then(|tls| tls.identity))
    }

    /// Also presents `cert_pem` (leaf first), proven with `key_pem`.
    pub(crate) fn with_identity(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Tls, LockError> {
        let cert_pem = utf8("the client certificate", cert_pem)?;
        let key_pem = utf8("the client key", key_pem)?;
        Tls::build(self.ca_pem.clone(), Some((cert_pem, key_pem)))
    }

    fn build(ca_pem: String, identity: Option<(String, String)>) -> Result<Tls, LockError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates("the root CA", &ca_pem)? {
            roots.add(cert).map_err(|e| {
                LockError::config(format!("the root CA is not a usable CA certificate: {e}"))
            })?;
        }
        let builder =
            rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| LockError::config(format!("no TLS protocol version to offer: {e}")))?
                .with_root_certificates(roots);
        let mut options = zk::TlsOptions::new()
            .with_pem_ca(&ca_pem)
            .map_err(|e| LockError::config(format!("the root CA is not usable: {e}")))?;
        let diagnosis = match &identity {
            None => builder.with_no_client_auth(),
            Some((cert_pem, key_pem)) => {
                let chain = certificates("the client certificate", cert_pem)?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
                    LockError::config(format!(
                        "the client key is not a usable PEM private key: {e}"
                    ))
                })?;
                // The error names the mismatch, never the key.
                let config = builder.with_client_auth_cert(chain, key).map_err(|e| {
                    LockError::config(format!(
                        "the client key does not fit the client certificate: {e}"
                    ))
                })?;
                options = options.with_pem_identity(cert_pem, key_pem).map_err(|_| {
                    LockError::config("the client certificate or key is not usable PEM")
                })?;
                config
            }
        };
        Ok(Tls {
            ca_pem,
            identity,
            options,
            diagnosis: Arc::new(diagnosis),
        })
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field(
                "client_identity",
                &self.identity.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// `pem` as text (the client reads PEM as `&str`).
fn utf8(what: &str, pem: &[u8]) -> Result<String, LockError> {
    String::from_utf8(pem.to_vec())
        .map_err(|_| LockError::config(format!("{what} is not PEM text (not UTF-8)")))
}

/// The certificates in `pem`: at least one, each well-formed.
fn certificates(what: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, LockError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LockError::config(format!("{what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(LockError::config(format!(
            "{what} PEM holds no `BEGIN CERTIFICATE` block"
        )));
    }
    Ok(certs)
}

/// TLS needs a rustls crypto provider for the process: installs ring's
/// unless the process already chose one (`zookeeper-client` asks for the
/// process's provider, and with two compiled in none is chosen for it).
pub(crate) fn install_provider() {
    let _ = ring::default_provider().install_default();
}
