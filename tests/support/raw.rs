//! One raw HTTP/1.1 request on a socket of its own, so that nothing rewrites what the test
//! sends: its `Host`, its `Origin`, a path holding `..` or `%2e%2e` (which an HTTP client's URL
//! parser would resolve away before sending).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::PATIENCE;
use super::gateway::Gateway;

/// One raw HTTP/1.1 request on a new connection: its status and body.
pub async fn raw(
    gw: &Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let addr = gw.base.strip_prefix("http://").unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(name, _)| *name == "Connection") {
        req.push_str("Connection: close\r\n");
    }
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    stream.write_all(req.as_bytes()).await.unwrap();
    // Enough for a status line and a problem (an upgrade or a stream never ends by itself).
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("an answer within PATIENCE")
            .unwrap();
        answer.extend_from_slice(&buf[..read]);
        let text = String::from_utf8_lossy(&answer);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            assert!(read > 0, "the connection closed before an answer: {text}");
            continue;
        };
        let head = head.to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|n| n.trim().parse::<usize>().ok());
        // An upgrade or a stream is judged by its head; anything else once its body is in.
        let whole = match length {
            Some(n) => body.len() >= n,
            None => head.contains("transfer-encoding: chunked") && body.ends_with("0\r\n\r\n"),
        };
        if read == 0
            || whole
            || head.starts_with("http/1.1 101")
            || head.contains("text/event-stream")
        {
            break;
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text[9..12].parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    // A chunked body's one chunk (what the gateway's problems fit in).
    let body = match head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        true => body.split("\r\n").nth(1).unwrap_or_default().to_owned(),
        false => body.to_owned(),
    };
    (status, body)
}
