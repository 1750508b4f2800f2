//! The backend side of the proxy: carrying a request to an endpoint and
//! its response back. Which client carries it ([`upstream`]): sluice's
//! HTTP/1.1 client ([`h1_client`]) on pooled connections ([`pool`]), or
//! hyper's HTTP/2 client ([`h2`]); and the replay buffer that lets a retry
//! send a request's body again ([`replay`]).

pub(super) mod h1_client;
pub(super) mod h2;
pub(super) mod pool;
pub(super) mod replay;
pub(super) mod upstream;
