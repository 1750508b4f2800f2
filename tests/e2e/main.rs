//! End-to-end tests: the `sluice` binary serving real manifests, requests
//! through real sockets to echo backends and back. One test binary (faster
//! to build); one module per part of the issue.

mod support;

mod backend_errors;
mod backend_tls;
mod client_cert;
mod crds;
mod edge;
mod filters;
mod forwarding;
mod grpc;
mod hardening;
mod hostnames;
mod https;
mod ingress_nginx;
mod inputs;
mod listenerset;
mod matching;
mod outliers;
mod precedence;
mod protocols;
mod reload;
mod retry_cors;
mod rollouts;
mod sessions;
mod status;
mod tls_routes;
mod upstream;
mod weights;
mod workers;
