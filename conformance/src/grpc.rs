//! The GATEWAY-GRPC tests: GRPCRoute checks of Gateway API v1.6.1
//! (`GRPCExactMethodMatching`, `GRPCRouteHeaderMatching`,
//! `GRPCRouteListenerHostnameMatching`, `GRPCRouteNamedRule`,
//! `GRPCRouteWeight`), and the suite's gRPC client as they use it.
//!
//! The suite's client is grpc-go's: it calls
//! `/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/<method>` over
//! h2c on the Gateway's address, with the metadata and `:authority` of the
//! case, and reads the status code (`grpc.Code`) and the `EchoResponse`.
//! Here the call is [`sluice::grpc_echo::call_h2c`]; an answer is judged as
//! the suite's `compareResponse` does: the code, and on OK the fully
//! qualified method, the namespace and the pod's prefix. A case must hold
//! for [`CONSECUTIVE_SUCCESSES`] calls in a row (`AwaitConvergence`).
//!
//! Expectations come from reading the upstream test code; the code here is
//! ours.

use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow, bail};
use sluice::grpc_echo::{self, Reply, SERVICE, code};

use crate::ctx::{Ctx, INFRA, infra};
use crate::expect::{
    CONSECUTIVE_SUCCESSES, MAX_TIME_TO_CONSISTENCY, backend_of, converge, within_five_points,
};
use crate::suite::SAME_NS;

/// One call and what must come back.
#[derive(Debug, Clone)]
pub struct GrpcCase {
    pub gateway: String,
    /// `Echo`, `EchoTwo` or `EchoThree`.
    pub method: &'static str,
    /// `:authority` (the Gateway's address when unset).
    pub authority: Option<String>,
    pub metadata: Vec<(String, String)>,
    /// OK from a pod of this backend, or this code.
    pub expect: Expect,
}

#[derive(Debug, Clone)]
pub enum Expect {
    Backend(&'static str),
    Code(u32),
}

fn call(gateway: &str, method: &'static str) -> GrpcCase {
    GrpcCase {
        gateway: gateway.to_owned(),
        method,
        authority: None,
        metadata: Vec::new(),
        expect: Expect::Code(code::OK),
    }
}

impl GrpcCase {
    fn md(mut self, pairs: &[(&str, &str)]) -> Self {
        // grpc-go sends metadata keys in lower case.
        self.metadata.extend(
            pairs
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())),
        );
        self
    }

    fn authority(mut self, authority: &str) -> Self {
        self.authority = Some(authority.to_owned());
        self
    }

    fn to(mut self, backend: &'static str) -> Self {
        self.expect = Expect::Backend(backend);
        self
    }

    fn code(mut self, code: u32) -> Self {
        self.expect = Expect::Code(code);
        self
    }

    fn describe(&self) -> String {
        format!(
            "{} to {}{:?}",
            self.method,
            self.authority.as_deref().unwrap_or("the Gateway's address"),
            self.metadata
        )
    }
}

/// The suite's `compareResponse`.
fn compare(case: &GrpcCase, reply: &Reply) -> anyhow::Result<()> {
    let want = match case.expect {
        Expect::Backend(_) => code::OK,
        Expect::Code(c) => c,
    };
    if reply.code != want {
        bail!(
            "expected gRPC status {want}, got {} ({})",
            reply.code,
            reply.message
        );
    }
    if reply.code != code::OK {
        return Ok(());
    }
    let a = &reply
        .response
        .as_ref()
        .ok_or_else(|| anyhow!("an OK answer without an EchoResponse"))?
        .assertions;
    let method = format!("/{SERVICE}/{}", case.method);
    if a.fully_qualified_method != method {
        bail!(
            "the backend served {}, expected {method}",
            a.fully_qualified_method
        );
    }
    if let Expect::Backend(backend) = case.expect {
        if a.context.namespace != INFRA {
            bail!("namespace {:?}, expected {INFRA:?}", a.context.namespace);
        }
        if !a.context.pod.starts_with(backend) {
            bail!(
                "served by pod {:?}, expected backend {backend}",
                a.context.pod
            );
        }
    }
    Ok(())
}

impl Ctx<'_> {
    /// Make the case's call through the Gateway's first listener.
    pub async fn grpc_call(&self, case: &GrpcCase) -> anyhow::Result<Reply> {
        let port = self.first_listener_port(&case.gateway)?;
        let actual = self
            .ports
            .actual(&case.gateway, port)
            .ok_or_else(|| anyhow!("Gateway {} has no listener on port {port}", case.gateway))?;
        let authority = case
            .authority
            .clone()
            .unwrap_or_else(|| format!("127.0.0.1:{port}"));
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], actual));
        let reply = tokio::time::timeout(
            crate::client::REQUEST_DEADLINE,
            grpc_echo::call_h2c(addr, &authority, case.method, &case.metadata),
        )
        .await
        .map_err(|_| anyhow!("no answer within {:?}", crate::client::REQUEST_DEADLINE))??;
        Ok(reply)
    }

    /// `MakeRequestAndExpectEventuallyConsistentResponse` for a gRPC case.
    pub async fn grpc_expect(&self, case: &GrpcCase) -> anyhow::Result<()> {
        converge(CONSECUTIVE_SUCCESSES, MAX_TIME_TO_CONSISTENCY, || async {
            compare(case, &self.grpc_call(case).await?)
        })
        .await
        .with_context(|| case.describe())
    }

    /// Every case, all at once, reporting all the mismatches.
    async fn grpc_all(&self, cases: Vec<GrpcCase>) -> anyhow::Result<()> {
        let errors: Vec<String> =
            futures_util::future::join_all(cases.iter().map(|case| self.grpc_expect(case)))
                .await
                .into_iter()
                .filter_map(|o| o.err().map(|e| format!("{e:#}")))
                .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            bail!(
                "{} of {} calls: {}",
                errors.len(),
                cases.len(),
                errors.join("; ")
            )
        }
    }
}

pub async fn exact_method_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted_kind("GRPCRoute", SAME_NS, &[&infra("exact-matching")])
        .await?;
    cx.grpc_all(vec![
        call(SAME_NS, "Echo").to("grpc-infra-backend-v1"),
        call(SAME_NS, "EchoTwo").to("grpc-infra-backend-v2"),
        call(SAME_NS, "EchoThree").code(code::UNIMPLEMENTED),
    ])
    .await
}

pub async fn header_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted_kind("GRPCRoute", SAME_NS, &[&infra("grpc-header-matching")])
        .await?;
    let echo = |md: &[(&str, &str)]| call(SAME_NS, "Echo").md(md);
    cx.grpc_all(vec![
        echo(&[("Version", "one")]).to("grpc-infra-backend-v1"),
        echo(&[("Version", "two")]).to("grpc-infra-backend-v2"),
        echo(&[("Version", "two"), ("Color", "orange")]).to("grpc-infra-backend-v1"),
        echo(&[("Version", "two"), ("Color", "blue")]).to("grpc-infra-backend-v2"),
        echo(&[("Color", "orange")]).code(code::UNIMPLEMENTED),
        echo(&[("Some-Other-Header", "one")]).code(code::UNIMPLEMENTED),
        echo(&[("Color", "blue")]).to("grpc-infra-backend-v1"),
        echo(&[("Color", "green")]).to("grpc-infra-backend-v1"),
        echo(&[("Color", "red")]).to("grpc-infra-backend-v2"),
        echo(&[("Color", "yellow")]).to("grpc-infra-backend-v2"),
        echo(&[("Color", "purple")]).code(code::UNIMPLEMENTED),
    ])
    .await
}

pub async fn listener_hostname_matching(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    let gw = infra("grpcroute-listener-hostname-matching");
    for route in ["backend-v1", "backend-v2", "backend-v3"] {
        cx.accepted_kind("GRPCRoute", &gw, &[&infra(route)]).await?;
    }
    let at = |authority: &str| call(&gw, "Echo").authority(authority);
    cx.grpc_all(vec![
        at("bar.com").to("grpc-infra-backend-v1"),
        at("foo.bar.com").to("grpc-infra-backend-v2"),
        at("baz.bar.com").to("grpc-infra-backend-v3"),
        at("boo.bar.com").to("grpc-infra-backend-v3"),
        at("multiple.prefixes.bar.com").to("grpc-infra-backend-v3"),
        at("multiple.prefixes.foo.com").to("grpc-infra-backend-v3"),
        at("foo.com").code(code::UNIMPLEMENTED),
        at("no.matching.host").code(code::UNIMPLEMENTED),
    ])
    .await
}

pub async fn named_rule(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted_kind("GRPCRoute", SAME_NS, &[&infra("grpc-named-rules")])
        .await?;
    cx.grpc_all(vec![
        call(SAME_NS, "Echo").to("grpc-infra-backend-v1"),
        call(SAME_NS, "EchoTwo").to("grpc-infra-backend-v2"),
    ])
    .await
}

pub async fn weight(cx: &mut Ctx<'_>) -> anyhow::Result<()> {
    cx.accepted_kind("GRPCRoute", SAME_NS, &[&infra("weighted-backends")])
        .await?;
    let echo = call(SAME_NS, "Echo");
    cx.grpc_expect(&echo).await?;
    // The suite sends 500 calls (each with an `x-jitter` header for
    // entropy) and wants 70/30/0 within 5 points; the split is exact, so
    // one run of the same count and tolerance.
    const TOTAL: usize = 500;
    const BACKENDS: [&str; 3] = [
        "grpc-infra-backend-v1",
        "grpc-infra-backend-v2",
        "grpc-infra-backend-v3",
    ];
    let mut counts = BTreeMap::new();
    for i in 0..TOTAL {
        let case = echo.clone().md(&[("x-jitter", &i.to_string())]);
        let reply = cx.grpc_call(&case).await?;
        compare(&case, &reply)?;
        let pod = reply
            .response
            .map(|r| r.assertions.context.pod)
            .unwrap_or_default();
        *counts.entry(backend_of(&pod, &BACKENDS)?).or_default() += 1;
    }
    within_five_points(
        &counts,
        TOTAL,
        &[(BACKENDS[0], 0.7), (BACKENDS[1], 0.3), (BACKENDS[2], 0.0)],
    )
}
