//! `sluice convert ingress-nginx`: read Ingresses (and the Services they
//! name) from manifests, print the Gateway API objects that serve them as
//! ingress-nginx does, and report on stderr how exact each annotation is.

use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use crate::ingress_nginx::{Conversion, Input, Options, convert};
use crate::resources::load::read_documents;
use crate::source::files::read_all;

/// How the conversion went, as the exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything converted exactly (0).
    Exact,
    /// Something was approximated, unsupported or not merged (1).
    Inexact,
    /// The input could not be read (2).
    Unreadable,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Exact => 0,
            Outcome::Inexact => 1,
            Outcome::Unreadable => 2,
        }
    }
}

/// Read the Ingresses and Services under `paths`. An error names the file
/// (and line, and object) that cannot be read.
pub fn read_input(paths: &[PathBuf]) -> Result<Input, Vec<String>> {
    let listing = read_all(paths);
    let mut errors: Vec<String> = listing.problems.iter().map(|p| p.to_string()).collect();
    let mut input = Input::default();
    for read in &listing.reads {
        let text = match &read.content {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("{}: cannot read: {e}", read.file));
                continue;
            }
        };
        let docs = match read_documents(text, &read.file) {
            Ok(d) => d,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        crate::ingress_nginx::read_documents_into(&read.file, &docs, &mut input, &mut errors);
    }
    if errors.is_empty() {
        Ok(input)
    } else {
        Err(errors)
    }
}

/// The objects as a multi-document YAML stream.
pub fn to_yaml(objects: &[Value]) -> String {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&crate::yaml::to_string(o).expect("JSON values always serialize as YAML"));
    }
    out
}

/// Run the conversion: YAML on `out`, the report on `err`.
pub fn run(
    paths: &[PathBuf],
    options: &Options,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<Outcome> {
    let input = match read_input(paths) {
        Ok(i) => i,
        Err(errors) => {
            for e in errors {
                writeln!(err, "{e}")?;
            }
            return Ok(Outcome::Unreadable);
        }
    };
    let Conversion { objects, report } = convert(&input, options);
    out.write_all(to_yaml(&objects).as_bytes())?;
    for line in &report.lines {
        writeln!(err, "{line}")?;
    }
    Ok(if report.is_exact() {
        Outcome::Exact
    } else {
        Outcome::Inexact
    })
}
