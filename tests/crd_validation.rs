//! Validation by the upstream Gateway API CRDs (`../shared/gateway-api/crds`,
//! or `$SLUICE_GATEWAY_API`; skipped with a message when absent).

use std::path::Path;

use sluice::resources::crd::{Crds, is_crd};

fn load_crds(dir: &Path) -> Crds {
    let mut crds = Crds::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for doc in sluice::yaml::documents(&text).expect("YAML") {
            if is_crd(&doc.value) {
                crds.add(&doc.value, &format!("{}:{}", file.display(), doc.line))
                    .expect("a usable CRD");
            }
        }
    }
    crds
}

fn upstream(channel: &str) -> Option<Crds> {
    match sluice::upstream::gateway_api_dir("crds") {
        Ok(dir) => Some(load_crds(&dir.join(channel))),
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}

#[test]
fn every_rule_of_the_upstream_crds_compiles() {
    for channel in ["standard", "experimental"] {
        let Some(crds) = upstream(channel) else {
            return;
        };
        let stats = crds.stats();
        println!(
            "{channel}: {} CEL rules evaluated, {} transition rules, {} could not compile: {:?}",
            stats.compiled,
            stats.transition,
            stats.failed.len(),
            stats.failed
        );
        assert!(stats.failed.is_empty(), "{channel}: {:?}", stats.failed);
        assert!(stats.compiled > 200, "{channel}: {stats:?}");
    }
}
