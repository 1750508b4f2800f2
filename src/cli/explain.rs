//! `sluice explain`: load manifests as `check` does and say which rule and
//! backend one request gets, and why. The explanation itself is
//! [`crate::explain`] (the admin listener's `/explain` shares it); this is
//! the command around it: loading, printing, exit codes.

use crate::explain::{
    BadRequest, EXIT_MATCHED, EXIT_NOT_FOUND, EXIT_UNREADABLE, ExplainRequest, explain, write_text,
};

/// `sluice explain`: load `paths` as `check` does, explain the request,
/// print it. Returns the exit code.
pub fn run(
    paths: &[std::path::PathBuf],
    crd_paths: &[std::path::PathBuf],
    state_dir: Option<&std::path::Path>,
    request: Result<ExplainRequest, BadRequest>,
    out: &mut impl std::io::Write,
    err: &mut impl std::io::Write,
) -> i32 {
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "sluice explain: {e}");
            return EXIT_UNREADABLE;
        }
    };
    let checked = crate::cli::check::load(paths, crd_paths, state_dir);
    if !checked.unreadable.is_empty() {
        for e in &checked.unreadable {
            let _ = writeln!(err, "{}: {}", e.file, e.message);
        }
        return EXIT_UNREADABLE;
    }
    let explanation = match explain(
        &checked.translation.table,
        &checked.translation.rules,
        &request,
    ) {
        Ok(e) => e,
        Err(e) => {
            let _ = writeln!(err, "sluice explain: {e}");
            return EXIT_UNREADABLE;
        }
    };
    if write_text(&explanation, out).is_err() {
        return EXIT_UNREADABLE;
    }
    if explanation.winner.is_some() {
        EXIT_MATCHED
    } else {
        EXIT_NOT_FOUND
    }
}
