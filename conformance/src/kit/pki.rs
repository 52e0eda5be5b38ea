//! Throwaway certificates for TLS tests against launched stores: a private
//! CA, a server certificate for loopback and a client certificate, all made
//! in memory with `rcgen` and handed out as PEM. Every test gets its own CA,
//! so "a CA the client does not trust" is just another `TestCa`.

use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// `err` and every source under it, joined by ` / `: what a TLS refusal
/// test matches its cause in (`UnknownIssuer`, `not valid for name`),
/// which client libraries nest a few sources deep.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause}"));
        source = cause.source();
    }
    text
}

/// Asserts that `err` is a final refusal naming `cause`: a
/// [`LockError::Store`](lockcore::LockError::Store), not retryable (no
/// retry fixes a certificate), with `cause` in its [`error_chain`].
#[track_caller]
pub fn assert_refused_for(err: &lockcore::LockError, cause: &str) {
    assert!(
        matches!(err, lockcore::LockError::Store { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    let chain = error_chain(err);
    assert!(chain.contains(cause), "not naming {cause:?}: {chain}");
}

/// A certificate and its private key, as PEM.
#[derive(Clone)]
pub struct Identity {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl Identity {
    /// Writes the certificate and the key as PEM files `dir/{stem}.pem`
    /// and `dir/{stem}-key.pem` (the form URLs name: `tls_cert`, `tls_key`).
    pub fn write(&self, dir: &Path, stem: &str) -> io::Result<(PathBuf, PathBuf)> {
        let (cert, key) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}-key.pem")),
        );
        std::fs::write(&cert, &self.cert)?;
        std::fs::write(&key, &self.key)?;
        Ok((cert, key))
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

/// A self-signed certificate authority that issues test certificates.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    /// A new CA; `name` is its common name (shown in TLS errors).
    pub fn new(name: &str) -> TestCa {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).expect("no subject names to validate");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key generation");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-signing a CA"),
        }
    }

    /// The CA certificate, for clients (and servers checking clients) to trust.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes [`pem`](Self::pem) to `dir/{name}` (the file a URL's `tls_ca`
    /// names).
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, self.pem())?;
        Ok(path)
    }

    /// A server certificate for `127.0.0.1` and `localhost`. No extended key
    /// usage, so a server may also present it as a client (etcd's gateway
    /// does).
    pub fn server(&self) -> Identity {
        self.issue(&["127.0.0.1", "localhost"], "distlock test server")
    }

    /// A server certificate for `names` only (no extended key usage): for
    /// a server a client reaches under another name, which must be refused.
    pub fn server_for(&self, names: &[&str]) -> Identity {
        self.issue(names, "distlock test server")
    }

    /// A client certificate (no subject names).
    pub fn client(&self) -> Identity {
        self.issue(&[], "distlock test client")
    }

    fn issue(&self, names: &[&str], common_name: &str) -> Identity {
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("valid subject names");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("key generation");
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        Identity {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}
