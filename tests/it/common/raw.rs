//! A raw HTTP/1.1 client over TCP, for tests that must see the wire: keep-alive reuse,
//! `Connection: close`, malformed requests, clients that send slowly or not at all.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

/// A response as read off the wire.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the server said it closes the connection after this response.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A GET of `path` for `host`, keep-alive (HTTP/1.1's default).
pub fn get(host: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
}

/// Connects to `addr` from `source` (any port), e.g. 127.0.0.2 to be another client IP.
pub async fn connect_from(source: IpAddr, addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = if source.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}

/// Reads one response. A connection closed before the first byte is an
/// `UnexpectedEof` error, like any other cut.
pub async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R) -> io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before a response",
        ));
    }
    let status = line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("status line {line:?}"))
        })?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cut in the header",
            ));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(len) = resp.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "content-length"))?;
        resp.body.resize(len, 0);
        r.read_exact(&mut resp.body).await?;
    } else if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "chunk size"))?;
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).await?;
            if size == 0 {
                break;
            }
            resp.body.extend_from_slice(&chunk[..size]);
        }
    } else if resp.closes() {
        r.read_to_end(&mut resp.body).await?;
    }
    Ok(resp)
}

/// Sends `request` on a fresh connection and reads the response.
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> io::Result<Response> {
    let mut s = BufReader::new(TcpStream::connect(addr).await?);
    s.get_mut().write_all(request).await?;
    read_response(&mut s).await
}

/// Whether the peer closes (EOF or reset) within `limit`; data read meanwhile is dropped.
pub async fn closed_within<R: tokio::io::AsyncRead + Unpin>(r: &mut R, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let wait = async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, wait).await.is_ok()
}
