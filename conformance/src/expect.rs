//! Response expectations: what a request is ([`Case`], built with
//! [`req`] and its builder methods) and what its response must look like,
//! compared as the suite's `CompareRoundTrip` does ([`compare`]).
//!
//! Comparison rules carried over from the suite:
//! - the status code must be the expected one (200 unless said otherwise),
//!   or one of the others a test accepts;
//! - on 200, the request the backend saw must have the expected path (with
//!   query), method (GET by default), host (when one is expected) and
//!   headers (values joined by `,`), none of the absent headers, and come
//!   from the expected namespace and a pod whose name starts with the
//!   expected backend; unless a test says otherwise the request expected at
//!   the backend is the request sent;
//! - on a redirect, the `Location`'s scheme, host and path, where an unset
//!   expectation defaults to the request's own (the host to the one
//!   received), and its port: an unset expectation means the scheme's
//!   default (80 for http, 443 for https, or no port at all);
//! - response headers (joined by `,`), headers that must have one of
//!   several values (whitespace ignored), and absent response headers;
//! - a 200 expected from namespace "" (CORS preflights) must come from the
//!   gateway itself, not from a backend.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http::Method;

use crate::client::Exchange;
use crate::ctx::{Ctx, INFRA};

/// A request to make and what to expect of it.
#[derive(Debug, Clone)]
pub struct Case {
    /// `ns/name` of the Gateway to send to.
    pub gateway: String,
    /// The listener port (as the manifests say); default: first listener's.
    pub port: Option<u16>,
    pub host: Option<String>,
    pub method: Method,
    /// Path with query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Connect with TLS, sending this server name (SNI).
    pub sni: Option<String>,
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub h2c: bool,

    pub status: u16,
    /// Other acceptable statuses (the suite's `StatusCodes`).
    pub other_statuses: Vec<u16>,
    pub backend: Option<String>,
    pub namespace: Option<String>,
    pub exp_path: Option<String>,
    pub exp_host: Option<String>,
    pub exp_method: Option<String>,
    /// Headers expected at the backend, replacing the request's own.
    pub exp_headers: Option<Vec<(String, String)>>,
    pub absent: Vec<String>,
    /// The server name the backend's TLS connection must have carried
    /// (the suite's `ExpectedRequest.SNI`, which echo-basic reports).
    pub exp_sni: Option<String>,
    pub redirect: Option<RedirectExpect>,
    pub resp_headers: Vec<(String, String)>,
    /// Response headers that must have one of these values, compared with
    /// whitespace removed (the suite's `ValidHeaderValues` with
    /// `IgnoreWhitespace`).
    pub valid_resp_headers: Vec<(String, Vec<String>)>,
    pub absent_resp_headers: Vec<String>,
}

/// Expected parts of a `Location`; `None` takes the request's own.
#[derive(Debug, Clone, Default)]
pub struct RedirectExpect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<String>,
    pub path: Option<String>,
}

/// A request to `gateway` (`ns/name`) for `path`.
pub fn req(gateway: &str, path: &str) -> Case {
    Case {
        gateway: gateway.to_owned(),
        port: None,
        host: None,
        method: Method::GET,
        path: path.to_owned(),
        headers: Vec::new(),
        sni: None,
        h2c: false,
        status: 200,
        other_statuses: Vec::new(),
        backend: None,
        namespace: None,
        exp_path: None,
        exp_host: None,
        exp_method: None,
        exp_headers: None,
        absent: Vec::new(),
        exp_sni: None,
        redirect: None,
        resp_headers: Vec::new(),
        valid_resp_headers: Vec::new(),
        absent_resp_headers: Vec::new(),
    }
}

/// The suite's usual Gateway.
pub fn same_ns(path: &str) -> Case {
    req(&format!("{INFRA}/same-namespace"), path)
}

impl Case {
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }
    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_owned());
        self
    }
    pub fn method(mut self, method: &str) -> Self {
        self.method = Method::from_bytes(method.as_bytes()).expect("test methods are valid");
        self
    }
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
    /// Accept any of `statuses` (the first is the one of the description).
    pub fn statuses(mut self, statuses: &[u16]) -> Self {
        if let Some((first, rest)) = statuses.split_first() {
            self.status = *first;
            self.other_statuses = rest.to_vec();
        }
        self
    }
    /// Send over TLS with server name `sni`.
    pub fn tls(mut self, sni: &str) -> Self {
        self.sni = Some(sni.to_owned());
        self
    }
    /// Send with HTTP/2 prior knowledge.
    pub fn h2c(mut self) -> Self {
        self.h2c = true;
        self
    }
    /// A response header must have one of `values` (whitespace ignored).
    pub fn resp_header_one_of(mut self, name: &str, values: &[&str]) -> Self {
        self.valid_resp_headers.push((
            name.to_owned(),
            values.iter().map(|v| (*v).to_owned()).collect(),
        ));
        self
    }
    /// Expect a 200 from a pod of `backend` in `namespace`.
    pub fn to(mut self, backend: &str, namespace: &str) -> Self {
        self.backend = Some(backend.to_owned());
        self.namespace = Some(namespace.to_owned());
        self
    }
    /// Expect a 200 from `backend` in the infra namespace.
    pub fn infra(self, backend: &str) -> Self {
        self.to(backend, INFRA)
    }
    pub fn exp_path(mut self, path: &str) -> Self {
        self.exp_path = Some(path.to_owned());
        self
    }
    pub fn exp_host(mut self, host: &str) -> Self {
        self.exp_host = Some(host.to_owned());
        self
    }
    pub fn exp_header(mut self, name: &str, value: &str) -> Self {
        self.exp_headers
            .get_or_insert_with(Vec::new)
            .push((name.to_owned(), value.to_owned()));
        self
    }
    /// The backend must see no headers beyond the absent checks (used when
    /// a test expects a request that names no headers).
    pub fn exp_no_headers(mut self) -> Self {
        self.exp_headers.get_or_insert_with(Vec::new);
        self
    }
    /// The backend must have been reached over TLS with server name `sni`.
    pub fn exp_sni(mut self, sni: &str) -> Self {
        self.exp_sni = Some(sni.to_owned());
        self
    }

    pub fn absent(mut self, name: &str) -> Self {
        self.absent.push(name.to_owned());
        self
    }
    pub fn resp_header(mut self, name: &str, value: &str) -> Self {
        self.resp_headers.push((name.to_owned(), value.to_owned()));
        self
    }
    pub fn absent_resp(mut self, name: &str) -> Self {
        self.absent_resp_headers.push(name.to_owned());
        self
    }
    fn redirect_mut(&mut self) -> &mut RedirectExpect {
        self.redirect.get_or_insert_with(RedirectExpect::default)
    }
    pub fn redirect(mut self, status: u16) -> Self {
        self.status = status;
        self.redirect_mut();
        self
    }
    pub fn r_scheme(mut self, v: &str) -> Self {
        self.redirect_mut().scheme = Some(v.to_owned());
        self
    }
    pub fn r_host(mut self, v: &str) -> Self {
        self.redirect_mut().host = Some(v.to_owned());
        self
    }
    pub fn r_port(mut self, v: &str) -> Self {
        self.redirect_mut().port = Some(v.to_owned());
        self
    }
    pub fn r_path(mut self, v: &str) -> Self {
        self.redirect_mut().path = Some(v.to_owned());
        self
    }

    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.method, self.path);
        if let Some(h) = &self.host {
            s.push_str(&format!(" host={h}"));
        }
        for (k, v) in &self.headers {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }
}

/// Which of `backends` served a request, by the prefix of the pod that
/// answered (the suite's way).
pub fn backend_of(pod: &str, backends: &[&'static str]) -> anyhow::Result<&'static str> {
    backends
        .iter()
        .copied()
        .find(|b| pod.starts_with(b))
        .ok_or_else(|| anyhow::anyhow!("handled by an unexpected pod {pod:?}"))
}

/// The suite's weight tests' verdict (`TestWeightedDistribution`):
/// exactly the backends of a non-zero share got traffic, and each backend
/// got its share of `total` within 5 points (`counts` by backend, `want`
/// its share).
pub fn within_five_points(
    counts: &std::collections::BTreeMap<&str, usize>,
    total: usize,
    want: &[(&str, f64)],
) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    let active = want.iter().filter(|(_, share)| *share > 0.0).count();
    let served = counts.values().filter(|n| **n > 0).count();
    if served != active {
        errors.push(format!(
            "expected {active} backends to receive traffic, but {served} did"
        ));
    }
    for (backend, want) in want {
        let got = counts.get(backend).copied().unwrap_or(0) as f64 / total as f64;
        if (got - want).abs() > 0.05 {
            errors.push(format!("{backend} got {got}, want {want} ±0.05"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("{} (counts {counts:?})", errors.join("; "))
    }
}

/// Answers in a row that make a response consistent (the suite's
/// `RequiredConsecutiveSuccesses`).
pub const CONSECUTIVE_SUCCESSES: usize = 3;
/// How long a request may take to start being answered as expected (the
/// suite's `MaxTimeToConsistency`).
pub const MAX_TIME_TO_CONSISTENCY: Duration = Duration::from_secs(30);
/// The pause after an attempt that did not hold.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The suite's `AwaitConvergence`: make `attempt` until it succeeds
/// `successes` times in a row (a failure starts the count again, after a
/// pause), or fail with its last error once `within` has passed
/// ([`MAX_TIME_TO_CONSISTENCY`] for requests).
pub async fn converge<F, Fut>(
    successes: usize,
    within: Duration,
    mut attempt: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + within;
    let mut in_a_row = 0;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt().await {
            Ok(()) => {
                in_a_row += 1;
                if in_a_row >= successes {
                    return Ok(());
                }
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!(
                    "not {successes} answers in a row within {within:?} \
                     ({attempts} attempts; the last one)"
                )));
            }
            Err(_) => {
                in_a_row = 0;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

impl Ctx<'_> {
    /// The suite's `MakeRequestAndExpectEventuallyConsistentResponse`:
    /// send the case's request until [`CONSECUTIVE_SUCCESSES`] exchanges in
    /// a row compare as expected.
    pub async fn expect(&self, case: &Case) -> anyhow::Result<()> {
        self.expect_in_a_row(case, CONSECUTIVE_SUCCESSES).await
    }

    /// [`Self::expect`] with `successes` in a row (the percentage mirror
    /// test's distribution requests want one each).
    pub async fn expect_in_a_row(&self, case: &Case, successes: usize) -> anyhow::Result<()> {
        converge(successes, MAX_TIME_TO_CONSISTENCY, || async {
            let exchange = self.send(case).await?;
            compare(case, &exchange)
        })
        .await
        .with_context(|| case.describe())
    }
}

fn joined<'a>(
    headers: impl Iterator<Item = (&'a String, &'a String)>,
    name: &str,
) -> Option<String> {
    let values: Vec<&str> = headers
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The suite's comparison of one exchange with the expectation.
pub fn compare(case: &Case, ex: &Exchange) -> anyhow::Result<()> {
    if ex.status != case.status && !case.other_statuses.contains(&ex.status) {
        if case.other_statuses.is_empty() {
            bail!("expected status {}, got {}", case.status, ex.status);
        }
        bail!(
            "expected status {} or {:?}, got {}",
            case.status,
            case.other_statuses,
            ex.status
        );
    }
    for (name, valid) in &case.valid_resp_headers {
        let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        let got = joined(ex.headers.iter().map(|(k, v)| (k, v)), name);
        if !got
            .as_deref()
            .is_some_and(|g| valid.iter().any(|v| squeeze(v) == squeeze(g)))
        {
            bail!("response header {name}: expected one of {valid:?}, got {got:?}");
        }
    }
    for (name, want) in &case.resp_headers {
        let got = joined(ex.headers.iter().map(|(k, v)| (k, v)), name);
        if got.as_deref() != Some(want.as_str()) {
            bail!("response header {name}: expected {want:?}, got {got:?}");
        }
    }
    for name in &case.absent_resp_headers {
        if ex.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
            bail!("response header {name} should be absent");
        }
    }
    if ex.status == 200 && case.namespace.as_deref() == Some("") {
        // The suite expects namespace "" of what the backend saw: the
        // gateway answered itself (a CORS preflight), no backend did.
        if let Some(echo) = &ex.echo {
            bail!(
                "expected the gateway to answer, but backend pod {} did",
                echo.pod
            );
        }
    } else if ex.status == 200 {
        let Some(echo) = &ex.echo else {
            bail!("the 200 response is not an echo body");
        };
        let want_path = case.exp_path.as_deref().unwrap_or(&case.path);
        if echo.path != want_path {
            bail!("backend saw path {:?}, expected {want_path:?}", echo.path);
        }
        let want_host = case.exp_host.as_ref().or(case.host.as_ref());
        if let Some(h) = want_host
            && !h.is_empty()
            && &echo.host != h
        {
            bail!("backend saw host {:?}, expected {h:?}", echo.host);
        }
        let want_method = case
            .exp_method
            .clone()
            .unwrap_or_else(|| case.method.to_string());
        if echo.method != want_method {
            bail!("backend saw method {}, expected {want_method}", echo.method);
        }
        if let Some(ns) = &case.namespace
            && &echo.namespace != ns
        {
            bail!("backend namespace {:?}, expected {ns:?}", echo.namespace);
        }
        let want_headers = case.exp_headers.as_ref().unwrap_or(&case.headers);
        for (name, want) in want_headers {
            let got = echo.header(name).map(|v| v.join(","));
            if got.as_deref() != Some(want.as_str()) {
                bail!("backend saw header {name}: {got:?}, expected {want:?}");
            }
        }
        for name in &case.absent {
            if echo.header(name).is_some() {
                bail!("backend saw header {name}, which should be absent");
            }
        }
        if let Some(backend) = &case.backend
            && !echo.pod.starts_with(backend.as_str())
        {
            bail!("served by pod {:?}, expected backend {backend:?}", echo.pod);
        }
        if let Some(sni) = &case.exp_sni
            && ex.backend_sni.as_ref() != Some(sni)
        {
            bail!(
                "the backend's connection had SNI {:?}, expected {sni:?}",
                ex.backend_sni
            );
        }
    } else if matches!(ex.status, 301 | 302 | 303 | 307 | 308)
        && let Some(r) = &case.redirect
    {
        let Some((scheme, host, port, path)) = &ex.location else {
            bail!("redirect without a Location header");
        };
        let request_scheme = if case.sni.is_some() { "https" } else { "http" };
        let want_scheme = r
            .scheme
            .clone()
            .unwrap_or_else(|| request_scheme.to_owned());
        let want_host = r.host.clone().unwrap_or_else(|| host.clone());
        // No expected port: the scheme's default (reported empty).
        let want_port = r.port.clone().unwrap_or_default();
        let want_path = r
            .path
            .clone()
            .unwrap_or_else(|| case.path.split('?').next().unwrap_or("").to_owned());
        let got = (scheme, host, port, path);
        let want = (&want_scheme, &want_host, &want_port, &want_path);
        if got != want {
            bail!("redirect to (scheme, host, port, path) {got:?}, expected {want:?}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use sluice::echo::EchoResponse;

    use super::*;

    fn echo(pod: &str, path: &str, headers: &[(&str, &str)]) -> EchoResponse {
        EchoResponse {
            path: path.to_owned(),
            host: "example.com".to_owned(),
            method: "GET".to_owned(),
            proto: "HTTP/1.1".to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), vec![(*v).to_owned()]))
                .collect(),
            namespace: INFRA.to_owned(),
            ingress: String::new(),
            service: String::new(),
            pod: pod.to_owned(),
            body_bytes: 0,
        }
    }

    fn exchange(status: u16, echo: Option<EchoResponse>) -> Exchange {
        Exchange {
            status,
            headers: Vec::new(),
            echo,
            backend_sni: None,
            location: None,
        }
    }

    #[test]
    fn compare_checks_backend_prefix_path_and_headers() {
        let case = same_ns("/a")
            .header("Version", "one")
            .infra("infra-backend-v1");
        let ok = exchange(
            200,
            Some(echo(
                "infra-backend-v1-5f7c9-0",
                "/a",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &ok).is_ok());
        let wrong_pod = exchange(
            200,
            Some(echo(
                "infra-backend-v2-5f7c9-0",
                "/a",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &wrong_pod).is_err());
        let wrong_path = exchange(
            200,
            Some(echo(
                "infra-backend-v1-5f7c9-0",
                "/b",
                &[("Version", "one")],
            )),
        );
        assert!(compare(&case, &wrong_path).is_err());
        let no_header = exchange(200, Some(echo("infra-backend-v1-5f7c9-0", "/a", &[])));
        assert!(compare(&case, &no_header).is_err());
        assert!(compare(&case, &exchange(404, None)).is_err());
        let absent = same_ns("/a")
            .absent("Version")
            .infra("infra-backend-v1")
            .exp_no_headers();
        assert!(compare(&absent, &ok).is_err());
    }

    #[test]
    fn an_expected_sni_is_the_one_the_backend_reports() {
        let case = same_ns("/a")
            .infra("infra-backend-v1")
            .exp_sni("abc.example.com");
        let mut ex = exchange(200, Some(echo("infra-backend-v1-5f7c9-0", "/a", &[])));
        assert!(compare(&case, &ex).is_err(), "no TLS reported");
        ex.backend_sni = Some("other.example.com".into());
        assert!(compare(&case, &ex).is_err());
        ex.backend_sni = Some("abc.example.com".into());
        assert!(compare(&case, &ex).is_ok());
    }

    #[test]
    fn statuses_and_header_alternatives() {
        let case = same_ns("/p")
            .statuses(&[200, 204])
            .resp_header_one_of("a", &["x, y", "y, x"])
            .to("", "");
        let mut ex = exchange(204, None);
        ex.headers = vec![("a".into(), "y,x".into())];
        assert!(compare(&case, &ex).is_ok(), "204 and whitespace ignored");
        ex.status = 403;
        assert!(compare(&case, &ex).is_err());
        let mut ex = exchange(200, Some(echo("infra-backend-v1-1", "/p", &[])));
        ex.headers = vec![("a".into(), "x, y".into())];
        assert!(
            compare(&case, &ex).is_err(),
            "namespace \"\": the gateway must answer, not a backend"
        );
        ex.echo = None;
        assert!(compare(&case, &ex).is_ok());
    }

    #[test]
    fn a_weight_verdict_wants_exactly_the_weighted_backends() {
        let want = [("v1", 0.7), ("v2", 0.3), ("v3", 0.0)];
        let counts = |c: &[(&'static str, usize)]| c.iter().copied().collect();
        assert!(within_five_points(&counts(&[("v1", 350), ("v2", 150)]), 500, &want).is_ok());
        // Within 5 points everywhere, but a zero-weight backend was served.
        let err = within_five_points(&counts(&[("v1", 340), ("v2", 150), ("v3", 10)]), 500, &want)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("expected 2 backends to receive traffic, but 3 did"),
            "{err}"
        );
        let err = within_five_points(&counts(&[("v1", 500)]), 500, &want).unwrap_err();
        assert!(err.to_string().contains("but 1 did"), "{err}");
        assert!(within_five_points(&counts(&[("v1", 400), ("v2", 100)]), 500, &want).is_err());
    }

    #[tokio::test]
    async fn convergence_wants_the_successes_in_a_row() {
        use std::cell::Cell;
        // Fails, succeeds twice, fails, then succeeds: 3 in a row come
        // only from the fifth attempt on.
        let script = [false, true, true, false, true, true, true, false];
        let n = Cell::new(0);
        let attempt = || {
            let i = n.get();
            n.set(i + 1);
            async move {
                if script[i] {
                    Ok(())
                } else {
                    bail!("attempt {i} failed")
                }
            }
        };
        converge(3, MAX_TIME_TO_CONSISTENCY, attempt).await.unwrap();
        assert_eq!(n.get(), 7);
        // One that never holds fails with its last error.
        let err = converge(3, Duration::ZERO, || async { bail!("never") })
            .await
            .unwrap_err();
        assert!(format!("{err:#}").contains("never"), "{err:#}");
        assert!(
            format!("{err:#}").contains("not 3 answers in a row"),
            "{err:#}"
        );
    }

    #[test]
    fn redirect_expectations_default_to_the_request() {
        let case = same_ns("/p").redirect(302).r_host("example.org");
        let mut ex = exchange(302, None);
        ex.location = Some((
            "http".into(),
            "example.org".into(),
            String::new(),
            "/p".into(),
        ));
        assert!(compare(&case, &ex).is_ok());
        ex.location = Some((
            "https".into(),
            "example.org".into(),
            String::new(),
            "/p".into(),
        ));
        assert!(
            compare(&case, &ex).is_err(),
            "scheme defaults to the request's"
        );
        ex.location = Some((
            "http".into(),
            "example.org".into(),
            "8080".into(),
            "/p".into(),
        ));
        assert!(
            compare(&case, &ex).is_err(),
            "no expected port means the scheme's default"
        );
    }
}
