//! A running test: the manifests it started from (which a test may change
//! as the upstream test changes objects in the cluster), the loopback ports
//! its Gateways' listeners moved to, the echo pods, and the gateway serving
//! them.
//!
//! What a test does with it lives beside: [`crate::client`] sends the
//! suite's requests, [`crate::expect`] judges the responses,
//! [`crate::status`] reads and judges published status.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use sluice::serve::RunningGateway;

use crate::env::{self, ManifestFile, Pods, PortMap};

/// The namespace of the suite's infrastructure (Gateways, most backends).
pub const INFRA: &str = "gateway-conformance-infra";
pub const APP: &str = "gateway-conformance-app-backend";
pub const WEB: &str = "gateway-conformance-web-backend";

/// `ns/name` of object `name` in the infra namespace.
pub fn infra(name: &str) -> String {
    format!("{INFRA}/{name}")
}

/// A running test: its manifests, the gateway serving them, the pods.
pub struct Ctx<'a> {
    pub dir: PathBuf,
    pub files: Vec<ManifestFile>,
    pub ports: PortMap,
    pub pods: &'a Pods,
    pub gateway: RunningGateway,
}

impl Ctx<'_> {
    /// Change an object of the logical manifests and render them again;
    /// the gateway's watcher picks the change up.
    pub fn modify(
        &mut self,
        kind: &str,
        id: &str,
        change: impl FnOnce(&mut serde_json::Value),
    ) -> anyhow::Result<()> {
        let doc = self
            .files
            .iter_mut()
            .flat_map(|f| f.docs.iter_mut())
            .find(|d| env::kind(d) == kind && env::object_id(d) == id)
            .ok_or_else(|| anyhow!("no {kind} {id} in the manifests"))?;
        change(doc);
        env::render(&self.dir, &self.files, self.pods, &mut self.ports)
    }

    /// Create `doc`, or replace the object of its kind and `ns/name` (what
    /// the suite's applier does with an object a test builds); it joins
    /// the test's own manifest file.
    pub fn apply(&mut self, doc: serde_json::Value) -> anyhow::Result<()> {
        let (kind, id) = (env::kind(&doc).to_owned(), env::object_id(&doc));
        match self
            .files
            .iter_mut()
            .flat_map(|f| f.docs.iter_mut())
            .find(|d| env::kind(d) == kind && env::object_id(d) == id)
        {
            Some(existing) => *existing = doc,
            None => self
                .files
                .last_mut()
                .ok_or_else(|| anyhow!("the test has no manifest file"))?
                .docs
                .push(doc),
        }
        env::render(&self.dir, &self.files, self.pods, &mut self.ports)
    }

    /// What the service-types test does to its manual EndpointSlices: fill
    /// each with the pods of `deployment`. Our pods share an address and
    /// differ by port, so each slice becomes one slice per pod, listing
    /// that pod's port under the slice's port names.
    pub fn fill_endpoint_slices(
        &mut self,
        ids: &[&str],
        namespace: &str,
        deployment: &str,
    ) -> anyhow::Result<()> {
        let pods = self.pods.of(namespace, deployment);
        if pods.is_empty() {
            bail!("no pods of {namespace}/{deployment}");
        }
        for id in ids {
            let (file, index) = self
                .files
                .iter()
                .enumerate()
                .find_map(|(f, file)| {
                    file.docs
                        .iter()
                        .position(|d| env::kind(d) == "EndpointSlice" && env::object_id(d) == *id)
                        .map(|i| (f, i))
                })
                .ok_or_else(|| anyhow!("no EndpointSlice {id} in the manifests"))?;
            let slice = self.files[file].docs.remove(index);
            for (n, pod) in pods.iter().enumerate() {
                let mut filled = slice.clone();
                filled["metadata"]["name"] = format!("{}-{n}", env::name(&slice)).into();
                let endpoint = serde_json::json!([{
                    "addresses": ["127.0.0.1"],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "targetRef": {"kind": "Pod", "name": pod.server.identity().pod, "namespace": namespace},
                }]);
                filled["endpoints"] = serde_json::to_value(endpoint)?;
                if let Some(ports) = filled["ports"].as_array_mut() {
                    for p in ports {
                        let target = p["port"].as_u64().and_then(|v| u16::try_from(v).ok());
                        p["port"] = pod.server.port_for(target).into();
                    }
                }
                self.files[file].docs.insert(index + n, filled);
            }
        }
        env::render(&self.dir, &self.files, self.pods, &mut self.ports)
    }

    /// The logical (original) port of a Gateway's first listener.
    pub fn first_listener_port(&self, gateway: &str) -> anyhow::Result<u16> {
        let doc = self
            .files
            .iter()
            .flat_map(|f| &f.docs)
            .find(|d| env::kind(d) == "Gateway" && env::object_id(d) == gateway)
            .ok_or_else(|| anyhow!("no Gateway {gateway} in the manifests"))?;
        doc.get("spec")
            .and_then(|s| s.get("listeners"))
            .and_then(|l| l.get(0))
            .and_then(|l| l.get("port"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| anyhow!("Gateway {gateway} has no listener port"))
    }
}
