//! TLS on the links between hosts (`docs/security.md`, "TLS").
//!
//! A cluster has its own certificate authority, made by `strata init`:
//! every service presents a certificate the CA issued for its host's
//! addresses, and every client trusts that CA alone (not the system's
//! roots), so a certificate from anywhere else is refused. Clients prove
//! who they are with tokens, not certificates. TLS 1.3 only: both ends are
//! Strata or tools that speak it.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The certificate authority's name in every certificate it issues.
const CA_NAME: &str = "Strata cluster CA";

/// A service's TLS files (the `[tls]` section of its config).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The cluster CA's certificate (PEM): the only root its clients trust.
    pub ca: PathBuf,
    /// This host's certificate (PEM), issued by the CA.
    pub cert: PathBuf,
    /// Its private key (PKCS#8 PEM), private to its owner (else refused).
    pub key: PathBuf,
}

impl TlsConfig {
    /// The server side: this host's certificate and key.
    pub fn server(&self) -> Result<ServerTls, TlsError> {
        ServerTls::load(&self.cert, &self.key)
    }

    /// The client side: trusts the cluster CA.
    pub fn client(&self) -> Result<ClientTls, TlsError> {
        ClientTls::load(&self.ca)
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("making a certificate: {0}")]
    Generate(String),
}

fn invalid(path: &Path, message: impl ToString) -> TlsError {
    TlsError::Invalid { path: path.to_path_buf(), message: message.to_string() }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The server side of TLS: a host's certificate chain and key.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
}

impl ServerTls {
    /// From PEM text; `what` names it in errors.
    pub fn from_pem(cert: &[u8], key: &[u8], what: &Path) -> Result<ServerTls, TlsError> {
        let chain = certificates(cert, what)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| invalid(what, format!("the key: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| invalid(what, e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid(what, e))?;
        Ok(ServerTls { config: Arc::new(config) })
    }

    /// From a certificate file and a key file; the key must be private to
    /// its owner ([`crate::auth::read_private`]).
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        let key_pem =
            crate::auth::read_private(key).map_err(|source| TlsError::Read { path: key.to_path_buf(), source })?;
        ServerTls::from_pem(&read(cert)?, &key_pem, cert)
    }

    /// Completes the server side of a handshake on `tcp`.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        tokio_rustls::TlsAcceptor::from(self.config.clone()).accept(tcp).await
    }
}

/// The client side of TLS: trusts the cluster CA only.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    /// The CA's certificates, for HTTP clients that build their own configuration.
    roots: Arc<Vec<CertificateDer<'static>>>,
}

impl ClientTls {
    /// From the CA's certificate (PEM); `what` names it in errors.
    pub fn from_pem(ca: &[u8], what: &Path) -> Result<ClientTls, TlsError> {
        let certs = certificates(ca, what)?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &certs {
            roots.add(cert.clone()).map_err(|e| invalid(what, e))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| invalid(what, e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls { config: Arc::new(config), roots: Arc::new(certs) })
    }

    pub fn load(ca: &Path) -> Result<ClientTls, TlsError> {
        ClientTls::from_pem(&read(ca)?, ca)
    }

    /// Completes the client side of a handshake on `tcp` with the server
    /// at `host` (a name or an address its certificate must list).
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        tokio_rustls::TlsConnector::from(self.config.clone()).connect(server_name(host)?, tcp).await
    }

    /// A blocking client connection on `tcp` (the handshake runs with the
    /// first read or write, under the socket's timeouts).
    pub fn connect_blocking(&self, host: &str, tcp: std::net::TcpStream) -> io::Result<BlockingStream> {
        let conn = rustls::ClientConnection::new(self.config.clone(), server_name(host)?).map_err(io::Error::other)?;
        Ok(BlockingStream::TlsClient(Box::new(rustls::StreamOwned::new(conn, tcp))))
    }

    /// The same trust for an HTTP client (`ureq`).
    pub fn http(&self) -> ureq::tls::TlsConfig {
        let roots = self.roots.iter().map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned()).collect();
        ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)))
            .unversioned_rustls_crypto_provider(provider())
            .build()
    }
}

/// The name a server's certificate must carry: `host` of `host:port`, an
/// IP address or a DNS name.
fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is no server name: {e}")))
}

/// The host part of `host:port` (`[v6]:port` too).
pub fn host_of(address: &str) -> &str {
    match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => address,
    }
}

/// A connection, in plaintext or TLS (either side).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP connection underneath (for socket options and addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// Connects to `address`, with TLS when `tls` is given.
    pub async fn connect(address: &str, tls: Option<&ClientTls>) -> io::Result<Stream> {
        let tcp = TcpStream::connect(address).await?;
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok(Stream::Plain(tcp)),
            Some(tls) => Ok(Stream::Tls(Box::new(tls.connect(host_of(address), tcp).await?.into()))),
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_tls() { "tls" } else { "plain" };
        write!(f, "Stream({kind}, {:?})", self.tcp().peer_addr().ok())
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({} roots)", self.roots.len())
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl From<tokio_rustls::server::TlsStream<TcpStream>> for Stream {
    fn from(s: tokio_rustls::server::TlsStream<TcpStream>) -> Stream {
        Stream::Tls(Box::new(s.into()))
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// A blocking connection, in plaintext or TLS (either side), for the
/// threads that serve proposers and receive WAL. Timeouts are the socket's.
pub enum BlockingStream {
    Plain(std::net::TcpStream),
    TlsClient(Box<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>>),
    TlsServer(Box<rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>>),
}

impl BlockingStream {
    /// The TCP connection underneath (timeouts, shutdown).
    pub fn tcp(&self) -> &std::net::TcpStream {
        match self {
            BlockingStream::Plain(s) => s,
            BlockingStream::TlsClient(s) => &s.sock,
            BlockingStream::TlsServer(s) => &s.sock,
        }
    }

    /// A blocking stream of an async one, with the TLS state it had (the
    /// handshake done, any bytes decrypted but not yet read kept).
    pub fn from_async(stream: Stream) -> io::Result<BlockingStream> {
        let blocking = |tcp: TcpStream| -> io::Result<std::net::TcpStream> {
            let tcp = tcp.into_std()?;
            tcp.set_nonblocking(false)?;
            Ok(tcp)
        };
        Ok(match stream {
            Stream::Plain(tcp) => BlockingStream::Plain(blocking(tcp)?),
            Stream::Tls(tls) => match *tls {
                tokio_rustls::TlsStream::Client(s) => {
                    let (tcp, conn) = s.into_inner();
                    BlockingStream::TlsClient(Box::new(rustls::StreamOwned::new(conn, blocking(tcp)?)))
                }
                tokio_rustls::TlsStream::Server(s) => {
                    let (tcp, conn) = s.into_inner();
                    BlockingStream::TlsServer(Box::new(rustls::StreamOwned::new(conn, blocking(tcp)?)))
                }
            },
        })
    }
}

impl io::Read for BlockingStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Plain(s) => s.read(buf),
            BlockingStream::TlsClient(s) => s.read(buf),
            BlockingStream::TlsServer(s) => s.read(buf),
        }
    }
}

impl io::Write for BlockingStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Plain(s) => s.write(buf),
            BlockingStream::TlsClient(s) => s.write(buf),
            BlockingStream::TlsServer(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            BlockingStream::Plain(s) => s.flush(),
            BlockingStream::TlsClient(s) => s.flush(),
            BlockingStream::TlsServer(s) => s.flush(),
        }
    }
}

/// A new certificate authority: its certificate and private key (PEM).
pub fn generate_ca() -> Result<(String, String), TlsError> {
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let cert = ca_params().self_signed(&key).map_err(|e| TlsError::Generate(e.to_string()))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The CA's parameters. An issuer needs only its name, key usages and key
/// identifier method, so the same parameters rebuild the issuer from its
/// key alone when certificates are issued later.
fn ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, CA_NAME);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    // Long-lived: a cluster replaces its CA when it rotates its keys, not
    // when a date passes.
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2060, 1, 1);
    p
}

/// A certificate for a host with these names (IP addresses or DNS names),
/// issued by the CA whose key is `ca_key_pem`: the certificate and a new
/// private key (PEM).
pub fn issue(ca_key_pem: &str, names: &[String]) -> Result<(String, String), TlsError> {
    let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let ca_key = rcgen::KeyPair::from_pem(ca_key_pem).map_err(gen)?;
    let issuer = rcgen::Issuer::new(ca_params(), ca_key);
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(gen)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, names.first().map_or("strata", String::as_str));
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = ca_params().not_after;
    let key = rcgen::KeyPair::generate().map_err(gen)?;
    let cert = params.signed_by(&key, &issuer).map_err(gen)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests;
