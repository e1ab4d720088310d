//! The HTTPS client instant-acme speaks through: HTTP/1.1 (hyper) over OpenSSL
//! (tokio-openssl), one connection per request (an order makes about ten), every request
//! within [`REQUEST_TIMEOUT`] and every answer at most [`MAX_BODY`] bytes.
//!
//! Why not instant-acme's own client: it brings rustls and a second TLS stack; OpenSSL is
//! already tollgate's, and `tls.acme.ca_roots` is then an OpenSSL trust file like the
//! system's (pebble's test CA in the tests, a corporate CA in front of a private ACME
//! server in production).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::Limited;
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, Error as AcmeError, HttpClient};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use tokio::net::TcpStream;

/// The longest one request (connect, TLS, request, response header) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest answer read: a certificate chain or a directory is a few KB.
pub const MAX_BODY: usize = 1 << 20;

/// An HTTPS client trusting the system's roots, or only those of `ca_roots`.
pub struct Client {
    tls: SslConnector,
}

/// Why the client cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("tls.acme.ca_roots {}: {source}", .file)]
pub struct RootsError {
    file: String,
    source: openssl::error::ErrorStack,
}

impl Client {
    /// A client; `ca_roots`: a PEM file of the roots to trust instead of the system's.
    pub fn new(ca_roots: Option<&Path>) -> Result<Client, RootsError> {
        let err = |source| RootsError {
            file: ca_roots.map_or_else(|| "(system)".to_string(), |p| p.display().to_string()),
            source,
        };
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(err)?;
        match ca_roots {
            Some(file) => b.set_ca_file(file).map_err(err)?,
            None => b.set_default_verify_paths().map_err(err)?,
        }
        b.set_verify(SslVerifyMode::PEER);
        b.set_alpn_protos(b"\x08http/1.1").map_err(err)?;
        Ok(Client { tls: b.build() })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl HttpClient for Client {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, AcmeError>> + Send>> {
        let tls = self.tls.clone();
        Box::pin(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, send(tls, req)).await {
                Ok(Ok(rsp)) => Ok(rsp),
                Ok(Err(e)) => Err(AcmeError::Other(e)),
                Err(_) => Err(AcmeError::Other(
                    format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()).into(),
                )),
            }
        })
    }
}

/// Sends `req` on a new connection to its URI's authority.
async fn send(
    tls: SslConnector,
    req: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, BoxError> {
    let uri = req.uri().clone();
    let host = uri.host().ok_or("the ACME URL has no host")?.to_string();
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("`{uri}` is not an http(s) URL").into()),
    };
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    // A bracketed IPv6 literal connects without its brackets.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = TcpStream::connect((bare, port)).await?;
    let (mut parts, body) = req.into_parts();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = path.parse::<Uri>()?;
    let authority = uri
        .authority()
        .map_or(host.as_str(), |a| a.as_str())
        .to_string();
    parts.headers.insert(http::header::HOST, authority.parse()?);
    let req = Request::from_parts(parts, body);
    if https {
        let ssl = tls.configure()?.into_ssl(bare)?;
        let mut stream = tokio_openssl::SslStream::new(ssl, tcp)?;
        Pin::new(&mut stream).connect().await?;
        exchange(TokioIo::new(stream), req).await
    } else {
        exchange(TokioIo::new(tcp), req).await
    }
}

/// One request and its response on `io`.
async fn exchange<I>(io: I, req: Request<BodyWrapper<Bytes>>) -> Result<BytesResponse, BoxError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        // Ends with the response's body, or at the request's timeout when dropped.
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, conn).await;
    });
    let rsp = sender.send_request(req).await?;
    let (parts, body) = rsp.into_parts();
    Ok(BytesResponse::from(http::Response::from_parts(
        parts,
        Limited::new(body, MAX_BODY),
    )))
}
