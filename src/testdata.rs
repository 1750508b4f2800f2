//! The inputs some tests need from outside the repository, and the one
//! rule for when one is missing.
//!
//! The upstream Gateway API files (CRDs, conformance manifests) sit in
//! `../shared/gateway-api/` beside the repository, as CI lays it out, or in
//! the folder `$SLUICE_GATEWAY_API` names (a checkout elsewhere, e.g. a git
//! worktree). Other inputs (a chromium for the dashboard's browser test)
//! are found by the tests themselves.
//!
//! A user's clone may have none of them. Then a test reports what is
//! missing with [`or_skip`]: a plain run prints the reason on stderr and
//! skips; with `SLUICE_REQUIRE_ALL=1` (set by `.ci/run`) the test fails
//! instead, naming what is missing, so that CI cannot pass on tests that
//! did not run.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The variable that turns a missing input into a failure.
pub const REQUIRE_ALL: &str = "SLUICE_REQUIRE_ALL";

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

/// Whether every input is required (`SLUICE_REQUIRE_ALL` set, other than
/// to `0` or empty).
pub fn require_all() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The input a test needs, or `None` after reporting why it is missing:
/// with `SLUICE_REQUIRE_ALL=1` this panics naming it; otherwise it writes
/// the reason to stderr (past libtest's capture, so that a plain
/// `cargo test` shows it) and the caller skips (returns, or leaves out the
/// part that needed the input).
///
/// # Panics
///
/// When the input is missing and [`require_all`] holds.
#[track_caller]
pub fn or_skip<T>(input: Result<T, String>) -> Option<T> {
    match input {
        Ok(value) => Some(value),
        Err(why) => {
            assert!(
                !require_all(),
                "a required test input is missing ({REQUIRE_ALL} is set): {why}"
            );
            // Straight to the process's stderr: libtest captures what
            // `eprintln!` prints in a passing test, and this must be seen.
            // libtest names a test's thread after the test.
            let test = std::thread::current()
                .name()
                .map(|n| format!(" {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                std::io::stderr(),
                "skipped{test}: {why} (set {REQUIRE_ALL}=1 to make this a failure)"
            );
            None
        }
    }
}
