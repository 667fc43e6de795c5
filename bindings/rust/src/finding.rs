//! What `Session::finish` found wrong with a capture it still completed: a
//! warning value, so that a model bug (a family that should learn and got no
//! gradient) shows up when the capture ends rather than as an invalid trace
//! found later.
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::contract::{Expectation, GradientFamily};
use crate::session::Gradient;

/// How much a [`Finding`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// An explicit expectation is broken: candle-graph reports the check of
    /// the same name as a health error, and the trace is not valid.
    Violation,
    /// Allowed by the contract, and likely worth a look (a defaulted family
    /// without any gradient; spans the tracing layer could not see).
    Note,
}

/// One parameter a finding names, with the fact recorded for it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParameterState {
    /// The parameter collection.
    pub root: String,
    /// The parameter's key.
    pub key: String,
    /// What the captured update recorded for it.
    pub gradient: Gradient,
}

/// One health issue of a finished capture.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Finding {
    /// The check: candle-graph's name for a [`Severity::Violation`]
    /// (`gradient_active_family_below_minimum`,
    /// `gradient_inactive_family_leakage`,
    /// `gradient_conditional_family_below_minimum`,
    /// `gradient_family_non_finite`); for a note, this binding's
    /// (`gradient_family_without_gradient`, `tracing_layer_recorded_nothing`,
    /// `tracing_spans_unreachable`).
    pub check: &'static str,
    /// Whether candle-graph will call the trace invalid for it.
    pub severity: Severity,
    /// The gradient family, for gradient checks.
    pub family: Option<String>,
    /// The family's declared expectation and `min_present`, for gradient checks.
    pub expectation: Option<(Expectation, u64)>,
    /// The parameters that explain the finding (those without a gradient,
    /// those that leaked one, those non-finite).
    pub parameters: Vec<ParameterState>,
    /// A sentence naming everything above.
    pub message: String,
}

impl Finding {
    pub(crate) fn gradient(
        check: &'static str,
        severity: Severity,
        fam: &GradientFamily,
        message: String,
        parameters: Vec<ParameterState>,
    ) -> Finding {
        Finding {
            check,
            severity,
            family: Some(fam.family.clone()),
            expectation: Some((fam.expectation, fam.min_present)),
            parameters,
            message,
        }
    }

    /// A finding with no family or parameters.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn note(check: &'static str, message: String) -> Finding {
        Finding {
            check,
            severity: Severity::Note,
            family: None,
            expectation: None,
            parameters: Vec::new(),
            message,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Violation => "violation",
            Severity::Note => "note",
        };
        write!(f, "{sev} [{}]: {}", self.check, self.message)
    }
}

/// A capture that ended `complete` (from [`crate::Session::finish`]): the
/// trace's path and what the binding found wrong with the captured update.
///
/// It dereferences to the path (`done.display()`, `&*done`), and converts
/// into a `PathBuf`. Findings nobody looked at ([`findings`](Self::findings),
/// [`violations`](Self::violations), [`is_clean`](Self::is_clean) or
/// `Display`) are written to stderr when it drops, so `session.finish()?;`
/// does not lose them.
#[derive(Debug)]
pub struct Completed {
    path: PathBuf,
    findings: Vec<Finding>,
    read: AtomicBool,
}

impl Completed {
    pub(crate) fn new(path: PathBuf, findings: Vec<Finding>) -> Completed {
        Completed {
            path,
            findings,
            read: AtomicBool::new(false),
        }
    }

    /// The trace's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every finding, violations first, in the contract's family order.
    pub fn findings(&self) -> &[Finding] {
        self.read.store(true, Ordering::Relaxed);
        &self.findings
    }

    /// The findings candle-graph reports as health errors.
    pub fn violations(&self) -> impl Iterator<Item = &Finding> {
        self.findings()
            .iter()
            .filter(|f| f.severity == Severity::Violation)
    }

    /// No finding at all.
    pub fn is_clean(&self) -> bool {
        self.findings().is_empty()
    }

    /// The path and the findings, which are then the caller's to show
    /// (nothing is written to stderr).
    pub fn into_parts(mut self) -> (PathBuf, Vec<Finding>) {
        self.read.store(true, Ordering::Relaxed);
        (
            std::mem::take(&mut self.path),
            std::mem::take(&mut self.findings),
        )
    }

    /// The path, dropping the findings (written to stderr when unread).
    pub fn into_path(self) -> PathBuf {
        let path = self.path.clone();
        drop(self);
        path
    }
}

fn report(path: &Path, findings: &[Finding]) {
    let mut s = format!(
        "candle-trace: {} finding(s) in the capture {}:",
        findings.len(),
        path.display()
    );
    for f in findings {
        s.push_str("\n  ");
        s.push_str(&f.to_string());
    }
    eprintln!("{s}");
}

impl Drop for Completed {
    fn drop(&mut self) {
        if !self.read.load(Ordering::Relaxed) && !self.findings.is_empty() {
            report(&self.path, &self.findings);
        }
    }
}

impl fmt::Display for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let findings = self.findings();
        write!(
            f,
            "{}: complete, {} finding(s)",
            self.path.display(),
            findings.len()
        )?;
        for x in findings {
            write!(f, "\n  {x}")?;
        }
        Ok(())
    }
}

impl Deref for Completed {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Completed {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl From<Completed> for PathBuf {
    fn from(c: Completed) -> PathBuf {
        c.into_path()
    }
}

impl PartialEq<PathBuf> for Completed {
    fn eq(&self, other: &PathBuf) -> bool {
        &self.path == other
    }
}

impl PartialEq<Path> for Completed {
    fn eq(&self, other: &Path) -> bool {
        self.path == other
    }
}
