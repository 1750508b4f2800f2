//! Subcommands other than `serve`: `check` (what sluice would do with a set
//! of manifests, without serving them), `explain` (which rule and backend
//! one request gets), `convert` (other controllers' configuration to
//! Gateway API objects) and `demo` (the examples served to
//! built-in echo backends, with what each backend received).
//!
//! They live in the library, not in `main.rs`, so that tests call them with
//! an in-memory writer and `main.rs` stays a thin clap layer.

pub mod check;
pub mod convert;
pub mod demo;
pub mod explain;

use std::path::PathBuf;

/// The manifests a command reads, and the CRDs that validate them: shared
/// by the commands that load manifests without serving them, so each gets
/// `--crds` the same way.
#[derive(Debug, Clone, clap::Args)]
pub struct Manifests {
    /// Manifest file or directory (read recursively: *.yaml, *.yml, *.json). Repeatable.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// CustomResourceDefinitions (files or directories, e.g. the upstream standard-install.yaml): objects of the kinds they define are validated by their schema and CEL rules, with the API server's messages. Other documents in them are ignored. CRD documents among the -f manifests count too. Repeatable.
    #[arg(long = "crds", value_name = "PATH")]
    pub crds: Vec<PathBuf>,
}
