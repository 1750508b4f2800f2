//! Subcommands other than `serve`: `check` and `demo`.
