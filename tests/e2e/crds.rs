//! Validation by CRDs through the binary: a CustomResourceDefinition among
//! the manifests validates the objects of its kind (refusals on `/errors`
//! with the rule's message and field), objects get the CRD defaults
//! (`/status` shows a parentRef as a cluster stores it), and a change to the
//! CRD validates the files that did not change again.

use std::time::{Duration, Instant};

use crate::support::*;

/// An HTTPRoute CRD of our own making: a small part of the upstream
/// schema, and a rule that a test can relax.
fn crd(rule: &str) -> String {
    format!(
        r#"
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: httproutes.gateway.networking.k8s.io}}
spec:
  group: gateway.networking.k8s.io
  names: {{kind: HTTPRoute, plural: httproutes}}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {{type: string}}
          kind: {{type: string}}
          metadata: {{type: object}}
          spec:
            type: object
            properties:
              hostnames: {{type: array, items: {{type: string}}}}
              parentRefs:
                type: array
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {{type: string}}
                    namespace: {{type: string}}
                    group: {{type: string, default: gateway.networking.k8s.io}}
                    kind: {{type: string, default: Gateway}}
              rules:
                type: array
                items:
                  type: object
                  properties:
                    backendRefs:
                      type: array
                      items:
                        type: object
                        properties:
                          name: {{type: string}}
                          port: {{type: integer}}
                          weight: {{type: integer, default: 1}}
                        x-kubernetes-validations:
                        - rule: "{rule}"
                          message: only port 8080 is allowed here
          status: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_among_the_manifests_validates_and_defaults_and_a_changed_crd_revalidates() {
    let app = Pods::start("default", "app", 1).await;
    let good = route(
        "default",
        "good",
        "  hostnames: [good.example]\n  rules:\n  - backendRefs: [{name: app, port: 8080}]",
    );
    let bad = route(
        "default",
        "bad",
        "  hostnames: [bad.example]\n  rules:\n  - backendRefs: [{name: app, port: 9090}]",
    );
    let gw = Sluice::start(&[
        ("base.yaml", gateway() + &app.manifests() + &good),
        ("crd.yaml", crd("self.port == 8080")),
        ("bad.yaml", bad),
    ])
    .await;

    gw.eventually("good.example", "/", |r| r.status == 200)
        .await;
    let errors = gw.errors().await;
    let refusal = errors
        .as_array()
        .and_then(|e| e.iter().find(|e| e["object"] == "HTTPRoute default/bad"))
        .unwrap_or_else(|| panic!("bad is not refused: {errors:#}"));
    assert_eq!(
        refusal["field"], "spec.rules[0].backendRefs[0]",
        "{refusal:#}"
    );
    assert_eq!(
        refusal["message"], "Invalid value: \"object\": only port 8080 is allowed here",
        "{refusal:#}"
    );
    assert_eq!(
        refusal["file"].as_str().map(|f| f.ends_with("bad.yaml")),
        Some(true)
    );

    // The parentRef as a cluster stores it: the CRD's defaults filled in.
    let status = gw.object_status("HTTPRoute", Some("default"), "good").await;
    let parent_ref = &status["status"]["parents"][0]["parentRef"];
    assert_eq!(
        parent_ref["group"], "gateway.networking.k8s.io",
        "{status:#}"
    );
    assert_eq!(parent_ref["kind"], "Gateway", "{status:#}");

    // Relax the rule: bad.yaml did not change, but it is validated again
    // and served.
    gw.write("crd.yaml", &crd("self.port > 0"));
    gw.eventually("bad.example", "/", |r| r.status != 404).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let errors = gw.errors().await;
        if errors.as_array().is_some_and(|e| e.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "errors stay: {errors:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
