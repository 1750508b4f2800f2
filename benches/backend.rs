//! The benchmark's backend: a minimal HTTP/1.1 server that answers `200 ok`
//! to every request and counts what it receives, so that `bench/run.sh` can
//! show the split each backend actually got.
//!
//! It is deliberately as cheap as a server can be (one thread, no parsing
//! beyond finding the end of each request), so that the proxies' cost is
//! what the benchmark measures. `GET /__count` answers this listener's count
//! (not counting itself); `GET /__reset` zeroes it; `GET /__port` answers
//! the listener's port and counts (the flip row tells by it which
//! configuration served a probe).
//!
//! ```text
//! backend serve 127.0.0.1:18081 127.0.0.1:18082
//! ```
//!
//! Built with `cargo bench --no-run`; run by `bench/driver.py`.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\r\nok\n";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` runs every bench target with `--bench`: nothing to do.
    if args.first().map(String::as_str) != Some("serve") {
        eprintln!("usage: backend serve ADDR...");
        return;
    }
    let addrs: Vec<SocketAddr> = match args[1..].iter().map(|a| a.parse()).collect() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("backend: bad address: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        for addr in addrs {
            let listener = match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("backend: cannot listen on {addr}: {e}");
                    std::process::exit(1);
                }
            };
            let count = Rc::new(AtomicU64::new(0));
            let port = addr.port();
            tokio::task::spawn_local(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::task::spawn_local(serve(stream, count.clone(), port));
                }
            });
        }
        println!("ready");
        std::future::pending::<()>().await;
    });
}

/// Serve one connection: answer every complete request in the buffer with
/// one write (pipelining works), skip request bodies by `content-length`.
async fn serve(mut stream: TcpStream, count: Rc<AtomicU64>, port: u16) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut close = false;
        while let Some(end) = find_head_end(&buf) {
            let head = &buf[..end];
            let body = content_length(head);
            if buf.len() < end + body {
                break;
            }
            close |= wants_close(head);
            let text = if head.starts_with(b"GET /__count ") {
                Some(format!("{}\n", count.load(Ordering::Relaxed)))
            } else if head.starts_with(b"GET /__port ") {
                count.fetch_add(1, Ordering::Relaxed);
                Some(format!("{port}\n"))
            } else {
                None
            };
            if let Some(text) = text {
                out.extend_from_slice(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    )
                    .as_bytes(),
                );
            } else if head.starts_with(b"GET /__reset ") {
                count.store(0, Ordering::Relaxed);
                out.extend_from_slice(OK);
            } else {
                count.fetch_add(1, Ordering::Relaxed);
                out.extend_from_slice(OK);
            }
            buf.drain(..end + body);
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if close {
            return;
        }
    }
}

/// Index just past the `\r\n\r\n` that ends the request head.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn header_lines(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    head.split(|b| *b == b'\n').skip(1).filter_map(|line| {
        let colon = line.iter().position(|b| *b == b':')?;
        let value = line[colon + 1..].trim_ascii();
        Some((&line[..colon], value))
    })
}

fn content_length(head: &[u8]) -> usize {
    header_lines(head)
        .find(|(name, _)| name.eq_ignore_ascii_case(b"content-length"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0)
}

fn wants_close(head: &[u8]) -> bool {
    header_lines(head).any(|(name, value)| {
        name.eq_ignore_ascii_case(b"connection") && value.eq_ignore_ascii_case(b"close")
    })
}
