//! sluice: a Kubernetes Gateway API gateway built for exact traffic splitting.
//!
//! The data flow, one module per step (see DESIGN.md at the repository root, and `docs/`):
//!
//! ```text
//! source (files, kubernetes) -> resources::Snapshot -----------> translate() -> (route::RouteTable, StatusReport)
//!                                  \-> rollout (state machine) -^ served shares        |
//!                                                                                       v
//! request -> proxy (listener -> route lookup -> filters -> weighted backend -> endpoint -> forward)
//! ```
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod admin;
pub mod cli;
pub mod echo;
pub mod explain;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc_echo;
pub mod ingress_nginx;
pub mod metrics;
pub mod ports;
pub mod proxy;
pub mod resources;
pub mod rollout;
pub mod route;
pub mod serve;
pub mod shutdown;
pub mod source;
pub mod status;
#[doc(hidden)]
pub mod testdata;
pub mod translate;
pub mod yaml;

/// The map of the request path's lookups (hosts, path segments, pooled
/// connections, endpoint health): foldhash instead of std's SipHash, which
/// took about 500 instructions per proxied request in callgrind. Every key
/// comes from the configuration or the endpoints, none from a client, so a
/// client cannot fill a bucket. Seeded per process.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
