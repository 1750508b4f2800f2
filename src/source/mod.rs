//! Sources of configuration: where the [`Snapshot`] comes from.
//!
//! Standalone mode reads manifests from files and watches them. A source
//! never routes or decides anything: it turns what it reads into a complete
//! snapshot plus the list of what it could not read, and it keeps the last
//! good objects of a file that stopped parsing, so a broken edit never takes
//! good configuration down.
//!
//! The bookkeeping (per-file last good objects, duplicates, which errors are
//! new) is pure and lives in [`merge`]; reading and watching the file system
//! is in [`files`].

pub mod files;
pub mod kubernetes;
pub mod merge;

use std::fmt;

use serde::Serialize;

use crate::resources::Snapshot;

pub use files::{FileSource, FileWatch};
pub use merge::{FileRead, FileSet};

/// A manifest problem, as shown on the admin listener's `/errors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigError {
    /// The manifest file, as it was found under the configured paths.
    pub file: String,
    /// 1-based line in `file`, when known.
    pub line: Option<usize>,
    /// `Kind namespace/name` of the object concerned, when known.
    pub object: Option<String>,
    /// Path of the offending field (`spec.rules[0].backendRefs[1].weight`),
    /// when known.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// One complete configuration produced by a source.
#[derive(Debug)]
pub struct SourceUpdate {
    pub snapshot: Snapshot,
    /// Every current problem (not only the new ones), in file order.
    pub errors: Vec<ConfigError>,
    /// Number of objects in `snapshot`.
    pub objects: usize,
}
