//! Both modes in one run: statistics of every update in constant memory, and
//! the full trace of one chosen update.
//!
//! A training loop asks the [`Schedule`] for each update; the guard it gets
//! back says whether this update is the captured one (then it holds the trace
//! session to record into) and keeps the aggregate session's update span open
//! until it ends.
//!
//! ```no_run
//! use candle_trace::{Run, Schedule, SpanKind, Step};
//!
//! # fn main() -> candle_trace::Result<()> {
//! let schedule = Schedule::new("traces/step3.jsonl", Run::training("mlp::train", 3, "cpu"))
//!     .with_aggregate("traces/stats.json", None)?;
//! for _ in 0..10_000 {
//!     let update = schedule.begin_update()?;
//!     if let Some(trace) = update.capture() {
//!         let _m = trace.measure("train/update")?;
//!         // ... the update, with spans, ops and gradients recorded into `trace`
//!     } else if let Some(stats) = update.aggregate() {
//!         let _fwd = stats.try_span("train/forward", SpanKind::Module, Step::Forward)?;
//!         // ... the update, with a few phase spans
//!     }
//!     update.scalar("loss", 0.25)?;
//!     update.end()?;
//! }
//! let done = schedule.finish()?;
//! println!("trace {:?}, summary {:?}", done.trace, done.summary);
//! # Ok(()) }
//! ```
//!
//! The captured update is counted in the statistics too, with the capture's
//! cost in it (visible in its span's max); Python's `candle_trace.torch.profile`
//! counts it the same way.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, Status};
use crate::run::Run;
use crate::session::{Session, SpanGuard, SpanId, SpanKind, Step};

/// The aggregate span around each update unless
/// [`Schedule::with_update_span`] names another.
pub const DEFAULT_UPDATE_SPAN: &str = "train/step";

/// A run's profiling plan: capture update `run.capture_step()` into a trace,
/// and optionally keep aggregate statistics of every update. Not `Sync`: one
/// thread drives the loop (the spans inside an update may come from any
/// thread, through the sessions).
#[derive(Debug)]
pub struct Schedule {
    trace_path: PathBuf,
    run: Run,
    aggregate: Option<Session>,
    update_span: String,
    next: Cell<u64>,
    in_update: Cell<bool>,
    /// The capture's outcome once its update ended.
    trace: RefCell<Option<Result<PathBuf>>>,
}

/// What a finished schedule wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The trace of the captured update; `None` when the loop stopped before it.
    pub trace: Option<PathBuf>,
    /// The aggregate summary, when statistics were kept.
    pub summary: Option<PathBuf>,
    /// Updates begun.
    pub updates: u64,
}

impl Schedule {
    /// Captures update `run.capture_step()` (one-based) into `trace_path`.
    pub fn new(trace_path: impl AsRef<Path>, run: Run) -> Schedule {
        Schedule {
            trace_path: trace_path.as_ref().to_path_buf(),
            run,
            aggregate: None,
            update_span: DEFAULT_UPDATE_SPAN.to_string(),
            next: Cell::new(1),
            in_update: Cell::new(false),
            trace: RefCell::new(None),
        }
    }

    /// Also keeps statistics of every update in a `candle-trace/aggregate/1`
    /// summary at `summary_path` (rewritten every `interval_ms`, default 10 s,
    /// and at finish). Opens the aggregate session now.
    pub fn with_aggregate(mut self, summary_path: impl AsRef<Path>, interval_ms: Option<u64>) -> Result<Schedule> {
        if self.aggregate.is_some() {
            return Err(Error::Trace {
                status: Status::State,
                message: "candle-trace: this schedule already keeps aggregate statistics".into(),
            });
        }
        self.aggregate = Some(Session::open(summary_path, self.run.clone().aggregate(interval_ms))?);
        Ok(self)
    }

    /// Names the aggregate span around each update (default `train/step`).
    pub fn with_update_span(mut self, name: impl Into<String>) -> Schedule {
        self.update_span = name.into();
        self
    }

    /// The aggregate session, when statistics are kept.
    pub fn aggregate(&self) -> Option<&Session> {
        self.aggregate.as_ref()
    }

    /// The update that is captured (one-based).
    pub fn capture_step(&self) -> u64 {
        self.run.capture_step()
    }

    /// Updates begun so far.
    pub fn updates(&self) -> u64 {
        self.next.get() - 1
    }

    /// Begins the next update: opens the aggregate update span and, on the
    /// capture step, the trace session. One update at a time
    /// ([`Status::State`] otherwise).
    pub fn begin_update(&self) -> Result<Update<'_>> {
        if self.in_update.get() {
            return Err(Error::Trace {
                status: Status::State,
                message: format!("candle-trace: update {} has not ended; end it before beginning the next", self.next.get() - 1),
            });
        }
        let number = self.next.get();
        let capture = if number == self.run.capture_step() { Some(Session::open(&self.trace_path, self.run.clone())?) } else { None };
        let span = match &self.aggregate {
            Some(a) => Some(a.try_span(&self.update_span, SpanKind::Function, Step::None)?),
            None => None,
        };
        self.next.set(number + 1);
        self.in_update.set(true);
        Ok(Update { schedule: self, number, span, capture })
    }

    /// Finishes the aggregate session (its final summary) and returns what
    /// was written. The capture's own failure, if it failed, is returned here
    /// too, after the summary has been written.
    pub fn finish(mut self) -> Result<Finished> {
        let updates = self.updates();
        let summary = match self.aggregate.take() {
            Some(a) => Some(a.finish()?),
            None => None,
        };
        let trace = self.trace.borrow_mut().take().transpose()?;
        Ok(Finished { trace, summary, updates })
    }

    /// Ends the aggregate session with a `failed` summary carrying `reason`
    /// (statistics gathered so far are kept).
    pub fn finish_failed(mut self, reason: &str) -> Result<()> {
        match self.aggregate.take() {
            Some(a) => a.finish_failed(reason),
            None => Ok(()),
        }
    }
}

/// One update of a [`Schedule`]. Ends when dropped: the aggregate update span
/// closes and, on the capture step, the trace session finishes (with a
/// `failed` terminal when the thread is panicking). [`Update::end`] does the
/// same and returns the verdict.
#[must_use = "the update ends when the guard is dropped: bind it with `let update = ...`"]
pub struct Update<'a> {
    schedule: &'a Schedule,
    number: u64,
    // Field order is drop order: the update span ends before the capture.
    span: Option<SpanGuard<'a>>,
    capture: Option<Session>,
}

impl<'a> Update<'a> {
    /// The update's number (one-based).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The trace session, on the captured update only.
    pub fn capture(&self) -> Option<&Session> {
        self.capture.as_ref()
    }

    /// The aggregate session, when statistics are kept.
    pub fn aggregate(&self) -> Option<&'a Session> {
        self.schedule.aggregate.as_ref()
    }

    /// The aggregate update span (for records that belong to the update).
    pub fn span(&self) -> Option<SpanId> {
        self.span.as_ref().map(|s| s.id())
    }

    /// Folds `value` into the aggregate statistics of `label` (count, mean,
    /// min, max, last). Does nothing without aggregate statistics.
    pub fn scalar(&self, label: &str, value: f64) -> Result<()> {
        match self.aggregate() {
            Some(a) => a.scalar(SpanId::ROOT, label, value),
            None => Ok(()),
        }
    }

    /// Ends the update: closes the aggregate span, then finishes the capture
    /// on the capture step. Returns the first failure of either.
    pub fn end(mut self) -> Result<()> {
        self.finish_parts()
    }

    fn finish_parts(&mut self) -> Result<()> {
        self.schedule.in_update.set(false);
        let span = self.span.take().map_or(Ok(()), |s| s.end());
        let Some(capture) = self.capture.take() else { return span };
        // Kept for Schedule::finish, also when the span failed: the capture
        // is a file the caller may still want.
        let outcome = capture.finish();
        let result = match &outcome {
            Ok(_) => span,
            Err(e) => Err(Error::Trace { status: e.status().unwrap_or(Status::Internal), message: e.message() }),
        };
        *self.schedule.trace.borrow_mut() = Some(outcome);
        result
    }
}

impl Drop for Update<'_> {
    fn drop(&mut self) {
        self.schedule.in_update.set(false);
        // The span guard defers its own failure to the aggregate session.
        self.span.take();
        if let Some(capture) = self.capture.take() {
            if std::thread::panicking() {
                drop(capture); // ends failed, naming the panic
            } else {
                *self.schedule.trace.borrow_mut() = Some(capture.finish());
            }
        }
    }
}

impl std::fmt::Debug for Update<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Update").field("number", &self.number).field("captured", &self.capture.is_some()).finish()
    }
}
