//! `TlsConfig`: the CA to trust, the client's identity and the name to
//! verify, for `etcds://` and the builder; `Debug` never shows key material.

use std::fmt;

/// TLS settings: the CA that signed the servers' certificates, an optional
/// client identity (for `--client-cert-auth`) and the name to verify.
#[derive(Clone, Default)]
pub struct TlsConfig {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

impl TlsConfig {
    /// TLS verified against the platform's trust roots (webpki roots).
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts only this CA certificate (PEM).
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate and private key (both PEM).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity_pem = Some((cert.into(), key.into()));
        self
    }

    /// Verifies the servers' certificates against this name instead of the
    /// endpoint's host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key material.
        f.debug_struct("TlsConfig")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_identity", &self.identity_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}
