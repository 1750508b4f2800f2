//! ingress-nginx to the Gateway API: `sluice convert ingress-nginx`, and
//! `serve --ingress-class`, which serves Ingresses through the same
//! conversion.
//!
//! ingress-nginx (retired by SIG Network) configured canaries and most
//! behaviour through annotations. This module reads them the way its
//! controller and its Lua balancer act on them (not only as documented),
//! writes the HTTPRoutes that serve every request the same way on sluice,
//! and reports, per annotation per object, how exact that is. Pure: the
//! caller reads files and prints (`src/cli/convert.rs`). The annotation
//! table with every verdict is docs/migrating-from-ingress-nginx.md.

pub mod annotations;
pub mod convert;
pub mod report;

pub use convert::{Conversion, Input, Options, convert, ingress_class};
pub use report::{Report, ReportLine, Verdict};
