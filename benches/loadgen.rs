//! Open-loop HTTP/1.1 load generator: requests are scheduled at a fixed
//! rate, and each one's latency is counted from its *scheduled* send time,
//! so a slow proxy cannot hide its stalls by slowing the client down (wrk is
//! closed-loop; `h2load --rps` sends bursts).
//!
//! A scheduler thread releases request `i` at `start + i / rate`; any idle
//! keep-alive connection takes it (a request waits in the queue when all
//! are busy, and that wait counts). A request fails when its connection
//! cannot be opened, is closed or reset before the whole response arrived,
//! the response does not come within 5 s, or the status is not 2xx. Failed
//! requests are never retried: every failure a client would see is counted.
//!
//! ```text
//! loadgen run --url http://127.0.0.1:8080/ --rate 5000 --duration 10 --connections 50
//! ```
//!
//! Prints one JSON object on stdout. Built with `cargo bench --no-run`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

struct Options {
    addr: String,
    host: String,
    path: String,
    rate: f64,
    duration: Duration,
    connections: usize,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut url = None;
    let mut rate = 5000.0;
    let mut duration = 10.0;
    let mut connections = 50;
    let mut host = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?.clone()),
            "--host" => host = Some(value()?.clone()),
            "--rate" => rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--duration" => duration = value()?.parse().map_err(|e| format!("--duration: {e}"))?,
            "--connections" => {
                connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let url = url.ok_or("--url is required")?;
    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs are supported")?;
    let (addr, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if rate <= 0.0 || duration <= 0.0 || connections == 0 {
        return Err("rate, duration and connections must be positive".into());
    }
    Ok(Options {
        addr: addr.to_string(),
        host: host.unwrap_or_else(|| addr.to_string()),
        path: path.to_string(),
        rate,
        duration: Duration::from_secs_f64(duration),
        connections,
    })
}

/// Scheduled send times waiting for a connection.
struct Queue {
    jobs: Mutex<VecDeque<Instant>>,
    ready: Notify,
    done: AtomicBool,
}

#[derive(Default)]
struct Tally {
    /// Microseconds from scheduled send to the end of the response.
    latencies: Vec<u32>,
    /// Microseconds from scheduled send to the actual write (generator lag).
    lags: Vec<u32>,
    ok: u64,
    connect_failed: u64,
    closed: u64,
    timed_out: u64,
    non_2xx: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` runs every bench target with `--bench`: nothing to do.
    if args.first().map(String::as_str) != Some("run") {
        eprintln!(
            "usage: loadgen run --url http://ADDR/PATH [--rate N] [--duration S] [--connections N] [--host H]"
        );
        return;
    }
    let options = match parse_options(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
    let queue = Arc::new(Queue {
        jobs: Mutex::new(VecDeque::new()),
        ready: Notify::new(),
        done: AtomicBool::new(false),
    });
    let request = format!(
        "GET {} HTTP/1.1\r\nhost: {}\r\nuser-agent: sluice-loadgen\r\n\r\n",
        options.path, options.host
    );
    let start = Instant::now() + Duration::from_millis(50);
    let scheduler = {
        let queue = queue.clone();
        let rate = options.rate;
        let duration = options.duration;
        std::thread::spawn(move || schedule(&queue, start, rate, duration))
    };
    let tallies = runtime.block_on(async {
        let tasks: Vec<_> = (0..options.connections)
            .map(|_| {
                tokio::spawn(connection(
                    queue.clone(),
                    options.addr.clone(),
                    request.clone().into_bytes(),
                ))
            })
            .collect();
        let mut tallies = Vec::new();
        for t in tasks {
            tallies.push(t.await.unwrap_or_default());
        }
        tallies
    });
    let scheduled = scheduler.join().unwrap_or(0);
    let elapsed = start.elapsed().as_secs_f64();
    report(&tallies, scheduled, options.duration.as_secs_f64(), elapsed);
}

/// Release one job per `1 / rate` seconds, on time; returns how many.
fn schedule(queue: &Queue, start: Instant, rate: f64, duration: Duration) -> u64 {
    let total = (rate * duration.as_secs_f64()).round() as u64;
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        queue
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(at);
        queue.ready.notify_one();
    }
    queue.done.store(true, Ordering::SeqCst);
    queue.ready.notify_waiters();
    total
}

async fn next_job(queue: &Queue) -> Option<Instant> {
    loop {
        let notified = queue.ready.notified();
        {
            let mut jobs = queue.jobs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = jobs.pop_front() {
                if !jobs.is_empty() {
                    queue.ready.notify_one();
                }
                return Some(at);
            }
            if queue.done.load(Ordering::SeqCst) {
                return None;
            }
        }
        notified.await;
    }
}

enum Outcome {
    Ok { close: bool },
    Non2xx { close: bool },
    Closed,
}

async fn connection(queue: Arc<Queue>, addr: String, request: Vec<u8>) -> Tally {
    let mut tally = Tally::default();
    let mut stream: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(8192);
    while let Some(at) = next_job(&queue).await {
        if stream.is_none() {
            match TcpStream::connect(&addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    stream = Some(s);
                }
                Err(_) => {
                    tally.connect_failed += 1;
                    continue;
                }
            }
        }
        let s = stream.as_mut().expect("connected just above");
        tally.lags.push(micros(at.elapsed()));
        let exchange = async {
            s.write_all(&request).await?;
            read_response(s, &mut buf).await
        };
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await;
        let latency = micros(at.elapsed());
        match outcome {
            Ok(Ok(Outcome::Ok { close })) => {
                tally.ok += 1;
                tally.latencies.push(latency);
                if close {
                    stream = None;
                }
            }
            Ok(Ok(Outcome::Non2xx { close })) => {
                tally.non_2xx += 1;
                if close {
                    stream = None;
                }
            }
            Ok(Ok(Outcome::Closed)) | Ok(Err(_)) => {
                tally.closed += 1;
                stream = None;
            }
            Err(_) => {
                tally.timed_out += 1;
                stream = None;
            }
        }
    }
    tally
}

/// Read one response (content-length or chunked body).
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Outcome> {
    buf.clear();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Outcome::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let close = head.contains("\r\nconnection: close");
    let length = head.lines().find_map(|l| {
        l.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    });
    let chunked = head.contains("\r\ntransfer-encoding: chunked");
    loop {
        let body = &buf[head_end..];
        let complete = match length {
            Some(n) => body.len() >= n,
            None if chunked => body.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if complete {
            break;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            if length.is_none() && !chunked {
                // Body delimited by the end of the connection.
                break;
            }
            return Ok(Outcome::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let close = close || (length.is_none() && !chunked);
    Ok(if (200..300).contains(&status) {
        Outcome::Ok { close }
    } else {
        Outcome::Non2xx { close }
    })
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn report(tallies: &[Tally], scheduled: u64, duration: f64, elapsed: f64) {
    let mut latencies: Vec<u32> = tallies.iter().flat_map(|t| t.latencies.clone()).collect();
    let mut lags: Vec<u32> = tallies.iter().flat_map(|t| t.lags.clone()).collect();
    latencies.sort_unstable();
    lags.sort_unstable();
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let ok = sum(|t| t.ok);
    let connect_failed = sum(|t| t.connect_failed);
    let closed = sum(|t| t.closed);
    let timed_out = sum(|t| t.timed_out);
    let non_2xx = sum(|t| t.non_2xx);
    println!(
        "{{\"scheduled\":{scheduled},\"ok\":{ok},\"failed\":{},\"connect_failed\":{connect_failed},\
         \"closed\":{closed},\"timed_out\":{timed_out},\"non_2xx\":{non_2xx},\
         \"rate\":{:.1},\"elapsed_s\":{elapsed:.2},\
         \"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{},\
         \"lag_p50_us\":{},\"lag_p99_us\":{}}}",
        connect_failed + closed + timed_out + non_2xx,
        ok as f64 / duration,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.90),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
        latencies.last().copied().unwrap_or(0),
        percentile(&lags, 0.50),
        percentile(&lags, 0.99),
    );
}
