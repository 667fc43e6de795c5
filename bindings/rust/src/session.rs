use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Deref;
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

use crate::contract::GradientContract;
use crate::device::DeviceOptions;
use crate::error::{check, Error, Result, Status};
use crate::ffi;
use crate::finding::{Completed, Finding};
use crate::held::{Held, Holding, Record};
use crate::run::Run;

// ---- wire enums --------------------------------------------------------------

/// Kind of work a span covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SpanKind {
    #[default]
    Function,
    Op,
    Module,
}

impl SpanKind {
    fn raw(self) -> ffi::ct_span_kind {
        match self {
            SpanKind::Function => ffi::CT_SPAN_FUNCTION,
            SpanKind::Op => ffi::CT_SPAN_OP,
            SpanKind::Module => ffi::CT_SPAN_MODULE,
        }
    }
}

/// Training phase of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Step {
    /// Not a training step phase.
    #[default]
    None,
    Forward,
    Backward,
    Optimizer,
}

impl Step {
    fn raw(self) -> ffi::ct_step {
        match self {
            Step::None => ffi::CT_STEP_NONE,
            Step::Forward => ffi::CT_STEP_FORWARD,
            Step::Backward => ffi::CT_STEP_BACKWARD,
            Step::Optimizer => ffi::CT_STEP_OPTIMIZER,
        }
    }
}

/// Logical allocation or free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryAction {
    Alloc,
    Free,
}

/// Memory category of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Category {
    #[default]
    Other,
    Parameter,
    Activation,
    Gradient,
    Optimizer,
}

impl Category {
    fn raw(self) -> ffi::ct_category {
        match self {
            Category::Other => ffi::CT_CATEGORY_OTHER,
            Category::Parameter => ffi::CT_CATEGORY_PARAMETER,
            Category::Activation => ffi::CT_CATEGORY_ACTIVATION,
            Category::Gradient => ffi::CT_CATEGORY_GRADIENT,
            Category::Optimizer => ffi::CT_CATEGORY_OPTIMIZER,
        }
    }
}

/// One gradient fact: the state and, where the state has one, the L2 norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gradient {
    /// A finite norm > 0.
    Present(f64),
    /// Norm exactly 0.
    Zero,
    /// No gradient reached the parameter.
    Missing,
    /// The gradient holds NaN or infinity.
    NonFinite,
}

impl Gradient {
    /// Classifies a computed L2 norm: > 0 present, 0 zero, NaN/inf non-finite.
    pub fn from_norm(norm: f64) -> Gradient {
        if !norm.is_finite() {
            Gradient::NonFinite
        } else if norm == 0.0 {
            Gradient::Zero
        } else {
            Gradient::Present(norm.abs())
        }
    }

    /// The trace spelling of the state.
    pub fn state_name(&self) -> &'static str {
        match self {
            Gradient::Present(_) => "present",
            Gradient::Zero => "zero",
            Gradient::Missing => "missing",
            Gradient::NonFinite => "non_finite",
        }
    }
}

/// A span of a session, as records refer to it. `SpanId::ROOT` is `s1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub u64);

impl SpanId {
    /// The root span `s1` that `Session::open` starts.
    pub const ROOT: SpanId = SpanId(1);
}

impl From<&SpanGuard<'_>> for SpanId {
    fn from(g: &SpanGuard<'_>) -> SpanId {
        SpanId(g.id)
    }
}

impl From<&Measured<'_>> for SpanId {
    fn from(g: &Measured<'_>) -> SpanId {
        SpanId(g.span.id)
    }
}

// ---- records ---------------------------------------------------------------------

/// One executed operation (`ct_record_op`).
#[derive(Debug, Clone, Default)]
pub struct Op<'a> {
    pub name: &'a str,
    pub dtype: &'a str,
    pub device: &'a str,
    /// Tensor ids read.
    pub inputs: &'a [&'a str],
    /// Tensor id produced.
    pub output: Option<&'a str>,
    /// Output shape.
    pub shape: &'a [usize],
    pub duration_ns: u64,
    /// Start on the session clock; 0 means "ended now".
    pub timestamp_ns: u64,
    /// `None`: derived from shape and dtype.
    pub output_dense_bytes: Option<u64>,
    pub input_dense_bytes: u64,
}

/// Tensor metadata (`ct_record_tensor`).
#[derive(Debug, Clone, Default)]
pub struct TensorMeta<'a> {
    pub tensor_id: &'a str,
    pub dtype: &'a str,
    pub device: &'a str,
    pub label: Option<&'a str>,
    pub shape: &'a [usize],
    pub requires_grad: bool,
    pub category: Category,
    /// `None`: derived from shape and dtype.
    pub dense_bytes: Option<u64>,
}

/// Statistics the caller already reduced (`ct_record_tensor_stats`);
/// `elements` is the product of `shape`.
#[derive(Debug, Clone, Default)]
pub struct TensorStats<'a> {
    pub label: &'a str,
    pub dtype: &'a str,
    pub shape: &'a [usize],
    pub non_finite: u64,
    pub rms: f64,
    pub abs_max: f64,
    pub mean: f64,
}

/// A logical allocation or free (`ct_record_memory`).
#[derive(Debug, Clone, Default)]
pub struct Memory<'a> {
    /// 0 means now.
    pub timestamp_ns: u64,
    pub storage_id: &'a str,
    pub tensor_id: &'a str,
    pub device: &'a str,
    pub dtype: &'a str,
    pub op_name: Option<&'a str>,
    pub bytes: u64,
    pub shape: &'a [usize],
    pub category: Category,
}

/// A device-memory sample (`ct_record_device_memory`); at least one value.
#[derive(Debug, Clone, Default)]
pub struct DeviceMemory<'a> {
    /// 0 means now.
    pub timestamp_ns: u64,
    pub device: &'a str,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
}

/// One interval of device work (`ct_record_device_interval`).
#[derive(Debug, Clone, Default)]
pub struct DeviceInterval<'a> {
    pub device: &'a str,
    pub stream_id: &'a str,
    /// `None`: the session clock (`host-monotonic`).
    pub clock_id: Option<&'a str>,
    pub backend: &'a str,
    pub name: Option<&'a str>,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub correlation_id: Option<u64>,
}

// ---- strings ---------------------------------------------------------------------

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte: {s:?}")))
}

fn opt_cstring(what: &str, s: Option<&str>) -> Result<Option<CString>> {
    s.map(|s| cstring(what, s)).transpose()
}

pub(crate) fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |c| c.as_ptr())
}

fn shape_i64(shape: &[usize]) -> Result<Vec<i64>> {
    shape
        .iter()
        .map(|&d| {
            i64::try_from(d)
                .map_err(|_| Error::invalid(format!("shape dimension {d} does not fit in i64")))
        })
        .collect()
}

fn elements(shape: &[usize]) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| Error::invalid(format!("shape {shape:?} has more than 2^64 elements")))
}

const STACK_NAME: usize = 128;

/// Calls `f` with `s` as a NUL-terminated string, copied on the stack when
/// short (the span hot path allocates nothing).
#[inline]
fn with_cstr<R>(s: &str, f: impl FnOnce(*const c_char) -> R) -> Result<R> {
    let b = s.as_bytes();
    if b.len() < STACK_NAME {
        if b.contains(&0) {
            return Err(Error::invalid(format!("name contains a NUL byte: {s:?}")));
        }
        let mut buf = MaybeUninit::<[u8; STACK_NAME]>::uninit();
        let p = buf.as_mut_ptr() as *mut u8;
        // SAFETY: b.len() + 1 <= STACK_NAME bytes are written, then read as a C string.
        unsafe {
            ptr::copy_nonoverlapping(b.as_ptr(), p, b.len());
            *p.add(b.len()) = 0;
        }
        Ok(f(p as *const c_char))
    } else {
        let c = cstring("name", s)?;
        Ok(f(c.as_ptr()))
    }
}

// ---- panic notes -------------------------------------------------------------------

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}
static PANIC_HOOK: Once = Once::new();

/// Chains a panic hook that remembers the calling thread's panic message, so
/// a session dropped while unwinding can say why in its `failed` terminal.
fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            let note = match info.location() {
                Some(l) => format!("{msg} (at {}:{})", l.file(), l.line()),
                None => msg,
            };
            let _ = LAST_PANIC.try_with(|p| {
                if let Ok(mut p) = p.try_borrow_mut() {
                    *p = Some(note);
                }
            });
            previous(info);
        }));
    });
}

pub(crate) fn panic_note() -> String {
    LAST_PANIC
        .try_with(|p| p.try_borrow().ok().and_then(|p| p.clone()))
        .ok()
        .flatten()
        .unwrap_or_else(|| "panic".into())
}

// ---- sessions ----------------------------------------------------------------------

const MAX_DEFERRED: usize = 16;

pub(crate) struct Inner {
    handle: ffi::ct_session,
    path: PathBuf,
    device_synchronized: bool,
    deferred: Mutex<(usize, Vec<Error>)>,
    /// Whether capture helpers record tensor statistics (off in a flight recorder).
    stats: AtomicBool,
    /// Made current once (a measured region, `activate`): the tracing layer
    /// could record into it.
    activated: std::sync::atomic::AtomicBool,
    /// The run's gradient contract, checked against `gradients` at finish.
    /// Shared by the sessions a flight recorder reopens.
    contract: Option<Arc<GradientContract>>,
    /// The gradient facts recorded, kept only under a contract.
    gradients: Mutex<BTreeMap<(String, String), Gradient>>,
    /// Records held in the binding until the session ends with a trace
    /// (a flight recorder's: see [`SessionRef::hold_records`]).
    held: Mutex<Held>,
}

/// A shared, non-owning reference to an open session: every record method
/// lives here. It is `Send + Sync` (the library is thread-safe); what it
/// cannot do is finish the session, which only the owning [`Session`] does.
/// Calls through a reference whose session has finished fail with
/// [`Status::InvalidHandle`].
#[derive(Clone)]
pub struct SessionRef(pub(crate) Arc<Inner>);

/// An open capture: one trace file. Dereferences to [`SessionRef`] for the
/// record methods.
///
/// End it with [`Session::finish`] (terminal `complete`) or
/// [`Session::finish_failed`]. A session dropped without either ends with a
/// `failed` terminal: "session dropped without finish", or, while the thread
/// panics, `"session dropped while panicking: <message>"`.
pub struct Session {
    r: SessionRef,
    ended: bool,
}

impl Deref for Session {
    type Target = SessionRef;
    fn deref(&self) -> &SessionRef {
        &self.r
    }
}

impl std::fmt::Debug for SessionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRef")
            .field("handle", &self.0.handle)
            .field("path", &self.0.path)
            .finish()
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("handle", &self.r.0.handle)
            .field("path", &self.r.0.path)
            .field("ended", &self.ended)
            .finish()
    }
}

/// Checks that the loaded library speaks this binding's ABI version.
pub fn check_abi() -> Result<()> {
    // SAFETY: no arguments, no preconditions.
    let library = unsafe { ffi::ct_abi_version() };
    if library != ffi::CT_ABI_VERSION {
        return Err(Error::AbiMismatch {
            library,
            binding: ffi::CT_ABI_VERSION,
        });
    }
    Ok(())
}

/// The library version, e.g. `0.1.0`.
pub fn library_version() -> String {
    // SAFETY: ct_version returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::ct_version()) }
        .to_string_lossy()
        .into_owned()
}

impl Session {
    /// Opens a trace at `path` (parent folders are created; an existing file
    /// is replaced only when it is empty or candle-trace's own trace or
    /// summary, and a symbolic link is never followed: see `ct_open`) for
    /// `run`. Checks the library's ABI version first.
    pub fn open(path: impl AsRef<Path>, run: Run) -> Result<Session> {
        let contract = run.gradient_contract_ref().cloned();
        if let Some(c) = &contract {
            c.check_builders()?;
        }
        Self::open_with(
            path.as_ref(),
            &run.to_json(),
            run.is_device_synchronized(),
            contract,
        )
    }

    /// Opens with a run JSON written by the caller (see the header). Its
    /// `capture_contract.gradient_contract`, when there is one, is what
    /// `finish` checks the recorded gradients against (every family counts
    /// as declared by the caller).
    pub fn open_json(
        path: impl AsRef<Path>,
        run_json: &str,
        device_synchronized: bool,
    ) -> Result<Session> {
        let contract = serde_json::from_str::<serde_json::Value>(run_json)
            .ok()
            .and_then(|v| v.get("capture_contract")?.get("gradient_contract").cloned())
            .and_then(|c| serde_json::from_value::<GradientContract>(c).ok());
        Self::open_with(path.as_ref(), run_json, device_synchronized, contract)
    }

    pub(crate) fn open_with(
        path: &Path,
        run_json: &str,
        device_synchronized: bool,
        contract: Option<GradientContract>,
    ) -> Result<Session> {
        check_abi()?;
        install_panic_hook();
        let cpath = cstring(
            "path",
            path.to_str()
                .ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", path.display())))?,
        )?;
        let cjson = cstring("run JSON", run_json)?;
        let mut handle: ffi::ct_session = 0;
        // SAFETY: both strings are NUL-terminated and live across the call.
        check(unsafe { ffi::ct_open(cpath.as_ptr(), cjson.as_ptr(), &mut handle) })?;
        Ok(Session::wrap(
            handle,
            path,
            device_synchronized,
            true,
            contract.map(Arc::new),
            Held::default(),
        ))
    }

    fn wrap(
        handle: ffi::ct_session,
        path: &Path,
        device_synchronized: bool,
        stats: bool,
        contract: Option<Arc<GradientContract>>,
        held: Held,
    ) -> Session {
        Session {
            r: SessionRef(Arc::new(Inner {
                handle,
                path: path.to_path_buf(),
                device_synchronized,
                deferred: Mutex::new((0, Vec::new())),
                stats: AtomicBool::new(stats),
                activated: std::sync::atomic::AtomicBool::new(false),
                contract,
                gradients: Mutex::new(BTreeMap::new()),
                held: Mutex::new(held),
            })),
            ended: false,
        }
    }

    /// A flight recorder's next update (`ct_reopen`): discards this buffered
    /// session unwritten and opens the next one at `path` with the same run,
    /// except that its capture step is `capture_step`, reusing the parsed run
    /// and the buffer's memory (most of what an open costs per update). The
    /// statistics setting ([`SessionRef::records_stats`]) and the bound of
    /// held records ([`SessionRef::hold_records`]) carry over; the records
    /// this session held are dropped with it.
    /// Refusals before the discard (a bad path or step, a session that is
    /// not buffered) leave this session open and return it in the error's
    /// place as `Err((self, error))`; a path refused after it returns
    /// `Err((None, error))`.
    pub fn reopen(
        mut self,
        path: impl AsRef<Path>,
        capture_step: u64,
    ) -> std::result::Result<Session, (Option<Session>, Error)> {
        let path = path.as_ref();
        let cpath = match path
            .to_str()
            .ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", path.display())))
            .and_then(|p| cstring("path", p))
        {
            Ok(c) => c,
            Err(e) => return Err((Some(self), e)),
        };
        let mut handle: ffi::ct_session = 0;
        // SAFETY: the path is NUL-terminated and lives across the call.
        let st =
            unsafe { ffi::ct_reopen(self.r.0.handle, cpath.as_ptr(), capture_step, &mut handle) };
        match check(st) {
            Ok(()) => {
                self.ended = true;
                let held = self
                    .r
                    .0
                    .held
                    .lock()
                    .map(|mut h| h.carry())
                    .unwrap_or_default();
                Ok(Session::wrap(
                    handle,
                    path,
                    self.r.0.device_synchronized,
                    self.records_stats(),
                    self.r.0.contract.clone(),
                    held,
                ))
            }
            Err(e) if e.status() == Some(Status::Io) => {
                self.ended = true; // discarded before the new path was refused
                Err((None, e))
            }
            Err(e) => Err((Some(self), e)),
        }
    }

    /// A shared reference (for other threads, wrappers, layers).
    pub fn handle(&self) -> SessionRef {
        self.r.clone()
    }

    /// Closes the root, writes the `complete` terminal and returns the trace's
    /// path with the health issues the binding can check ([`Completed`]):
    /// each family of the gradient contract whose recorded gradients break
    /// its expectation, naming the parameters (the trace is still complete,
    /// and candle-graph reports the same check as a health error); defaulted
    /// families that got no gradient at all; spans the `tracing` layer could
    /// not see. Findings nobody reads are written to stderr when the
    /// [`Completed`] drops.
    ///
    /// When the library refuses (spans still open, no measured region, a
    /// required label not seen once, an unreported contract gradient) or an
    /// earlier deferred call failed ([`Error::Deferred`]), the capture cannot
    /// be complete: the trace is ended with a `failed` terminal naming the
    /// reason, and the error is returned.
    pub fn finish(mut self) -> Result<Completed> {
        self.ended = true;
        self.r.release_held();
        if let Some(err) = self.r.take_deferred() {
            let _ = self
                .r
                .raw_finish_failed(&format!("candle-trace (rust): {err}"));
            return Err(err);
        }
        // SAFETY: plain handle.
        match check(unsafe { ffi::ct_finish(self.r.0.handle) }) {
            Ok(()) => Ok(Completed::new(self.r.0.path.clone(), self.r.findings())),
            Err(err) => {
                if err.status() != Some(Status::InvalidHandle) {
                    let _ = self
                        .r
                        .raw_finish_failed(&format!("ct_finish refused: {}", err.message()));
                }
                Err(err)
            }
        }
    }

    /// Ends the capture with a `failed` terminal carrying `reason`.
    pub fn finish_failed(mut self, reason: &str) -> Result<()> {
        self.ended = true;
        self.r.release_held(); // the evidence up to the failure
        let reason = if reason.trim().is_empty() {
            "finish_failed without a reason"
        } else {
            reason
        };
        self.r.raw_finish_failed(reason)
    }

    /// Ends a buffered session ([`crate::Run::buffered`]) without writing
    /// anything: nothing is left at its path (`ct_discard`). A session that
    /// writes as it records refuses with `CT_ERR_STATE`; it is then ended
    /// with a `failed` terminal saying so, as a dropped session would be.
    pub fn discard(mut self) -> Result<()> {
        self.ended = true;
        if let Ok(mut h) = self.r.0.held.lock() {
            h.clear();
        }
        // SAFETY: plain handle.
        let res = check(unsafe { ffi::ct_discard(self.r.0.handle) });
        if let Err(err) = &res {
            if err.status() == Some(Status::State) {
                let _ = self
                    .r
                    .raw_finish_failed(&format!("discard refused: {}", err.message()));
            }
        }
        res
    }

    /// How many records a buffered session's bound has dropped so far
    /// (`ct_dropped_records`); 0 for other sessions.
    pub fn dropped_records(&self) -> u64 {
        // SAFETY: plain handle.
        unsafe { ffi::ct_dropped_records(self.r.0.handle) }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let reason = if std::thread::panicking() {
            format!("session dropped while panicking: {}", panic_note())
        } else {
            "session dropped without finish".to_string()
        };
        self.r.release_held();
        let _ = self.r.raw_finish_failed(&reason);
    }
}

impl SessionRef {
    /// The raw `ct_session` handle, for calls into [`crate::ffi`].
    pub fn raw(&self) -> ffi::ct_session {
        self.0.handle
    }

    /// The path the trace is written to.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// Whether capture helpers (the candle `Traced` wrapper, a schedule's
    /// update) reduce and record tensor statistics into this session: on by
    /// default, off in a [`crate::Schedule`]'s flight recorder, which keeps
    /// spans, ops and memory only, so that it stays cheap.
    pub fn records_stats(&self) -> bool {
        self.0.stats.load(Ordering::Relaxed)
    }

    /// Turns [`records_stats`](Self::records_stats) on or off.
    pub fn set_records_stats(&self, on: bool) {
        self.0.stats.store(on, Ordering::Relaxed);
    }

    /// Whether the run declared a device-synchronized measured region.
    pub fn is_device_synchronized(&self) -> bool {
        self.0.device_synchronized
    }

    fn raw_finish_failed(&self, reason: &str) -> Result<()> {
        let reason = reason.replace('\0', " ");
        let c = CString::new(reason).expect("NULs replaced");
        // SAFETY: NUL-terminated string alive across the call.
        check(unsafe { ffi::ct_finish_failed(self.0.handle, c.as_ptr()) })
    }

    /// What `finish` reports besides the verdict: the contract's findings of
    /// the gradients recorded so far, then the tracing layer's.
    fn findings(&self) -> Vec<Finding> {
        let mut out = match (&self.0.contract, self.0.gradients.lock()) {
            (Some(c), Ok(g)) => c.findings(&g),
            _ => Vec::new(),
        };
        out.sort_by_key(|f| f.severity);
        #[cfg(feature = "tracing")]
        out.extend(crate::layer::findings(self));
        out
    }

    /// Whether the session was ever current (see [`SessionRef::activate`]).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn was_activated(&self) -> bool {
        self.0.activated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes the record calls of this session ([`op`](Self::op),
    /// [`tensor`](Self::tensor), [`memory`](Self::memory),
    /// [`scalar`](Self::scalar), [`data_edge`](Self::data_edge),
    /// [`gradient`](Self::gradient)) hold up to `limit_bytes` of records in the
    /// binding instead of entering the library, which gets them when the
    /// session ends with a trace (`finish`, `finish_failed`, a drop, `flush`);
    /// `discard` and `reopen` drop them unsent. For a flight recorder, whose
    /// updates are nearly all dropped: a record call is then a copy, where
    /// entering the library's runtime after an update's work costs more than
    /// the record. A time of 0 ("now") is read when the record is held. What
    /// the library refuses is found when they are sent, and reported by
    /// `finish` (as [`Error::Deferred`]) rather than by the call; past
    /// `limit_bytes`, what is held is sent at once. 0 holds nothing from now on.
    /// A bound below what is held already (0 included) sends that first, so
    /// that the records after it stay in the order they were made.
    pub fn hold_records(&self, limit_bytes: usize) {
        let records = match self.0.held.lock() {
            Ok(mut h) => {
                h.set_limit(limit_bytes);
                if h.over_limit() {
                    h.take()
                } else {
                    return;
                }
            }
            Err(_) => return,
        };
        self.send_all(records);
    }

    /// How many records the session holds now (see [`hold_records`](Self::hold_records)).
    pub fn held_records(&self) -> usize {
        self.0.held.lock().map(|h| h.len()).unwrap_or(0)
    }

    /// Sends what the session holds, in order; refusals are deferred.
    fn release_held(&self) {
        let records = match self.0.held.lock() {
            Ok(mut h) => h.take(),
            Err(_) => return,
        };
        self.send_all(records);
    }

    fn send_all(&self, records: Vec<Record>) {
        for r in &records {
            if let Err(e) = r.send(self.0.handle) {
                self.defer(e);
            }
        }
        // The list's memory goes back for the next records.
        if let Ok(mut h) = self.0.held.lock() {
            h.give_back(records);
        }
    }

    /// Holds `r` or sends it (see [`hold_records`](Self::hold_records)).
    fn submit(&self, r: Record) -> Result<()> {
        let holding = match self.0.held.lock() {
            Ok(mut h) => h.hold(r),
            Err(p) => p.into_inner().hold(r),
        };
        match holding {
            Holding::Held => Ok(()),
            Holding::Send(r) => r.send(self.0.handle),
            Holding::Overflow(rs) => {
                self.send_all(rs);
                Ok(())
            }
        }
    }

    /// Keeps an error of a call that could not return it; `finish` reports it.
    pub(crate) fn defer(&self, err: Error) {
        if let Ok(mut d) = self.0.deferred.lock() {
            d.0 += 1;
            if d.1.len() < MAX_DEFERRED {
                d.1.push(err);
            }
        }
    }

    /// Errors deferred so far (at most 16 are kept), without clearing them.
    pub fn deferred_errors(&self) -> Vec<String> {
        self.0
            .deferred
            .lock()
            .map(|d| d.1.iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    fn take_deferred(&self) -> Option<Error> {
        let mut d = self.0.deferred.lock().ok()?;
        if d.0 == 0 {
            return None;
        }
        let count = d.0;
        let first = d.1.drain(..).next().expect("count > 0 keeps one");
        d.0 = 0;
        Some(Error::Deferred {
            count,
            first: Box::new(first),
        })
    }

    // ---- spans ----

    /// Opens a function span nested in this thread's innermost open span. It
    /// ends when the guard drops, also while unwinding. A failure to open it
    /// (a NUL in the name, a poisoned session) gives an inert guard and is
    /// reported by `finish`; use [`SessionRef::try_span`] to see it at once.
    #[inline]
    pub fn span(&self, name: &str) -> SpanGuard<'_> {
        self.span_with(name, SpanKind::Function, Step::None)
    }

    /// [`SessionRef::span`] of another kind.
    #[inline]
    pub fn span_kind(&self, name: &str, kind: SpanKind) -> SpanGuard<'_> {
        self.span_with(name, kind, Step::None)
    }

    /// [`SessionRef::span`] tagged with a training phase (a function span).
    #[inline]
    pub fn step_span(&self, name: &str, step: Step) -> SpanGuard<'_> {
        self.span_with(name, SpanKind::Function, step)
    }

    /// [`SessionRef::span`] with kind and phase.
    #[inline]
    pub fn span_with(&self, name: &str, kind: SpanKind, step: Step) -> SpanGuard<'_> {
        match self.try_span(name, kind, step) {
            Ok(g) => g,
            Err(e) => {
                self.defer(e);
                SpanGuard {
                    session: self,
                    id: 0,
                    _not_send: PhantomData,
                }
            }
        }
    }

    /// Opens a span and returns the library's refusal as an error.
    #[inline]
    pub fn try_span(&self, name: &str, kind: SpanKind, step: Step) -> Result<SpanGuard<'_>> {
        let mut id: ffi::ct_span = 0;
        // SAFETY: the name is NUL-terminated for the duration of the call.
        let st = with_cstr(name, |p| unsafe {
            ffi::ct_span_begin(self.0.handle, p, kind.raw(), step.raw(), &mut id)
        })?;
        check(st)?;
        Ok(SpanGuard {
            session: self,
            id,
            _not_send: PhantomData,
        })
    }

    /// Opens the session's single measured region. While the returned guard
    /// lives, this session is the calling thread's current session (see
    /// [`current`]): the candle wrappers and the `tracing` layer record into
    /// it.
    pub fn measure(&self, name: &str) -> Result<Measured<'_>> {
        let mut id: ffi::ct_span = 0;
        // SAFETY: the name is NUL-terminated for the duration of the call.
        check(with_cstr(name, |p| unsafe {
            ffi::ct_measurement_begin(self.0.handle, p, &mut id)
        })?)?;
        let active = self.activate();
        Ok(Measured {
            span: SpanGuard {
                session: self,
                id,
                _not_send: PhantomData,
            },
            before_end: None,
            _active: active,
        })
    }

    /// Makes this session the calling thread's current session until the
    /// guard drops (then the previous one is restored).
    pub fn activate(&self) -> Active {
        self.0
            .activated
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let previous = CURRENT.with(|c| c.replace(Some(self.clone())));
        Active {
            previous,
            _not_send: PhantomData,
        }
    }

    /// Records host work measured elsewhere as a closed span under the root.
    pub fn completed_span(
        &self,
        name: &str,
        kind: SpanKind,
        start_ns: u64,
        duration_ns: u64,
    ) -> Result<SpanId> {
        let mut id: ffi::ct_span = 0;
        // SAFETY: the name is NUL-terminated for the duration of the call.
        check(with_cstr(name, |p| unsafe {
            ffi::ct_record_completed_span(
                self.0.handle,
                p,
                kind.raw(),
                start_ns,
                duration_ns,
                &mut id,
            )
        })?)?;
        Ok(SpanId(id))
    }

    /// The session clock: nanoseconds since open (0 once finished).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        // SAFETY: plain handle.
        unsafe { ffi::ct_now_ns(self.0.handle) }
    }

    /// Brackets the tracer's own work (bookkeeping, statistics, encoding
    /// records done inside the program it observes): until the guard drops,
    /// the session clock stands still (`ct_tracer_begin`/`ct_tracer_end`), so
    /// no span counts that work, and the trace states it (`tracer_ns` on the
    /// measured span's end and on the terminal). Guards nest.
    pub fn tracer_work(&self) -> Result<TracerWork<'_>> {
        // SAFETY: plain handle.
        check(unsafe { ffi::ct_tracer_begin(self.0.handle) })?;
        Ok(TracerWork {
            session: self,
            _not_send: PhantomData,
        })
    }

    /// The tracer's time left out of the session clock so far, in ns
    /// (`ct_tracer_ns`; 0 once finished).
    pub fn tracer_ns(&self) -> u64 {
        // SAFETY: plain handle.
        unsafe { ffi::ct_tracer_ns(self.0.handle) }
    }

    /// The calibrated part of [`tracer_ns`](Self::tracer_ns): intervals begun
    /// earlier than their call (`ct_tracer_estimated_ns`).
    pub fn tracer_estimated_ns(&self) -> u64 {
        // SAFETY: plain handle.
        unsafe { ffi::ct_tracer_estimated_ns(self.0.handle) }
    }

    // ---- records ----

    /// One operation (`ct_record_op`).
    pub fn op(&self, span: impl Into<SpanId>, op: &Op<'_>) -> Result<()> {
        let mut timestamp_ns = op.timestamp_ns;
        if timestamp_ns == 0 && self.holds() {
            // "ended now", as the library would have read it
            timestamp_ns = self.now_ns().saturating_sub(op.duration_ns).max(1);
        }
        self.submit(Record::Op {
            span: span.into().0,
            name: cstring("op name", op.name)?,
            dtype: cstring("dtype", op.dtype)?,
            device: cstring("device", op.device)?,
            inputs: op
                .inputs
                .iter()
                .map(|s| cstring("input tensor id", s))
                .collect::<Result<Vec<_>>>()?,
            output: opt_cstring("output tensor id", op.output)?,
            shape: shape_i64(op.shape)?,
            flags: if op.output_dense_bytes.is_some() {
                ffi::CT_HAS_OUTPUT_DENSE_BYTES
            } else {
                0
            },
            duration_ns: op.duration_ns,
            timestamp_ns,
            output_dense_bytes: op.output_dense_bytes.unwrap_or(0),
            input_dense_bytes: op.input_dense_bytes,
        })
    }

    /// Tensor metadata (`ct_record_tensor`).
    pub fn tensor(&self, span: impl Into<SpanId>, t: &TensorMeta<'_>) -> Result<()> {
        self.submit(Record::Tensor {
            span: span.into().0,
            id: cstring("tensor id", t.tensor_id)?,
            dtype: cstring("dtype", t.dtype)?,
            device: cstring("device", t.device)?,
            label: opt_cstring("label", t.label)?,
            shape: shape_i64(t.shape)?,
            flags: if t.dense_bytes.is_some() {
                ffi::CT_HAS_DENSE_BYTES
            } else {
                0
            },
            requires_grad: t.requires_grad as i32,
            category: t.category.raw(),
            dense_bytes: t.dense_bytes.unwrap_or(0),
        })
    }

    /// Whether record calls are held now (see [`hold_records`](Self::hold_records)).
    fn holds(&self) -> bool {
        self.0.held.lock().map(|h| h.limit() > 0).unwrap_or(false)
    }

    /// Statistics reduced by the caller (`ct_record_tensor_stats`).
    pub fn tensor_stats(&self, span: impl Into<SpanId>, s: &TensorStats<'_>) -> Result<()> {
        let label = cstring("label", s.label)?;
        let dtype = cstring("dtype", s.dtype)?;
        let shape = shape_i64(s.shape)?;
        let raw = ffi::ct_tensor_stats {
            size: std::mem::size_of::<ffi::ct_tensor_stats>() as u32,
            reserved: 0,
            label: label.as_ptr(),
            dtype: dtype.as_ptr(),
            shape: shape.as_ptr(),
            rank: shape.len(),
            elements: elements(s.shape)?,
            non_finite: s.non_finite,
            rms: s.rms,
            abs_max: s.abs_max,
            mean: s.mean,
        };
        // SAFETY: every pointer of `raw` points into locals alive across the call.
        check(unsafe { ffi::ct_record_tensor_stats(self.0.handle, span.into().0, &raw) })
    }

    /// Lets the library reduce a host f32 buffer of `shape`
    /// (`ct_record_tensor_stats_f32`). `data.len()` must equal the product of
    /// `shape` (checked here: the library cannot).
    pub fn tensor_stats_f32(
        &self,
        span: impl Into<SpanId>,
        label: &str,
        data: &[f32],
        shape: &[usize],
    ) -> Result<()> {
        let n = elements(shape)?;
        if n != data.len() as u64 {
            return Err(Error::invalid(format!(
                "tensor_stats_f32 {label:?}: {} values for shape {shape:?} ({n} elements)",
                data.len()
            )));
        }
        let label = cstring("label", label)?;
        let shape = shape_i64(shape)?;
        let data_ptr = if data.is_empty() {
            ptr::null()
        } else {
            data.as_ptr()
        };
        // SAFETY: data holds product(shape) floats; strings and shape live across the call.
        check(unsafe {
            ffi::ct_record_tensor_stats_f32(
                self.0.handle,
                span.into().0,
                label.as_ptr(),
                data_ptr,
                shape.as_ptr(),
                shape.len(),
            )
        })
    }

    /// A scalar observation, e.g. a loss (`ct_record_scalar`).
    pub fn scalar(&self, span: impl Into<SpanId>, label: &str, value: f64) -> Result<()> {
        let span = span.into().0;
        if !self.holds() {
            // SAFETY: the label is NUL-terminated for the duration of the call.
            return check(with_cstr(label, |p| unsafe {
                ffi::ct_record_scalar(self.0.handle, span, p, value)
            })?);
        }
        self.submit(Record::Scalar {
            span,
            label: cstring("label", label)?,
            value,
        })
    }

    /// A logical allocation or free (`ct_record_memory`).
    pub fn memory(
        &self,
        span: impl Into<SpanId>,
        action: MemoryAction,
        m: &Memory<'_>,
    ) -> Result<()> {
        self.memory_or(span.into(), None, action, m)
    }

    /// [`memory`](Self::memory), recorded on `fallback` where `span` refuses it.
    pub(crate) fn memory_or(
        &self,
        span: SpanId,
        fallback: Option<SpanId>,
        action: MemoryAction,
        m: &Memory<'_>,
    ) -> Result<()> {
        let mut timestamp_ns = m.timestamp_ns;
        if timestamp_ns == 0 && self.holds() {
            timestamp_ns = self.now_ns().max(1);
        }
        self.submit(Record::Memory {
            span: span.0,
            fallback: fallback.map(|f| f.0),
            action: match action {
                MemoryAction::Alloc => ffi::CT_MEMORY_ALLOC,
                MemoryAction::Free => ffi::CT_MEMORY_FREE,
            },
            timestamp_ns,
            storage: cstring("storage id", m.storage_id)?,
            tensor: cstring("tensor id", m.tensor_id)?,
            device: cstring("device", m.device)?,
            dtype: cstring("dtype", m.dtype)?,
            op_name: opt_cstring("op name", m.op_name)?,
            bytes: m.bytes,
            shape: shape_i64(m.shape)?,
            category: m.category.raw(),
        })
    }

    /// A physical device-memory sample (`ct_record_device_memory`).
    pub fn device_memory(&self, m: &DeviceMemory<'_>) -> Result<()> {
        let device = cstring("device", m.device)?;
        let mut flags = 0;
        for (v, f) in [
            (m.used_bytes, ffi::CT_HAS_USED_BYTES),
            (m.free_bytes, ffi::CT_HAS_FREE_BYTES),
            (m.reserved_bytes, ffi::CT_HAS_RESERVED_BYTES),
            (m.capacity_bytes, ffi::CT_HAS_CAPACITY_BYTES),
        ] {
            if v.is_some() {
                flags |= f;
            }
        }
        let raw = ffi::ct_device_memory {
            size: std::mem::size_of::<ffi::ct_device_memory>() as u32,
            flags,
            timestamp_ns: m.timestamp_ns,
            device: device.as_ptr(),
            used_bytes: m.used_bytes.unwrap_or(0),
            free_bytes: m.free_bytes.unwrap_or(0),
            reserved_bytes: m.reserved_bytes.unwrap_or(0),
            capacity_bytes: m.capacity_bytes.unwrap_or(0),
        };
        // SAFETY: every pointer of `raw` points into locals alive across the call.
        check(unsafe { ffi::ct_record_device_memory(self.0.handle, &raw) })
    }

    /// A device interval launched by `span` (`ct_record_device_interval`).
    pub fn device_interval(&self, span: impl Into<SpanId>, d: &DeviceInterval<'_>) -> Result<()> {
        let device = cstring("device", d.device)?;
        let stream = cstring("stream id", d.stream_id)?;
        let clock = opt_cstring("clock id", d.clock_id)?;
        let backend = cstring("backend", d.backend)?;
        let name = opt_cstring("name", d.name)?;
        let raw = ffi::ct_device_interval {
            size: std::mem::size_of::<ffi::ct_device_interval>() as u32,
            flags: if d.correlation_id.is_some() {
                ffi::CT_HAS_CORRELATION_ID
            } else {
                0
            },
            device: device.as_ptr(),
            stream_id: stream.as_ptr(),
            clock_id: opt_ptr(&clock),
            backend: backend.as_ptr(),
            name: opt_ptr(&name),
            start_ns: d.start_ns,
            duration_ns: d.duration_ns,
            correlation_id: d.correlation_id.unwrap_or(0),
        };
        // SAFETY: every pointer of `raw` points into locals alive across the call.
        check(unsafe { ffi::ct_record_device_interval(self.0.handle, span.into().0, &raw) })
    }

    /// A call edge from `from` to its child `to`. `host_duration_ns` `None`
    /// takes `to`'s duration (written when `to` closes).
    pub fn call_edge(
        &self,
        from: impl Into<SpanId>,
        to: impl Into<SpanId>,
        host_duration_ns: Option<u64>,
    ) -> Result<()> {
        // SAFETY: plain values.
        check(unsafe {
            ffi::ct_record_call_edge(
                self.0.handle,
                from.into().0,
                to.into().0,
                host_duration_ns.unwrap_or(0),
            )
        })
    }

    /// A data edge between two tensor ids already known to the session.
    pub fn data_edge(&self, from_tensor: &str, to_tensor: &str) -> Result<()> {
        self.submit(Record::DataEdge {
            from: cstring("from tensor", from_tensor)?,
            to: cstring("to tensor", to_tensor)?,
        })
    }

    /// One gradient fact for parameter `key` under `root`.
    pub fn gradient(&self, root: &str, key: &str, g: Gradient) -> Result<()> {
        let (state, norm) = match g {
            Gradient::Present(n) => (ffi::CT_GRADIENT_PRESENT, Some(n)),
            Gradient::Zero => (ffi::CT_GRADIENT_ZERO, Some(0.0f64)),
            Gradient::Missing => (ffi::CT_GRADIENT_MISSING, None),
            Gradient::NonFinite => (ffi::CT_GRADIENT_NON_FINITE, None),
        };
        self.submit(Record::Gradient {
            root: cstring("gradient root", root)?,
            key: cstring("gradient key", key)?,
            state,
            norm,
        })?;
        if self.0.contract.is_some() {
            if let Ok(mut gs) = self.0.gradients.lock() {
                gs.insert((root.to_string(), key.to_string()), g);
            }
        }
        Ok(())
    }

    /// Starts device collectors. Without a GPU, driver or library the error's
    /// status is [`Status::Unavailable`] and its message says what is missing;
    /// the session goes on.
    pub fn start_devices(&self, options: &DeviceOptions) -> Result<()> {
        self.device_start(Some(&options.to_json()))
    }

    /// Starts device collectors (`options_json` as in the header, or `None`).
    pub fn device_start(&self, options_json: Option<&str>) -> Result<()> {
        let opts = opt_cstring("options JSON", options_json)?;
        // SAFETY: NULL or a NUL-terminated string alive across the call.
        check(unsafe { ffi::ct_device_start(self.0.handle, opt_ptr(&opts)) })
    }

    /// Stops device collectors and writes what they hold.
    pub fn device_stop(&self) -> Result<()> {
        // SAFETY: plain handle.
        check(unsafe { ffi::ct_device_stop(self.0.handle) })
    }

    /// Writes everything recorded so far to the file.
    pub fn flush(&self) -> Result<()> {
        self.release_held();
        // SAFETY: plain handle.
        check(unsafe { ffi::ct_flush(self.0.handle) })
    }

    /// Switches an aggregate session's statistics on or off (a session opened
    /// with [`Run::aggregate`](crate::Run::aggregate)).
    pub fn aggregate_enable(&self, on: bool) -> Result<()> {
        // SAFETY: plain handle.
        check(unsafe { ffi::ct_aggregate_enable(self.0.handle, c_int::from(on)) })
    }

    /// Lists a trigger that fired in an aggregate session's summary, under
    /// `triggers` (`ct_aggregate_trigger`): the update (≥ 1), the trigger's
    /// name, the value it measured and its threshold, a line of detail, and
    /// either the trace written for it or, in `written`, why none was.
    pub fn aggregate_trigger(
        &self,
        update: u64,
        trigger: &str,
        value: f64,
        threshold: f64,
        detail: Option<&str>,
        written: TriggerTrace<'_>,
    ) -> Result<()> {
        let trigger = cstring("trigger", trigger)?;
        let detail = opt_cstring("detail", detail)?;
        let (trace, no_trace) = match written {
            TriggerTrace::Written(p) => (Some(cstring("trace", &p.to_string_lossy())?), None),
            TriggerTrace::None(why) => (None, Some(cstring("no_trace", why)?)),
        };
        // SAFETY: every string is NUL-terminated and outlives the call.
        check(unsafe {
            ffi::ct_aggregate_trigger(
                self.0.handle,
                update,
                trigger.as_ptr(),
                value,
                threshold,
                opt_ptr(&detail),
                opt_ptr(&trace),
                opt_ptr(&no_trace),
            )
        })
    }
}

/// What became of a trigger's trace, for [`SessionRef::aggregate_trigger`].
#[derive(Debug, Clone, Copy)]
pub enum TriggerTrace<'a> {
    /// The trace written for it.
    Written(&'a std::path::Path),
    /// Why none was (the run's cap reached, say).
    None(&'a str),
}

// ---- guards --------------------------------------------------------------------------

/// An open span; it ends when dropped, also while unwinding.
///
/// Spans nest per OS thread, so the guard is neither `Send` nor `Sync`:
///
/// ```compile_fail
/// fn is_send<T: Send>(_: T) {}
/// # fn f(s: &candle_trace::Session) {
/// is_send(s.span("x"));
/// # }
/// ```
///
/// Dropping guards out of order (`drop(outer)` before `inner`) is refused by
/// the library (`CT_ERR_SPAN_MISMATCH`); the error is deferred to `finish`.
#[must_use = "the span ends when the guard is dropped: bind it with `let _g = ...`"]
pub struct SpanGuard<'a> {
    session: &'a SessionRef,
    id: ffi::ct_span,
    _not_send: PhantomData<*const ()>,
}

impl<'a> SpanGuard<'a> {
    /// The span's id for records (`SpanId(0)` for an inert guard).
    #[inline]
    pub fn id(&self) -> SpanId {
        SpanId(self.id)
    }

    /// The session the span belongs to.
    pub fn session(&self) -> &'a SessionRef {
        self.session
    }

    /// Ends the span now and returns the library's verdict.
    pub fn end(mut self) -> Result<()> {
        let id = std::mem::replace(&mut self.id, 0);
        if id == 0 {
            return Ok(());
        }
        // SAFETY: plain values.
        check(unsafe { ffi::ct_span_end(self.session.0.handle, id) })
    }
}

impl Drop for SpanGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.id != 0 {
            // SAFETY: plain values.
            let st = unsafe { ffi::ct_span_end(self.session.0.handle, self.id) };
            if st != ffi::CT_OK {
                self.session.defer(Error::last(st));
            }
        }
    }
}

impl std::fmt::Debug for SpanGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanGuard").field("id", &self.id).finish()
    }
}

/// The tracer's own work (from [`SessionRef::tracer_work`]): the session
/// clock stands still until the guard drops. An error at the end is deferred
/// to `finish`, as a span guard's is.
#[must_use = "the tracer interval ends when the guard is dropped: bind it with `let _w = ...`"]
pub struct TracerWork<'a> {
    session: &'a SessionRef,
    _not_send: PhantomData<*const ()>,
}

impl Drop for TracerWork<'_> {
    fn drop(&mut self) {
        // SAFETY: plain handle.
        let st = unsafe { ffi::ct_tracer_end(self.session.0.handle) };
        if st != ffi::CT_OK {
            self.session.defer(Error::last(st));
        }
    }
}

impl std::fmt::Debug for TracerWork<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracerWork").finish()
    }
}

/// The measured region (from [`SessionRef::measure`]); ends when dropped.
/// While it lives its session is the thread's [`current`] session.
#[must_use = "the measured region ends when the guard is dropped: bind it with `let _m = ...`"]
pub struct Measured<'a> {
    // Field order is drop order: the hook, then the span, then the activation.
    pub(crate) before_end: Option<Box<dyn FnOnce() + 'a>>,
    span: SpanGuard<'a>,
    _active: Active,
}

impl<'a> Measured<'a> {
    #[inline]
    pub fn id(&self) -> SpanId {
        self.span.id()
    }

    /// Runs `f` right before the region ends (e.g. a device synchronize).
    pub fn before_end(mut self, f: impl FnOnce() + 'a) -> Self {
        self.before_end = Some(Box::new(f));
        self
    }

    /// Ends the region now and returns the library's verdict.
    pub fn end(mut self) -> Result<()> {
        if let Some(f) = self.before_end.take() {
            f();
        }
        let span = std::mem::replace(&mut self.span.id, 0);
        // SAFETY: plain values.
        check(unsafe { ffi::ct_span_end(self.span.session.0.handle, span) })
    }
}

impl Drop for Measured<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.before_end.take() {
            f();
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<SessionRef>> = const { RefCell::new(None) };
}

/// Restores the previous current session when dropped.
#[must_use = "the session stops being current when the guard is dropped"]
pub struct Active {
    previous: Option<SessionRef>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Active {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
    }
}

/// The calling thread's current session: set while a measured region (or an
/// [`SessionRef::activate`] guard) is alive. Capture wrappers record into it
/// and do nothing without one.
pub fn current() -> Option<SessionRef> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Runs `f` with the current session without cloning it.
#[inline]
pub fn with_current<R>(f: impl FnOnce(Option<&SessionRef>) -> R) -> R {
    let mut f = Some(f);
    match CURRENT.try_with(|c| (f.take().unwrap())(c.borrow().as_ref())) {
        Ok(r) => r,
        Err(_) => (f.take().unwrap())(None),
    }
}
