//! A small echo backend: answers every request with a JSON description of
//! what it received, the way the Gateway API conformance echo server does.
//! Used by `sluice demo` and by the tests as the backend behind the gateway.
