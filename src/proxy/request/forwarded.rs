//! Which address is the client's, when proxies in front of the gateway
//! report it in `X-Forwarded-For`.
//!
//! Every entry of `X-Forwarded-For` but the last (the peer, appended by the
//! gateway) was written by whoever sent the request, so a client can put
//! anything there. Only the entries added by proxies the operator trusts
//! are believed: a count of hops (Envoy's `xff_num_trusted_hops`) or a set
//! of CIDRs (Envoy's `xff_trusted_cidrs`). The address found that way is
//! sent to backends as `X-Real-IP`, which the gateway always sets itself,
//! so a client can never choose it.

use std::net::IpAddr;
use std::str::FromStr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The proxies in front of the gateway whose `X-Forwarded-For` entries are
/// believed. The default trusts none: the client is the peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardedTrust {
    /// The last this many entries before the peer were added by trusted
    /// proxies (ignored when `trusted_cidrs` is not empty).
    pub trusted_hops: u32,
    /// Proxies at these addresses are trusted: the client is the last entry
    /// (from the right, the peer included) outside them.
    pub trusted_cidrs: Vec<Cidr>,
}

/// An address block such as `10.0.0.0/8` or `2001:db8::/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            (IpAddr::V4(_), IpAddr::V6(ip)) => ip
                .to_ipv4_mapped()
                .is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `ADDRESS/PREFIX`, or a bare address (a block of one).
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{s:?}: the prefix length must be 0..={max}")),
            },
        };
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl ForwardedTrust {
    /// The client's address given the `X-Forwarded-For` entries, the last
    /// of which is the peer the gateway saw (`None` for an entry that is
    /// not an address).
    pub fn client(&self, entries: &[Option<IpAddr>], peer: IpAddr) -> IpAddr {
        if !self.trusted_cidrs.is_empty() {
            let trusted = |ip: IpAddr| self.trusted_cidrs.iter().any(|c| c.contains(ip));
            let mut client = peer;
            for entry in entries.iter().rev() {
                match entry {
                    Some(ip) if trusted(client) => client = *ip,
                    _ => break,
                }
            }
            return client;
        }
        let hops = self.trusted_hops as usize;
        let Some(index) = entries.len().checked_sub(hops + 1) else {
            // Fewer entries than trusted hops: the leftmost is the best
            // anyone can say.
            return entries.iter().flatten().next().copied().unwrap_or(peer);
        };
        entries[index].unwrap_or(peer)
    }

    /// Set `X-Real-IP` to the client's address, read from the request's
    /// `X-Forwarded-For` (the peer already appended to it). Any value the
    /// client sent is replaced.
    pub fn set_real_ip(&self, headers: &mut HeaderMap, peer: IpAddr) {
        let client = if self.trusted_hops == 0 && self.trusted_cidrs.is_empty() {
            peer
        } else {
            let entries: Vec<Option<IpAddr>> = headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(|e| parse_entry(e.trim()))
                .collect();
            self.client(&entries, peer)
        };
        if let Ok(v) = HeaderValue::from_str(&client.to_string()) {
            headers.insert(X_REAL_IP.clone(), v);
        }
    }
}

/// An `X-Forwarded-For` entry: an address, possibly with a port.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entries(list: &str) -> Vec<Option<IpAddr>> {
        list.split(',').map(|e| parse_entry(e.trim())).collect()
    }

    #[test]
    fn without_trust_the_client_is_the_peer() {
        let t = ForwardedTrust::default();
        let e = entries("6.6.6.6, 10.0.0.1");
        assert_eq!(t.client(&e, ip("10.0.0.1")), ip("10.0.0.1"));
    }

    #[test]
    fn trusted_hops_count_from_the_right_after_the_peer() {
        let t = ForwardedTrust {
            trusted_hops: 1,
            ..Default::default()
        };
        // client 192.0.2.10 -> LB 198.51.100.1 (adds the client) -> gateway
        let e = entries("6.6.6.6, 192.0.2.10, 198.51.100.1");
        assert_eq!(t.client(&e, ip("198.51.100.1")), ip("192.0.2.10"));
        let t2 = ForwardedTrust {
            trusted_hops: 2,
            ..Default::default()
        };
        assert_eq!(t2.client(&e, ip("198.51.100.1")), ip("6.6.6.6"));
        // More hops than entries: the leftmost.
        let t9 = ForwardedTrust {
            trusted_hops: 9,
            ..Default::default()
        };
        assert_eq!(t9.client(&e, ip("198.51.100.1")), ip("6.6.6.6"));
    }

    #[test]
    fn trusted_cidrs_skip_trusted_proxies_only() {
        let t = ForwardedTrust {
            trusted_cidrs: vec!["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
            ..Default::default()
        };
        let e = entries("6.6.6.6, 192.0.2.10, 10.1.2.3, 10.9.9.9");
        assert_eq!(t.client(&e, ip("10.9.9.9")), ip("192.0.2.10"));
        // An untrusted peer's list is not believed at all.
        let e = entries("6.6.6.6, 203.0.113.5");
        assert_eq!(t.client(&e, ip("203.0.113.5")), ip("203.0.113.5"));
        // Garbage stops the walk at the last trusted hop's report.
        let e = entries("6.6.6.6, nonsense, 10.9.9.9");
        assert_eq!(t.client(&e, ip("10.9.9.9")), ip("10.9.9.9"));
    }

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "192.168.0.0/16".parse().unwrap();
        assert!(c.contains(ip("192.168.44.1")));
        assert!(!c.contains(ip("192.169.0.1")));
        assert!(c.contains(ip("::ffff:192.168.1.1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("not-an-ip".parse::<Cidr>().is_err());
        assert_eq!(
            "10.1.2.3".parse::<Cidr>().unwrap().to_string(),
            "10.1.2.3/32"
        );
    }

    #[test]
    fn real_ip_replaces_what_the_client_sent() {
        let t = ForwardedTrust {
            trusted_hops: 1,
            ..Default::default()
        };
        let mut h = HeaderMap::new();
        h.insert("x-real-ip", HeaderValue::from_static("1.1.1.1"));
        h.append("x-forwarded-for", HeaderValue::from_static("9.9.9.9"));
        h.append(
            "x-forwarded-for",
            HeaderValue::from_static("192.0.2.10, 10.0.0.2"),
        );
        t.set_real_ip(&mut h, ip("10.0.0.2"));
        assert_eq!(h.get_all("x-real-ip").iter().count(), 1);
        assert_eq!(h["x-real-ip"], "192.0.2.10");
    }
}
