//! TLS for clients (`--tls-cert` and `--tls-key`): the certificate and key
//! are read once at start, and every connection to the text listener and
//! the HTTP listener then begins with a TLS handshake.
//!
//! The handshake runs in the connection's own task, after the connection
//! has its place under the connection limit, never in an accept loop: a
//! client that is slow to shake hands (or never does) holds up only its
//! own connection. [`HANDSHAKE_TIMEOUT`] bounds how long it may hold even
//! that.
//!
//! The crypto is rustls with *ring*, chosen here explicitly rather than
//! taken from the process default, so a server run inside a test process
//! gets the same crypto as the binary.
//!
//! [`client_config`] is the other side, for delayq's own clients (the
//! admin CLI, the load generator): it trusts one PEM file's certificates.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Longest a client may take over its TLS handshake, counted from the
/// accept. The handshake is a round trip or two that any real client makes
/// at once; past this the client is idle or speaking something else, and
/// its connection (and its place under the limit) is let go. Generous
/// enough for a slow link, short enough that a flood of silent sockets
/// cannot hold the server's file descriptors for long; the same bound as
/// HTTP's [`crate::http::HEADER_TIMEOUT`] on a request head.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ALPN protocol the HTTP listener offers: hyper is set up for
/// HTTP/1.1 only, so a client must not be let to pick h2.
const HTTP_ALPN: &[u8] = b"http/1.1";

/// The server's side of TLS, ready to accept clients: one acceptor for the
/// text protocol and one for HTTP, over the same certificate.
#[derive(Clone)]
pub struct Tls {
    /// For the text protocol: no ALPN, as no text client asks for one.
    text: TlsAcceptor,
    /// For HTTP: the same certificate, with ALPN `http/1.1`.
    http: TlsAcceptor,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The acceptors hold the private key: say only that TLS is on.
        f.write_str("Tls")
    }
}

impl Tls {
    /// Reads the certificate chain at `cert` and the private key at `key`
    /// (both PEM; the key PKCS#8, PKCS#1 or SEC1) and checks that they
    /// belong together. An error names the file at fault and why, so a
    /// start-up that fails says what to fix.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, String> {
        let chain = read_chain(cert)?;
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
            pem::Error::NoItemsFound => format!(
                "--tls-key {}: no private key in it (a PEM \"PRIVATE KEY\" block)",
                key.display()
            ),
            e => format!(
                "--tls-key {}: cannot read the key: {}",
                key.display(),
                why(e)
            ),
        })?;
        Tls::new(chain, private).map_err(|e| {
            format!(
                "--tls-cert {} and --tls-key {}: {e}",
                cert.display(),
                key.display()
            )
        })
    }

    /// TLS with the certificate `chain` (the server's own first) and its
    /// private key; an error if the key is not the certificate's.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let text = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => {
                    "the private key does not belong to the certificate".to_string()
                }
                e => format!("unusable certificate or key: {e}"),
            })?;
        let mut http = text.clone();
        http.alpn_protocols = vec![HTTP_ALPN.to_vec()];
        Ok(Tls {
            text: TlsAcceptor::from(Arc::new(text)),
            http: TlsAcceptor::from(Arc::new(http)),
        })
    }

    /// The TLS session with the text-protocol client at `peer` (none on a
    /// Unix domain socket), or `None` if the handshake failed, took longer
    /// than [`HANDSHAKE_TIMEOUT`], or `shutdown` came first.
    pub async fn accept_text<IO>(
        &self,
        socket: IO,
        peer: Option<SocketAddr>,
        shutdown: &CancellationToken,
    ) -> Option<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        handshake(&self.text, socket, peer, shutdown).await
    }

    /// The TLS session with the HTTP client at `peer` (ALPN `http/1.1`),
    /// or `None` as for [`Tls::accept_text`].
    pub async fn accept_http<IO>(
        &self,
        socket: IO,
        peer: SocketAddr,
        shutdown: &CancellationToken,
    ) -> Option<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        handshake(&self.http, socket, Some(peer), shutdown).await
    }
}

/// The TLS session with the client at `peer` through `acceptor`.
///
/// A failed handshake (plaintext on a TLS port, a client that does not
/// trust the certificate, a port scanner) is the client's affair: it is
/// logged at debug only, and dropping the socket closes the connection.
async fn handshake<IO>(
    acceptor: &TlsAcceptor,
    socket: IO,
    peer: Option<SocketAddr>,
    shutdown: &CancellationToken,
) -> Option<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let shaken = tokio::select! {
        shaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)) => shaken,
        () = shutdown.cancelled() => return None,
    };
    match shaken {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            debug!(?peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(?peer, "TLS handshake timed out");
            None
        }
    }
}

/// Longest an ending connection waits to get its close_notify out: a
/// client that has stopped reading must not keep the connection (and its
/// place under the limit) for long, and shutdown waits for it too.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Ends a TLS session with a close_notify, so the client can tell the end
/// from a cut connection (many TLS clients report an end without one as an
/// error), then closes it.
pub async fn close<IO>(mut stream: TlsStream<IO>)
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(CLOSE_WAIT, stream.shutdown()).await;
}

/// The certificates in the PEM file at `path`, the server's own first.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let fail = |e: pem::Error| {
        format!(
            "--tls-cert {}: cannot read the certificate: {}",
            path.display(),
            why(e)
        )
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(fail)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in it (a PEM \"CERTIFICATE\" block)",
            path.display()
        ));
    }
    Ok(chain)
}

/// A PEM error in words: an I/O error's own message (such as "No such file
/// or directory") reads better than the wrapper's.
fn why(e: pem::Error) -> String {
    match e {
        pem::Error::Io(e) => e.to_string(),
        e => e.to_string(),
    }
}

/// A TLS client configuration that trusts the certificates in the PEM file
/// `ca` only: as issuers where the usual checks allow it, else as the
/// server's very certificate, byte for byte (a self-signed certificate
/// marked as a CA, as `openssl req -x509` makes, is refused as a server's
/// own by the usual checks). The error names the file.
pub fn client_config(ca: &Path) -> Result<ClientConfig, String> {
    let why = |e: &dyn fmt::Display| format!("{}: {e}", ca.display());
    let pinned = CertificateDer::pem_file_iter(ca)
        .map_err(|e| why(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| why(&e))?;
    if pinned.is_empty() {
        return Err(why(&"no certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    // One that cannot be a trust anchor is still trusted byte for byte.
    let (_added, _ignored) = roots.add_parsable_certificates(pinned.iter().cloned());
    let issuers = match roots.is_empty() {
        true => None,
        false => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| why(&e))?,
        ),
    };
    let verifier = Trusted {
        issuers,
        pinned,
        algorithms: provider.signature_verification_algorithms,
    };
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| why(&e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// Accepts a server whose certificate is one of `pinned`, byte for byte,
/// or that `issuers` accepts; the handshake's signatures are checked either
/// way.
#[derive(Debug)]
struct Trusted {
    issuers: Option<Arc<WebPkiServerVerifier>>,
    pinned: Vec<CertificateDer<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Trusted {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self
            .pinned
            .iter()
            .any(|c| c.as_ref() == end_entity.as_ref())
        {
            return Ok(ServerCertVerified::assertion());
        }
        match &self.issuers {
            Some(issuers) => issuers.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ),
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
