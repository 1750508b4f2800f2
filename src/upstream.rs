//! Where tests find the upstream Gateway API files (CRDs, conformance
//! manifests): `../shared/gateway-api/` beside the repository, as CI lays
//! it out, or the folder `$SLUICE_GATEWAY_API` names (a checkout elsewhere,
//! e.g. a git worktree). A user's clone has neither: tests that need them
//! skip and say why.

use std::path::{Path, PathBuf};

/// The upstream folder `sub` (`crds`, `conformance`), or why it is absent.
pub fn gateway_api_dir(sub: &str) -> Result<PathBuf, String> {
    let base = match std::env::var_os("SLUICE_GATEWAY_API") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/gateway-api"),
    };
    let dir = base.join(sub);
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "{} not found (upstream Gateway API files: ../shared/gateway-api beside the \
             repository, or $SLUICE_GATEWAY_API)",
            dir.display()
        ))
    }
}
