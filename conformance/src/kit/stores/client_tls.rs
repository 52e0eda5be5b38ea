//! TLS on a launched store's client port (etcd, ZooKeeper): the PEM the
//! test made, written into the store's data dir, and readiness over TLS
//! (etcd's `/health`, ZooKeeper's `srvr`): one request and its reply, over
//! a connection that trusts only the test's CA and presents a certificate
//! where the server demands one.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::Probe;

/// TLS on the client port: the server certificate (for 127.0.0.1) and key,
/// and the CA that signed it, all PEM, made by the test (e.g. with rcgen).
/// The launcher writes them into the server's data dir. Peers stay
/// plaintext (loopback only).
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) ca_pem: String,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) client_cert_auth: bool,
    name: Option<String>,
}

impl ClientTls {
    /// Server certificate, its key and the CA certificate (PEM).
    pub fn new(
        ca_pem: impl Into<String>,
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Self {
        ClientTls {
            ca_pem: ca_pem.into(),
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            client_cert_auth: false,
            name: None,
        }
    }

    /// Refuse clients without a certificate signed by the CA (etcd's
    /// `--client-cert-auth`, ZooKeeper's `ssl.clientAuth=need`). The server
    /// certificate must then allow client use too (no extended key usage,
    /// or `clientAuth`, as [`TestCa::server`](crate::kit::pki::TestCa::server)):
    /// the readiness probe (and etcd's own HTTP gateway) present it.
    pub fn client_cert_auth(mut self) -> Self {
        self.client_cert_auth = true;
        self
    }

    /// The name the server certificate is issued for, when it is not
    /// 127.0.0.1: the readiness probe checks the certificate for it (a
    /// test of clients that dial another name).
    pub fn issued_for(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A probe that sends `request` over TLS (trusting only the CA,
    /// presenting the server's certificate where clients must present one,
    /// checking the server's certificate for [`issued_for`](Self::issued_for),
    /// default the address dialled) and judges the reply with `ready`.
    pub(crate) fn probe(
        &self,
        request: &'static [u8],
        ready: fn(&[u8]) -> bool,
    ) -> io::Result<Probe> {
        let identity = (self.client_cert_auth).then_some((&*self.cert_pem, &*self.key_pem));
        probe(&self.ca_pem, identity, self.name.as_deref(), request, ready)
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("ClientTls")
            .field("client_cert_auth", &self.client_cert_auth)
            .field("issued_for", &self.name)
            .finish_non_exhaustive()
    }
}

/// Writes `pem` to `dir/name` with `mode` (a key owner-only).
pub(crate) fn write_pem(dir: &Path, name: &str, pem: &str, mode: u32) -> io::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, pem)?;
    super::set_mode(&path, mode)?;
    Ok(path)
}

fn probe(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    name: Option<&str>,
    request: &'static [u8],
    ready: fn(&[u8]) -> bool,
) -> io::Result<Probe> {
    let name = match name {
        Some(name) => Some(
            ServerName::try_from(name.to_owned()).map_err(|e| invalid("probe server name", e))?,
        ),
        None => None,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| invalid("CA PEM", e))?)
            .map_err(|e| invalid("CA certificate", e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert_pem, key_pem)) => {
            let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid("probe certificate PEM", e))?;
            let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                .map_err(|e| invalid("probe key PEM", e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| invalid("probe certificate and key", e))?
        }
        None => builder.with_no_client_auth(),
    };
    let config = Arc::new(config);
    Ok(Box::new(move |addr| {
        let name = (name.clone()).unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        Ok(ready(&exchange(&config, addr, name, request)?))
    }))
}

/// Sends `request` to `addr` over TLS and reads the reply to its end.
fn exchange(
    config: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    name: ServerName<'static>,
    request: &[u8],
) -> io::Result<Vec<u8>> {
    let timeout = Duration::from_millis(500);
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, stream);
    tls.write_all(request)?;
    let mut reply = Vec::new();
    // An EOF without close_notify after the reply is still a reply.
    if let Err(e) = tls.read_to_end(&mut reply)
        && reply.is_empty()
    {
        return Err(e);
    }
    Ok(reply)
}

fn invalid(what: &str, e: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
}
