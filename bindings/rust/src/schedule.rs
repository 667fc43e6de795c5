//! A training loop's profiling plan: statistics of every update in constant
//! memory, and full traces of the updates worth one — a chosen update
//! ([`Schedule::new`]), or the ones that go wrong ([`Schedule::watch`]).
//!
//! The loop runs every update through [`Schedule::update`]; the closure gets
//! the [`Update`], and opens its phase spans through it, so captured and
//! uncaptured updates run the same body:
//!
//! ```no_run
//! use candle_trace::{Run, Schedule, Step};
//!
//! # fn main() -> candle_trace::Result<()> {
//! let schedule = Schedule::watch("traces/", Run::training("mlp::train", 1, "cpu"))?
//!     .with_aggregate("traces/stats.json", None)?;
//! for _ in 0..10_000 {
//!     schedule.update(|u| {
//!         let batch = { let _d = u.span("train/data", Step::None)?; 0.25 /* next batch */ };
//!         let loss = { let _f = u.span("train/forward", Step::Forward)?; batch * 2.0 };
//!         u.loss(loss);                                     // non-finite trigger
//!         let _b = u.span("train/backward", Step::Backward)?;
//!         Ok::<_, candle_trace::Error>(())
//!     })?;
//! }
//! let done = schedule.finish()?;
//! for f in &done.fired {
//!     println!("update {} {}: {} -> {:?}", f.update, f.trigger, f.detail, f.trace);
//! }
//! for (trace, findings) in &done.findings {
//!     println!("{}: {} finding(s)", trace.display(), findings.len()); // never printed for you
//! }
//! # Ok(()) }
//! ```
//!
//! **Watching** (the triggers are those of the Python binding's
//! `candle_trace.torch.watch`, see [`crate::triggers`]): every update runs
//! under a *flight recorder*, a buffered session (`"buffer": {"max_bytes":
//! N}` in the run JSON) holding the update's spans and ops (no tensor
//! statistics: [`crate::SessionRef::records_stats`] is off, so it stays
//! cheap; what outgrows the bound is dropped and counted in the trace), whose
//! record calls are held in the binding ([`crate::SessionRef::hold_records`])
//! and reach the library only if the update is written. When
//! a trigger fires for it — slow, a non-finite loss, a panic or an `Err`
//! inside the update, [`Schedule::trigger`] — it is written as
//! `update-<N>-<trigger>.jsonl` (`failed` with the panic's or the error's
//! message for `exception`, complete otherwise, with the trigger's value and
//! threshold as scalars `candle_trace/trigger/<trigger>` and
//! `candle_trace/trigger/<trigger>/threshold` of its measured region);
//! otherwise it is dropped unwritten and its session reopened for the next
//! update (`ct_reopen`). After a trigger (but `exception`) the next update is
//! captured in full, statistics included
//! (`update-<N>-after-<trigger>.jsonl`). At most
//! [`WatchOptions::max_traces`] traces are written in a run. With aggregate
//! statistics, each trigger that fires is also a scalar `trigger/<name>` (its
//! value) of the summary and an entry of its `triggers` list (with its trace,
//! or why none was written: [`crate::SessionRef::aggregate_trigger`]), and the loss a
//! scalar `loss`.
//!
//! The update's measured region (named as the update span, `train/step`) is
//! opened by the schedule in the session recording the update and is that
//! thread's current session ([`crate::current`]) while the update runs, so
//! [`crate::candle::Traced`] modules record their ops into it.
//!
//! [`Schedule::begin_update`] is the guard form of the same (its update ends
//! with [`Update::end`], [`Update::fail`] or on drop). On a fixed capture step
//! ([`Schedule::new`]) the guard form leaves the measured region to the
//! caller, as it always did:
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
//!     }
//!     update.scalar("loss", 0.25)?;
//!     update.end()?;
//! }
//! let done = schedule.finish()?;
//! println!("trace {:?}, summary {:?}", done.trace, done.summary);
//! # Ok(()) }
//! ```
//!
//! A captured update is counted in the statistics too, with the capture's
//! cost in it (visible in its span's max); Python's `candle_trace.torch.profile`
//! counts it the same way.

use std::cell::{Cell, RefCell};
use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::contract::GradientContract;
use crate::error::{check, Error, Result, Status};
use crate::ffi;
use crate::finding::{Completed, Finding};
use crate::run::Run;
use crate::session::{
    panic_note, Active, Session, SessionRef, SpanGuard, SpanId, SpanKind, Step, TriggerTrace,
};
use crate::triggers::{Clock, CpuWait, Evaluator, Fired, SystemClock, Trigger, Triggers};

#[cfg(feature = "candle")]
mod candle;
mod recorder_cost;

use recorder_cost::RecorderCost;

/// The aggregate span around each update, and the measured region of the
/// update's trace, unless [`Schedule::with_update_span`] names another.
pub const DEFAULT_UPDATE_SPAN: &str = "train/step";
/// At most this many traces in a watched run unless [`WatchOptions::max_traces`] says.
pub const DEFAULT_MAX_TRACES: usize = 3;
/// The aggregate summary's scalar of the flight recorder's measured share
/// ([`Schedule::recorder_cost`]), folded once, when measured.
pub const RECORDER_SHARE: &str = "flight_recorder/share";
/// The flight recorder's bound unless [`WatchOptions::flight_recorder`] says (64 MiB).
pub const DEFAULT_RECORDER_BYTES: u64 = 64 << 20;

/// How a [`Schedule::watch`] reacts to triggers.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchOptions {
    /// Which triggers fire.
    pub triggers: Triggers,
    /// At most this many traces are written in the run.
    pub max_traces: usize,
    /// The flight recorder's memory bound in bytes (1 to 64 GiB); `None` turns
    /// it off (then only the update after a trigger is captured).
    pub flight_recorder: Option<u64>,
    /// Whether the update after a trigger is captured in full.
    pub capture_next: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            triggers: Triggers::default(),
            max_traces: DEFAULT_MAX_TRACES,
            flight_recorder: Some(DEFAULT_RECORDER_BYTES),
            capture_next: true,
        }
    }
}

/// A watching schedule's configuration and state.
struct Watch {
    folder: PathBuf,
    opts: WatchOptions,
    /// The run JSON, for full captures (`capture_step` set per update).
    full: Value,
    /// The same with the flight recorder's `buffer`.
    flight: Value,
    /// The run's gradient contract, as `Session::open` takes it from the run
    /// (its defaulted families noted, not declared), for every trace.
    contract: Option<GradientContract>,
    state: RefCell<WatchState>,
}

struct WatchState {
    eval: Evaluator,
    fired: Vec<Fired>,
    traces: Vec<PathBuf>,
    /// The flight recorder of an update just dropped, reopened for the next.
    spare: Option<Session>,
    /// The trigger the next full capture follows.
    after: Option<Trigger>,
    cpu_wait: CpuWait,
    recorder_cost: RecorderCost,
}

/// What records an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    None,
    /// The fixed capture step of [`Schedule::new`].
    Step,
    /// The flight recorder.
    Flight,
    /// The full capture after a trigger.
    After(Trigger),
}

/// A run's profiling plan (see the module's doc). Not `Sync`: one thread
/// drives the loop (the spans inside an update may come from any thread,
/// through the sessions).
pub struct Schedule {
    trace_path: PathBuf,
    run: Run,
    aggregate: Option<Session>,
    update_span: String,
    next: Cell<u64>,
    in_update: Cell<bool>,
    /// The fixed capture's outcome once its update ended.
    trace: RefCell<Option<Result<PathBuf>>>,
    /// Each written trace's findings, for [`Finished::findings`].
    findings: RefCell<Vec<(PathBuf, Vec<Finding>)>>,
    watch: Option<Watch>,
    clock: Box<dyn Clock>,
    system_clock: bool,
}

/// What a finished schedule wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The trace of the fixed capture step; `None` when the loop stopped
    /// before it, and for a watching schedule.
    pub trace: Option<PathBuf>,
    /// The aggregate summary, when statistics were kept.
    pub summary: Option<PathBuf>,
    /// Updates begun.
    pub updates: u64,
    /// The triggers that fired, in order, each with the trace written for it.
    pub fired: Vec<Fired>,
    /// The traces a watching schedule wrote, in order.
    pub traces: Vec<PathBuf>,
    /// The findings of each trace written (fixed capture and watch alike)
    /// that has any, in the order written: a schedule hands them over here
    /// instead of printing them as each trace is written.
    pub findings: Vec<(PathBuf, Vec<Finding>)>,
    /// What the flight recorder added to the updates it recorded, as a
    /// share of their own time ([`Schedule::recorder_cost`]).
    pub recorder_cost: Option<f64>,
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
            findings: RefCell::new(Vec::new()),
            watch: None,
            clock: Box::new(SystemClock::new()),
            system_clock: true,
        }
    }

    /// Watches every update and keeps the ones that go wrong in `folder`
    /// (see the module's doc), with the default [`WatchOptions`]. `run`'s
    /// capture step is replaced by each trace's update, and its warm-up steps
    /// and correlation id by the defaults that update gives them
    /// (`<N> - 1`, `<entrypoint>/update-<N>`).
    /// Refuses a run with `measured_root()` ([`Status::InvalidArgument`]):
    /// the schedule opens each update's measured region itself.
    pub fn watch(folder: impl AsRef<Path>, run: Run) -> Result<Schedule> {
        Self::watch_with(folder, run, WatchOptions::default())
    }

    /// [`Schedule::watch`] with options of your choice; refuses
    /// ([`Status::InvalidArgument`]) bad triggers ([`Triggers::check`]), a
    /// flight recorder bound of 0 and a measured root.
    pub fn watch_with(folder: impl AsRef<Path>, run: Run, opts: WatchOptions) -> Result<Schedule> {
        let eval = Evaluator::new(opts.triggers.clone())?;
        if run.is_measured_root() {
            return Err(Error::invalid("watch: the schedule opens each update's measured region; a run with measured_root() has none to open"));
        }
        if opts.flight_recorder == Some(0) {
            return Err(Error::invalid(
                "watch: the flight recorder's bound must be at least 1 byte (None turns it off)",
            ));
        }
        let contract = run.gradient_contract_ref().cloned();
        if let Some(c) = &contract {
            c.check_builders()?;
        }
        let mut full: Value = serde_json::from_str(&run.to_json())
            .map_err(|e| Error::invalid(format!("run JSON: {e}")))?;
        if let Value::Object(m) = &mut full {
            // Each trace's update decides them (ct_open's defaults from its capture step).
            m.remove("warmup_steps");
            m.remove("correlation_id");
        }
        let mut flight = full.clone();
        if let (Value::Object(m), Some(bytes)) = (&mut flight, opts.flight_recorder) {
            m.insert("buffer".into(), serde_json::json!({ "max_bytes": bytes }));
        }
        let mut s = Schedule::new(folder.as_ref().join("unused.jsonl"), run);
        s.watch = Some(Watch {
            folder: folder.as_ref().to_path_buf(),
            opts,
            full,
            flight,
            contract,
            state: RefCell::new(WatchState {
                eval,
                fired: Vec::new(),
                traces: Vec::new(),
                spare: None,
                after: None,
                cpu_wait: CpuWait::default(),
                recorder_cost: RecorderCost::default(),
            }),
        });
        Ok(s)
    }

    /// Also keeps statistics of every update in a `candle-trace/aggregate/1`
    /// summary at `summary_path` (rewritten every `interval_ms`, default 10 s,
    /// and at finish). Opens the aggregate session now.
    pub fn with_aggregate(
        mut self,
        summary_path: impl AsRef<Path>,
        interval_ms: Option<u64>,
    ) -> Result<Schedule> {
        if self.aggregate.is_some() {
            return Err(Error::Trace {
                status: Status::State,
                message: "candle-trace: this schedule already keeps aggregate statistics".into(),
            });
        }
        self.aggregate = Some(Session::open(
            summary_path,
            self.run.clone().aggregate(interval_ms),
        )?);
        Ok(self)
    }

    /// Names the aggregate span around each update and the trace's measured
    /// region (default `train/step`).
    pub fn with_update_span(mut self, name: impl Into<String>) -> Schedule {
        self.update_span = name.into();
        self
    }

    /// Times updates for the slow trigger with `clock` instead of the system
    /// clock (see [`Clock`]: a [`crate::ManualClock`] makes it deterministic).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Schedule {
        self.clock = Box::new(clock);
        self.system_clock = false;
        self
    }

    /// The aggregate session, when statistics are kept.
    pub fn aggregate(&self) -> Option<&Session> {
        self.aggregate.as_ref()
    }

    /// The update that is captured (one-based) on a fixed capture step.
    pub fn capture_step(&self) -> u64 {
        self.run.capture_step()
    }

    /// Updates begun so far.
    pub fn updates(&self) -> u64 {
        self.next.get() - 1
    }

    /// Whether this schedule watches for triggers ([`Schedule::watch`]).
    pub fn is_watching(&self) -> bool {
        self.watch.is_some()
    }

    /// The triggers that fired so far.
    pub fn fired(&self) -> Vec<Fired> {
        self.watch
            .as_ref()
            .map(|w| w.state.borrow().fired.clone())
            .unwrap_or_default()
    }

    /// What the flight recorder adds to the updates it records, as a share
    /// of the update's own time -- the tracer time of each (what the
    /// recording bracketed as the tracer's own work,
    /// [`SessionRef::tracer_work`]) plus the arming of its recording before
    /// it began (`ct_reopen`), over its wall time less that tracer time --
    /// the median over 20 completed updates after the first 3; `None` until
    /// measured (and without a flight recorder, or on a clock of
    /// [`Schedule::with_clock`]). A lower bound of what recording costs the
    /// loop: at 0.05 or more, [`WatchOptions::flight_recorder`] `None` keeps
    /// every trigger and captures the update after one fires in full,
    /// without recording every update. Printed nowhere: the program's to
    /// read, as the findings are; with aggregate statistics also the
    /// summary's scalar [`RECORDER_SHARE`].
    pub fn recorder_cost(&self) -> Option<f64> {
        self.watch
            .as_ref()
            .and_then(|w| w.state.borrow().recorder_cost.share())
    }

    /// Why the slow trigger could not fire yet, or `None` where it can, is
    /// off, or the schedule does not watch: it times [`Triggers::warmup`]
    /// updates first, so a run shorter than that is never slow -- what to say
    /// beside "no trigger fired", which otherwise reads as "nothing was slow".
    pub fn slow_unarmed(&self) -> Option<String> {
        let w = self.watch.as_ref()?;
        let st = w.state.borrow();
        if st.eval.triggers().slow.is_none() || st.eval.slow_armed() {
            return None;
        }
        Some(format!(
            "the slow trigger arms after {} timed updates; this run timed {}",
            st.eval.triggers().warmup,
            st.eval.timed()
        ))
    }

    /// The traces written so far by a watching schedule.
    pub fn traces(&self) -> Vec<PathBuf> {
        self.watch
            .as_ref()
            .map(|w| w.state.borrow().traces.clone())
            .unwrap_or_default()
    }

    /// The program's own trigger (`user`), for the update under way (or the
    /// next one, between updates): a condition only the program knows.
    /// [`Status::State`] on a schedule that does not watch.
    pub fn trigger(&self, why: &str) -> Result<()> {
        match &self.watch {
            Some(w) => {
                w.state.borrow_mut().eval.ask(why);
                Ok(())
            }
            None => Err(Error::Trace {
                status: Status::State,
                message: "candle-trace: trigger() needs a watching schedule (Schedule::watch)"
                    .into(),
            }),
        }
    }

    /// Runs one update: `f` gets the [`Update`] to open its spans through
    /// (the same body for a captured update and an uncaptured one). The
    /// update ends when `f` returns: an `Err` (its `Display` the reason) or a
    /// panic is the `exception` trigger, and the update's capture, if any,
    /// ends `failed` with it; the error is returned, the panic goes on
    /// unwinding. The schedule's own failures come back as `E` through
    /// `From<Error>`; when `f` failed, its error wins. The measured region
    /// is opened here (see the module's doc).
    pub fn update<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&Update<'_>) -> std::result::Result<T, E>,
        E: From<Error> + Display,
    {
        let mut u = self.begin(true)?;
        match f(&u) {
            Ok(v) => {
                u.close(None)?;
                Ok(v)
            }
            Err(e) => {
                let _ = u.close(Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Begins the next update (the guard form of [`Schedule::update`]): opens
    /// the aggregate update span and the session recording this update, if
    /// any. One update at a time ([`Status::State`] otherwise). A watching
    /// schedule opens the measured region too; on a fixed capture step the
    /// caller does.
    pub fn begin_update(&self) -> Result<Update<'_>> {
        self.begin(self.watch.is_some())
    }

    fn begin(&self, measure: bool) -> Result<Update<'_>> {
        if self.in_update.get() {
            return Err(Error::Trace {
                status: Status::State,
                message: format!(
                    "candle-trace: update {} has not ended; end it before beginning the next",
                    self.next.get() - 1
                ),
            });
        }
        let number = self.next.get();
        let mut arming = 0.0;
        let (capture, kind) = match &self.watch {
            Some(w) => {
                let t = std::time::Instant::now();
                let armed = w.arm(number)?;
                arming = t.elapsed().as_secs_f64();
                armed
            }
            None if number == self.run.capture_step() => (
                Some(Session::open(&self.trace_path, self.run.clone())?),
                Kind::Step,
            ),
            None => (None, Kind::None),
        };
        let mut u = Update {
            schedule: self,
            number,
            kind,
            measured: 0,
            active: None,
            span: None,
            capture,
            loss: Cell::new(None),
            start: Default::default(),
            tracer0: 0,
            arming,
            gradients: RefCell::new(None),
            ended: false,
        };
        let opened = (|| -> Result<()> {
            if let Some(a) = &self.aggregate {
                u.span = Some(a.try_span(&self.update_span, SpanKind::Function, Step::None)?);
            }
            // A measured root is the region already (fixed capture step only).
            if let (Some(c), true) = (
                &u.capture,
                (measure || kind != Kind::Step) && !self.run.is_measured_root(),
            ) {
                let mut id: ffi::ct_span = 0;
                let name = std::ffi::CString::new(self.update_span.as_str())
                    .map_err(|_| Error::invalid("the update span's name has a NUL"))?;
                // SAFETY: the name is NUL-terminated and lives across the call.
                check(unsafe { ffi::ct_measurement_begin(c.raw(), name.as_ptr(), &mut id) })?;
                u.measured = id;
                u.active = Some(c.activate());
            }
            Ok(())
        })();
        if let Err(e) = opened {
            u.ended = true;
            u.span.take();
            u.active.take();
            if let Some(c) = u.capture.take() {
                self.dispose(c, kind);
            }
            return Err(e);
        }
        self.next.set(number + 1);
        self.in_update.set(true);
        if let (Some(w), true) = (&self.watch, self.system_clock) {
            w.state.borrow_mut().cpu_wait.take(None);
        }
        u.tracer0 = u.capture.as_ref().map_or(0, |c| c.tracer_ns());
        u.start = self.clock.now();
        Ok(u)
    }

    /// Ends a session nobody will read: a flight recorder unwritten, another
    /// as `failed`.
    fn dispose(&self, c: Session, kind: Kind) {
        if kind == Kind::Flight {
            let _ = c.discard();
        } else {
            let _ = c.finish_failed("candle-trace: the update could not begin");
        }
    }

    /// Finishes the aggregate session (its final summary) and returns what
    /// was written. The fixed capture's own failure, if it failed, is
    /// returned here too, after the summary has been written.
    pub fn finish(mut self) -> Result<Finished> {
        let updates = self.updates();
        let (fired, traces) = self.end_watch();
        let summary = match self.aggregate.take() {
            Some(a) => Some(a.finish()?.into_path()),
            None => None,
        };
        let trace = self.trace.borrow_mut().take().transpose()?;
        let findings = self.findings.take();
        let recorder_cost = self.recorder_cost();
        Ok(Finished {
            trace,
            summary,
            updates,
            fired,
            traces,
            findings,
            recorder_cost,
        })
    }

    /// Ends the aggregate session with a `failed` summary carrying `reason`
    /// (statistics gathered so far are kept).
    pub fn finish_failed(mut self, reason: &str) -> Result<()> {
        self.end_watch();
        match self.aggregate.take() {
            Some(a) => a.finish_failed(reason),
            None => Ok(()),
        }
    }

    /// Keeps a written trace's findings for [`Finished`] (under `renamed`,
    /// the trace's final name, when it moved) and returns its path.
    fn keep_findings(&self, done: Completed, renamed: Option<PathBuf>) -> PathBuf {
        let (path, findings) = done.into_parts();
        let path = renamed.unwrap_or(path);
        if !findings.is_empty() {
            self.findings.borrow_mut().push((path.clone(), findings));
        }
        path
    }

    /// Drops the spare flight recorder unwritten; the watch's record.
    fn end_watch(&mut self) -> (Vec<Fired>, Vec<PathBuf>) {
        let Some(w) = &self.watch else {
            return (vec![], vec![]);
        };
        let mut st = w.state.borrow_mut();
        if let Some(spare) = st.spare.take() {
            let _ = spare.discard();
        }
        (st.fired.clone(), st.traces.clone())
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        // The spare flight recorder must not end as a `failed` trace.
        self.end_watch();
    }
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedule")
            .field("updates", &self.updates())
            .field("watching", &self.watch.is_some())
            .field("aggregate", &self.aggregate.is_some())
            .field("update_span", &self.update_span)
            .finish()
    }
}

impl Watch {
    fn path(&self, n: u64, what: &str) -> PathBuf {
        self.folder.join(format!("update-{n:06}-{what}.jsonl"))
    }

    fn left(&self, st: &WatchState) -> usize {
        self.opts.max_traces.saturating_sub(st.traces.len())
    }

    fn open(&self, json: &Value, n: u64, path: &Path) -> Result<Session> {
        let mut json = json.clone();
        json["capture_step"] = n.into();
        Session::open_with(path, &json.to_string(), false, self.contract.clone())
    }

    /// The session recording update `n`, if any.
    fn arm(&self, n: u64) -> Result<(Option<Session>, Kind)> {
        let mut st = self.state.borrow_mut();
        let left = self.left(&st);
        if let (Some(t), true) = (st.after, left > 0) {
            st.after = None;
            if let Some(spare) = st.spare.take() {
                let _ = spare.discard();
            }
            let s = self.open(&self.full, n, &self.path(n, &format!("after-{t}")))?;
            return Ok((Some(s), Kind::After(t)));
        }
        if self.opts.flight_recorder.is_none() || left == 0 {
            st.after = None;
            if let Some(spare) = st.spare.take() {
                let _ = spare.discard();
            }
            return Ok((None, Kind::None));
        }
        let path = self.path(n, "recording");
        let s = match st.spare.take().map(|s| s.reopen(&path, n)) {
            Some(Ok(s)) => s,
            Some(Err((spare, _))) => {
                if let Some(spare) = spare {
                    let _ = spare.discard();
                }
                self.open(&self.flight, n, &path)?
            }
            None => self.open(&self.flight, n, &path)?,
        };
        s.set_records_stats(false);
        // Its records stay in the binding until the update is kept (nearly
        // none is): no call into the library's runtime per update.
        s.hold_records(
            usize::try_from(self.opts.flight_recorder.unwrap_or(DEFAULT_RECORDER_BYTES))
                .unwrap_or(usize::MAX),
        );
        Ok((Some(s), Kind::Flight))
    }

    /// Moves a written trace to its final name (never over another file) and
    /// counts it; `None` when nothing was written.
    fn keep(&self, st: &mut WatchState, written: &Path, n: u64, what: &str) -> Option<PathBuf> {
        if !written.exists() {
            return None;
        }
        let mut dst = self.path(n, what);
        let mut i = 1;
        while dst != written && dst.exists() {
            i += 1;
            dst = self.path(n, &format!("{what}-{i}"));
        }
        if dst != written && std::fs::rename(written, &dst).is_err() {
            dst = written.to_path_buf();
        }
        st.traces.push(dst.clone());
        Some(dst)
    }
}

/// One update of a [`Schedule`]. Ends when dropped (with a `failed` capture,
/// and the `exception` trigger, when the thread is panicking), or with
/// [`Update::end`] / [`Update::fail`], which return the verdict.
#[must_use = "the update ends when the guard is dropped: bind it with `let update = ...`"]
pub struct Update<'a> {
    schedule: &'a Schedule,
    number: u64,
    kind: Kind,
    /// The measured region in `capture` (0: none opened by the schedule).
    measured: ffi::ct_span,
    active: Option<Active>,
    span: Option<SpanGuard<'a>>,
    capture: Option<Session>,
    loss: Cell<Option<f64>>,
    start: std::time::Duration,
    tracer0: u64,
    /// Seconds the watch took to arm this update's recording (a flight
    /// recorder's `ct_reopen`), before it began.
    arming: f64,
    /// A flight recorder's gradient facts, recorded only if the update is
    /// written (`backward_step` leaves them here): [`Update::record_held_gradients`].
    #[cfg_attr(not(feature = "candle"), allow(dead_code))]
    gradients: RefCell<Option<HeldGradients>>,
    ended: bool,
}

/// Records an update's gradient facts into the session given.
type HeldGradients = Box<dyn FnOnce(&SessionRef) -> Result<()>>;

/// An update's times, as it ends.
struct Elapsed {
    /// Seconds of the update for the slow trigger, the tracer's time left
    /// out (`None`: not timed, a full capture's time is the capture's).
    seconds: Option<f64>,
    /// The time the machine held the update up (the slow trigger's).
    waited: f64,
    /// The update's wall time, and the tracer time of the session recording
    /// it (0 on a clock of [`Schedule::with_clock`]).
    wall: f64,
    tracer: f64,
}

/// A span of an update (from [`Update::span`]): in the session recording the
/// update, if any, and in the aggregate session, if any. Ends when dropped.
#[must_use = "the span ends when the guard is dropped: bind it with `let _s = ...`"]
#[derive(Debug)]
pub struct UpdateSpan<'u> {
    trace: Option<SpanGuard<'u>>,
    stats: Option<SpanGuard<'u>>,
    full: bool,
}

impl<'u> UpdateSpan<'u> {
    /// The span in the update's trace (`None` when the update is not recorded).
    pub fn id(&self) -> Option<SpanId> {
        self.trace.as_ref().map(|s| s.id())
    }

    /// The trace session the span is in, when the update is captured in full
    /// (not a flight recorder): for statistics and other costly records.
    pub fn full_capture(&self) -> Option<&'u SessionRef> {
        self.trace
            .as_ref()
            .filter(|_| self.full)
            .map(|s| s.session())
    }

    /// Ends the span in both sessions; the first failure.
    pub fn end(mut self) -> Result<()> {
        let t = self.trace.take().map_or(Ok(()), |s| s.end());
        let a = self.stats.take().map_or(Ok(()), |s| s.end());
        t.and(a)
    }
}

impl<'a> Update<'a> {
    /// The update's number (one-based).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The trace session when this update is captured in full: the fixed
    /// capture step, or the update after a trigger.
    pub fn capture(&self) -> Option<&Session> {
        self.capture.as_ref().filter(|_| self.kind != Kind::Flight)
    }

    /// The flight recorder's session, when this update is flight-recorded.
    pub fn recorder(&self) -> Option<&Session> {
        self.capture.as_ref().filter(|_| self.kind == Kind::Flight)
    }

    /// The session recording this update, full capture or flight recorder.
    pub fn trace(&self) -> Option<&SessionRef> {
        self.capture.as_deref()
    }

    /// The aggregate session, when statistics are kept.
    pub fn aggregate(&self) -> Option<&'a Session> {
        self.schedule.aggregate.as_ref()
    }

    /// The aggregate update span (for records that belong to the update).
    pub fn span_id(&self) -> Option<SpanId> {
        self.span.as_ref().map(|s| s.id())
    }

    /// Opens a function span tagged `step` in the session recording the
    /// update and in the aggregate session, nested in this thread's
    /// innermost open span of each.
    pub fn span(&self, name: &str, step: Step) -> Result<UpdateSpan<'_>> {
        self.span_kind(name, SpanKind::Function, step)
    }

    /// [`Update::span`] of another kind (`Module` for a forward, say).
    pub fn span_kind(&self, name: &str, kind: SpanKind, step: Step) -> Result<UpdateSpan<'_>> {
        let trace = self
            .capture
            .as_ref()
            .map(|c| c.try_span(name, kind, step))
            .transpose()?;
        let stats = self
            .aggregate()
            .map(|a| a.try_span(name, kind, step))
            .transpose()?;
        Ok(UpdateSpan {
            trace,
            stats,
            full: self.capture().is_some(),
        })
    }

    /// The update's loss: evaluated by the `non_finite` trigger, folded into
    /// the aggregate scalar `loss`, and a scalar `loss` of a full capture's
    /// measured region. The last value given counts.
    pub fn loss(&self, value: impl Into<f64>) {
        self.loss.set(Some(value.into()));
    }

    /// The program's own trigger for this update ([`Schedule::trigger`]).
    pub fn trigger(&self, why: &str) -> Result<()> {
        self.schedule.trigger(why)
    }

    /// Folds `value` into the aggregate statistics of `label` (count, mean,
    /// min, max, last). Does nothing without aggregate statistics.
    pub fn scalar(&self, label: &str, value: f64) -> Result<()> {
        match self.aggregate() {
            Some(a) => a.scalar(SpanId::ROOT, label, value),
            None => Ok(()),
        }
    }

    /// Ends the update: evaluates the triggers, closes the aggregate span,
    /// ends the update's capture (written, or dropped). Returns the first
    /// failure.
    pub fn end(mut self) -> Result<()> {
        self.close(None)
    }

    /// Ends the update as failed with `reason` (an error the update met):
    /// the `exception` trigger, as an `Err` returned from
    /// [`Schedule::update`] is.
    pub fn fail(mut self, reason: &str) -> Result<()> {
        let reason = if reason.trim().is_empty() {
            "the update failed"
        } else {
            reason
        };
        self.close(Some(reason.to_string()))
    }

    /// The update's times (see [`Elapsed`]).
    fn elapsed(&self) -> Elapsed {
        let s = self.schedule;
        let wall = s.clock.now().saturating_sub(self.start).as_secs_f64();
        let waited = match (&s.watch, s.system_clock) {
            (Some(w), true) => w.state.borrow_mut().cpu_wait.take(Some(wall)),
            _ => 0.0,
        };
        let tracer = match (&self.capture, s.system_clock) {
            (Some(c), true) => c.tracer_ns().saturating_sub(self.tracer0) as f64 / 1e9,
            _ => 0.0,
        };
        let seconds = (!matches!(self.kind, Kind::After(_))).then(|| (wall - tracer).max(0.0));
        Elapsed {
            seconds,
            waited,
            wall,
            tracer,
        }
    }

    /// Records the gradient facts a flight recorder held, into `c` (the update
    /// is being written), as the tracer's own work; a failure is `c`'s to report.
    fn record_held_gradients(&self, c: &SessionRef) {
        if let Some(record) = self.gradients.borrow_mut().take() {
            let done = c.tracer_work().and_then(|_w| record(c));
            if let Err(e) = done {
                c.defer(e);
            }
        }
    }

    fn end_measured(&mut self) -> Result<()> {
        let id = std::mem::replace(&mut self.measured, 0);
        let r = match (&self.capture, id) {
            // SAFETY: plain values.
            (Some(c), id) if id != 0 => check(unsafe { ffi::ct_span_end(c.raw(), id) }),
            _ => Ok(()),
        };
        self.active.take();
        r
    }

    fn close(&mut self, failure: Option<String>) -> Result<()> {
        self.ended = true;
        self.schedule.in_update.set(false);
        let elapsed = self.elapsed();
        let result = match &self.schedule.watch {
            None => self.close_step(failure),
            Some(w) => self.close_watched(w, failure, elapsed),
        };
        let span = self.span.take().map_or(Ok(()), |s| s.end());
        result.and(span)
    }

    fn close_step(&mut self, failure: Option<String>) -> Result<()> {
        let loss = self.loss.get();
        if let (Some(c), Some(l)) = (&self.capture, loss) {
            if self.measured != 0 {
                c.scalar(SpanId(self.measured), "loss", l)?;
            }
        }
        self.fold_loss(loss, None)?;
        if self.capture.is_none() {
            return Ok(());
        }
        if let Some(reason) = failure {
            self.active.take();
            return self.capture.take().expect("checked").finish_failed(&reason);
        }
        let measured = self.end_measured();
        let capture = self.capture.take().expect("checked");
        // Kept for Schedule::finish, also when the span failed: the capture
        // is a file the caller may still want.
        let outcome = capture
            .finish()
            .map(|done| self.schedule.keep_findings(done, None));
        let result = match &outcome {
            Ok(_) => measured,
            Err(e) => Err(Error::Trace {
                status: e.status().unwrap_or(Status::Internal),
                message: e.message(),
            }),
        };
        *self.schedule.trace.borrow_mut() = Some(outcome);
        result
    }

    /// The loss and a firing into the whole run's statistics: the firing as
    /// the scalar `trigger/<name>` and in the summary's list of firings, with
    /// its trace or `no_trace`, why none was written.
    fn fold_loss(&self, loss: Option<f64>, fired: Option<(&Fired, &str)>) -> Result<()> {
        let Some(a) = self.aggregate() else {
            return Ok(());
        };
        if let Some(l) = loss {
            a.scalar(SpanId::ROOT, "loss", l)?;
        }
        if let Some((f, no_trace)) = fired {
            a.scalar(SpanId::ROOT, &format!("trigger/{}", f.trigger), f.value)?;
            let written = match &f.trace {
                Some(p) => TriggerTrace::Written(p),
                None => TriggerTrace::None(no_trace),
            };
            let detail = f.detail.lines().next().filter(|l| !l.is_empty());
            a.aggregate_trigger(
                f.update,
                &f.trigger.to_string(),
                f.value,
                f.threshold,
                detail,
                written,
            )?;
        }
        Ok(())
    }

    /// Why a firing has no trace, in the words the Python binding uses.
    fn no_trace_reason(w: &Watch, st: &WatchState, recorded: bool) -> String {
        if w.left(st) == 0 && (recorded || w.opts.flight_recorder.is_some()) {
            format!("the run's cap of {} traces was reached", w.opts.max_traces)
        } else if !recorded {
            "not recorded: the flight recorder is off".to_string()
        } else {
            "the capture wrote nothing".to_string()
        }
    }

    fn close_watched(
        &mut self,
        w: &Watch,
        failure: Option<String>,
        elapsed: Elapsed,
    ) -> Result<()> {
        let n = self.number;
        let loss = self.loss.get();
        let capture = self.capture.take();
        let recorded = capture.is_some();
        let mut result = Ok(());
        let mut st = w.state.borrow_mut();
        let fired = match failure {
            Some(reason) => {
                // The update's time and loss do not join the window: it did
                // not complete.
                self.active.take();
                let trace = match capture {
                    Some(c) if w.opts.triggers.exception || self.kind != Kind::Flight => {
                        self.record_held_gradients(&c);
                        let path = c.path().to_path_buf();
                        result = c.finish_failed(&reason);
                        let what = match self.kind {
                            Kind::After(t) if !w.opts.triggers.exception => format!("after-{t}"),
                            _ => "exception".to_string(),
                        };
                        w.keep(&mut st, &path, n, &what)
                    }
                    Some(c) => {
                        let _ = c.discard();
                        None
                    }
                    None => None,
                };
                w.opts.triggers.exception.then_some(Fired {
                    update: n,
                    trigger: Trigger::Exception,
                    value: 0.0,
                    threshold: 0.0,
                    detail: reason,
                    trace,
                })
            }
            None => {
                let measured = (self.kind == Kind::Flight && self.schedule.system_clock)
                    .then(|| {
                        st.recorder_cost
                            .add(elapsed.tracer, elapsed.wall, self.arming)
                    })
                    .flatten();
                if let (Some(share), Some(a)) = (measured, self.aggregate()) {
                    // Stated once, where the run's statistics are.
                    result = a.scalar(SpanId::ROOT, RECORDER_SHARE, share);
                }
                let mut fired = st
                    .eval
                    .end_of_update(n, elapsed.seconds, loss, elapsed.waited);
                if let Some(c) = capture {
                    self.capture = Some(c);
                    result = result.and(self.close_capture(w, &mut st, fired.as_mut(), loss));
                }
                fired
            }
        };
        if let Some(f) = &fired {
            if w.opts.capture_next && f.trigger != Trigger::Exception {
                st.after = Some(f.trigger);
            }
            st.fired.push(f.clone());
        }
        let no_trace = fired
            .as_ref()
            .map(|_| Self::no_trace_reason(w, &st, recorded))
            .unwrap_or_default();
        drop(st);
        result.and(self.fold_loss(loss, fired.as_ref().map(|f| (f, no_trace.as_str()))))
    }

    /// Writes or drops the capture of an update that completed.
    fn close_capture(
        &mut self,
        w: &Watch,
        st: &mut WatchState,
        fired: Option<&mut Fired>,
        loss: Option<f64>,
    ) -> Result<()> {
        let n = self.number;
        let kind = self.kind;
        let keep_flight = kind == Kind::Flight && fired.is_some() && w.left(st) > 0;
        if kind == Kind::Flight && !keep_flight {
            // Dropped: its session waits for the next update (ct_reopen).
            self.active.take();
            st.spare = self.capture.take();
            return Ok(());
        }
        let c = self.capture.as_ref().expect("a capture to close");
        let measured = SpanId(self.measured);
        let mut noted = Ok(());
        if let (Kind::After(_), Some(l)) = (kind, loss) {
            noted = c.scalar(measured, "loss", l);
        }
        self.record_held_gradients(c);
        if let (true, Some(f)) = (keep_flight, fired.as_deref()) {
            noted = noted
                .and_then(|_| {
                    c.scalar(
                        measured,
                        &format!("candle_trace/trigger/{}", f.trigger),
                        f.value,
                    )
                })
                .and_then(|_| {
                    c.scalar(
                        measured,
                        &format!("candle_trace/trigger/{}/threshold", f.trigger),
                        f.threshold,
                    )
                });
        }
        let ended = self.end_measured();
        let c = self.capture.take().expect("a capture to close");
        let path = c.path().to_path_buf();
        let finished = c.finish();
        let what = match (kind, fired.as_deref()) {
            (Kind::After(t), _) => format!("after-{t}"),
            (_, Some(f)) => f.trigger.to_string(),
            _ => "recording".to_string(),
        };
        let kept = w.keep(st, &path, n, &what);
        let finished = finished.map(|done| {
            self.schedule.keep_findings(done, kept.clone());
        });
        // A trigger that fired in an update captured in full names that
        // trace too: it holds the anomalous update.
        if let Some(f) = fired {
            if f.trace.is_none() {
                f.trace = kept;
            }
        }
        noted.and(ended).and(finished)
    }
}

impl Drop for Update<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let failure = std::thread::panicking().then(|| format!("panic: {}", panic_note()));
        // Errors have nowhere to go from a drop: the sessions defer theirs.
        let _ = self.close(failure);
    }
}

impl std::fmt::Debug for Update<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Update")
            .field("number", &self.number)
            .field("kind", &self.kind)
            .finish()
    }
}
