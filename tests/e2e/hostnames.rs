//! Hostnames: listener and route hostnames intersect (wildcards as the spec
//! says); an exact hostname beats a wildcard and a longer wildcard beats a
//! shorter one; route hostnames outside the listener's are ignored.

use crate::support::*;

fn hosted(name: &str, hostnames: &str, backend: &str) -> String {
    route(
        "default",
        name,
        &format!(
            "  hostnames: {hostnames}\n  rules:\n  - backendRefs: [{{name: {backend}, port: 8080}}]"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_beats_wildcard_and_longer_wildcard_beats_shorter() {
    let mut manifests = gateway();
    let mut pods = Vec::new();
    for n in ["exact", "wild", "longwild", "none"] {
        let p = Pods::start("default", n, 1).await;
        manifests += &p.manifests();
        pods.push(p);
    }
    // Listed least specific first: order must not matter.
    manifests += &hosted("none", "[]", "none");
    manifests += &hosted("wild", "[\"*.example.com\"]", "wild");
    manifests += &hosted("longwild", "[\"*.a.example.com\"]", "longwild");
    manifests += &hosted("exact", "[\"foo.example.com\"]", "exact");
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;
    let mut c = gw.connect().await;
    for (host, want) in [
        ("foo.example.com", "exact-0"),
        ("FOO.Example.com:8080", "exact-0"),
        ("bar.example.com", "wild-0"),
        ("deep.bar.example.com", "wild-0"),
        ("x.a.example.com", "longwild-0"),
        ("example.com", "none-0"), // *.example.com does not match the apex
        ("other.org", "none-0"),
    ] {
        assert_eq!(c.get(host, "/").await.pod(), want, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_hostname_intersects_route_hostnames() {
    let app = Pods::start("default", "app", 1).await;
    let inherit = Pods::start("default", "inherit", 1).await;
    let gw_yaml = gateway().replace(
        "    protocol: HTTP\n",
        "    protocol: HTTP\n    hostname: \"*.example.com\"\n",
    );
    let manifests = gw_yaml
        + &app.manifests()
        + &inherit.manifests()
        + &hosted(
            "partly",
            "[\"test.example.com\", \"test.example.net\"]",
            "app",
        )
        + &hosted("outside", "[\"example.net\"]", "app")
        + &hosted("inherits", "[]", "inherit");
    let gw = Sluice::start(&[("all.yaml", manifests)]).await;
    let mut c = gw.connect().await;
    assert_eq!(c.get("test.example.com", "/").await.pod(), "app-0");
    // Outside the listener's hostname: ignored, and no listener takes it.
    assert_eq!(c.get("test.example.net", "/").await.status, 404);
    assert_eq!(c.get("example.net", "/").await.status, 404);
    // A route without hostnames takes the listener's.
    assert_eq!(c.get("other.example.com", "/").await.pod(), "inherit-0");

    let outside = gw
        .object_status("HTTPRoute", Some("default"), "outside")
        .await;
    let accepted = outside["status"]["parents"][0]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
        .unwrap();
    assert_eq!(accepted["status"], "False", "{outside:#}");
    assert_eq!(accepted["reason"], "NoMatchingListenerHostname");
    let partly = gw
        .object_status("HTTPRoute", Some("default"), "partly")
        .await;
    assert_eq!(
        partly["status"]["parents"][0]["conditions"][0]["status"], "True",
        "{partly:#}"
    );
}
