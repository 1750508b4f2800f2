//! The conversion's report: one line per annotation per object, saying
//! how exactly ingress-nginx's behaviour carried over, so that a person
//! knows what to check before switching controllers.

use std::fmt;

/// How one annotation (or one implicit default, or one object) carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Standard Gateway API with the same behaviour.
    Converted,
    /// Converted, but some requests are served differently (why).
    Approximated(String),
    /// Exact on sluice through a sluice extension (which): another
    /// implementation would ignore or refuse it.
    Extension(String),
    /// Not converted: ingress-nginx's behaviour is lost (why).
    Unsupported(String),
    /// The input is wrong or cannot be merged (why); the object or the
    /// annotation is left out.
    Error(String),
    /// An ingress-nginx default that changes behaviour without any
    /// annotation, and what sluice does instead. Informational: it does
    /// not change the exit status.
    Default(String),
    /// The object is not converted by design (another class).
    Skipped(String),
}

impl Verdict {
    /// Does this line make the conversion inexact (exit 1)?
    pub fn is_inexact(&self) -> bool {
        matches!(
            self,
            Verdict::Approximated(_) | Verdict::Unsupported(_) | Verdict::Error(_)
        )
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Converted => f.write_str("converted"),
            Verdict::Approximated(why) => write!(f, "approximated ({why})"),
            Verdict::Extension(which) => write!(f, "extension ({which})"),
            Verdict::Unsupported(why) => write!(f, "unsupported ({why})"),
            Verdict::Error(why) => write!(f, "error ({why})"),
            Verdict::Default(what) => write!(f, "default ({what})"),
            Verdict::Skipped(why) => write!(f, "skipped ({why})"),
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportLine {
    /// `Ingress shop/web`.
    pub object: String,
    /// The annotation's full key, or the field (`spec.rules[0]...`), or
    /// `default proxy-body-size` for an implicit default.
    pub annotation: String,
    pub verdict: Verdict,
}

impl fmt::Display for ReportLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.annotation, self.verdict)
    }
}

/// The report of one conversion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub lines: Vec<ReportLine>,
}

impl Report {
    pub fn push(&mut self, object: &str, annotation: impl Into<String>, verdict: Verdict) {
        self.lines.push(ReportLine {
            object: object.to_string(),
            annotation: annotation.into(),
            verdict,
        });
    }

    /// True when every line converted exactly (or by a sluice extension).
    pub fn is_exact(&self) -> bool {
        !self.lines.iter().any(|l| l.verdict.is_inexact())
    }

    /// The lines about one object and annotation (tests and `check`).
    pub fn find(&self, object: &str, annotation: &str) -> Option<&Verdict> {
        self.lines
            .iter()
            .find(|l| l.object == object && l.annotation == annotation)
            .map(|l| &l.verdict)
    }
}
