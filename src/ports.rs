//! Free loopback ports for listeners that something else binds a moment
//! later: the gateway's listeners in tests, the demo and the conformance
//! runner.
//!
//! Binding port 0 and releasing it is racy: the kernel hands the same port
//! to the next port-0 bind in the meantime (an echo backend started by a
//! test running beside), and the gateway then fails to bind. Ports handed
//! out here come from below the kernel's ephemeral range, where port-0
//! binds never land, and each one only once per process.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port handed out.
const LOW: u32 = 10_000;

/// A loopback port that is free now and that no port-0 bind will take.
pub fn free_loopback_port() -> io::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let high = ephemeral_low().saturating_sub(1).max(LOW + 1_000);
    let span = high - LOW;
    // Start at a random place so that processes running side by side (test
    // binaries, a demo) rarely walk the same ports.
    let _ = NEXT.compare_exchange(
        0,
        fastrand::u32(1..span),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = u16::try_from(port).expect("ports below the ephemeral range fit in u16");
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    // Everything below the ephemeral range is taken: fall back to port 0.
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The first port of the kernel's ephemeral range (32768 when unknown).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_loopback_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
        assert!(
            ports
                .iter()
                .all(|p| u32::from(*p) >= LOW && u32::from(*p) < ephemeral_low())
        );
        for p in ports {
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("still free");
        }
    }
}
