//! The client side of the proxy: accepting connections and reading them.
//! Connection limits and protocol detection ([`accept`]), TLS termination
//! ([`tls`]), the HTTP/1.1 connection loop ([`h1_conn`]) and hyper's
//! HTTP/2 server ([`h2_conn`]), both handing each request to
//! [`super::request`], idle HTTP/1.1 connections parked off their tasks
//! ([`idle`]), what is watched on every connection ([`conn`]), and
//! TLS listeners, routed by SNI and relayed without HTTP ([`passthrough`]).

pub(super) mod accept;
pub(super) mod conn;
pub(super) mod h1_conn;
pub(super) mod h2_conn;
pub(super) mod idle;
pub(super) mod passthrough;
pub(super) mod tls;
