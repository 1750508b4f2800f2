//! Subcommands other than `serve`: `check` (what sluice would do with a set
//! of manifests, without serving them) and `demo` (the examples served to
//! built-in echo backends, with what each backend received).
//!
//! They live in the library, not in `main.rs`, so that tests call them with
//! an in-memory writer and `main.rs` stays a thin clap layer.

pub mod check;
pub mod demo;
