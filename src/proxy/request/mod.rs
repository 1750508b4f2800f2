//! One request, whatever connection it came on: what the proxy does to it
//! between reading its head and writing its response ([`handler`]), the
//! rule's filters ([`filters`], [`cors`]), session persistence
//! ([`session`]), retries ([`retry`]) and the outlier bookkeeping of each
//! try ([`outliers`]), the client's address ([`forwarded`]) and what gRPC
//! adds ([`grpc`]).

pub(super) mod cors;
pub(super) mod filters;
pub(super) mod forwarded;
pub(super) mod grpc;
pub(super) mod handler;
pub(super) mod outliers;
pub(super) mod retry;
pub(super) mod session;
