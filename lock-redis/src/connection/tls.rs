//! Certificates for `rediss://` beyond the system roots: a private CA to
//! trust, and a client identity for servers with `tls-auth-clients yes`.
//!
//! The PEM is checked when it is given, so a bad file is an
//! [`InvalidConfig`](LockError::InvalidConfig) at the builder call, not a
//! handshake failure at connect.

use lockcore::LockError;
use redis::{ClientTlsConfig, ConnectionAddr, TlsCertificates};
use rustls::crypto::ring;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// The certificates given so far; kept as PEM because the client is rebuilt
/// from all of them each time one is added.
#[derive(Clone, Default)]
pub(crate) struct Certificates {
    root: Option<Vec<u8>>,
    identity: Option<ClientTlsConfig>,
}

impl Certificates {
    /// Whether a private CA replaces the system roots.
    pub(crate) fn has_root(&self) -> bool {
        self.root.is_some()
    }

    /// Whether a client certificate is presented.
    pub(crate) fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// Trusts the CA certificates in `pem` (instead of the system roots).
    pub(crate) fn set_root(&mut self, pem: &[u8]) -> Result<(), LockError> {
        certificates("the root CA", pem)?;
        self.root = Some(pem.to_vec());
        Ok(())
    }

    /// Presents `cert_pem` (leaf first), proven with `key_pem`.
    pub(crate) fn set_identity(
        &mut self,
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<(), LockError> {
        let chain = certificates("the client certificate", cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
            LockError::config(format!(
                "the client key is not a usable PEM private key: {e}"
            ))
        })?;
        CertifiedKey::from_der(chain, key, &ring::default_provider()).map_err(|e| {
            LockError::config(format!(
                "the client key does not fit the client certificate: {e}"
            ))
        })?;
        self.identity = Some(ClientTlsConfig {
            client_cert: cert_pem.to_vec(),
            client_key: key_pem.to_vec(),
        });
        Ok(())
    }

    /// These certificates, for a Redis Cluster client.
    #[cfg(feature = "cluster")]
    pub(crate) fn for_cluster(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.identity.clone(),
            root_cert: self.root.clone(),
        }
    }

    /// `client` with these certificates, for a `rediss://` address only.
    pub(crate) fn apply(&self, client: &redis::Client) -> Result<redis::Client, LockError> {
        let info = client.get_connection_info().clone();
        let ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
            return Err(LockError::config(
                "TLS certificates need a `rediss://` URL; this configuration connects without TLS",
            ));
        };
        let endpoint = format!("rediss://{host}:{port}");
        let certs = TlsCertificates {
            client_tls: self.identity.clone(),
            root_cert: self.root.clone(),
        };
        redis::Client::build_with_tls(info, certs).map_err(|e| {
            LockError::config_caused_by(format!("TLS settings for {endpoint} are unusable"), e)
        })
    }
}

/// The certificates in `pem`: at least one, each well-formed.
fn certificates(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, LockError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LockError::config(format!("{what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(LockError::config(format!(
            "{what} PEM holds no `BEGIN CERTIFICATE` block"
        )));
    }
    Ok(certs)
}

/// `rediss://` needs a rustls crypto provider; installs ring's unless the
/// process already chose one.
pub(crate) fn install_provider() {
    let _ = ring::default_provider().install_default();
}
