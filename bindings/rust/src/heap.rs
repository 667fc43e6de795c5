//! Logical host memory of a captured update from the process heap.
//!
//! candle's CPU tensors are `Vec`s on the Rust heap, and candle has no
//! allocation hook, so memory comes from the one place every CPU storage
//! passes through: the global allocator. Install [`TracingAllocator`] in the
//! program (opt-in):
//!
//! ```no_run
//! #[global_allocator]
//! static HEAP: candle_trace::heap::TracingAllocator = candle_trace::heap::TracingAllocator::system();
//! # fn main() {}
//! ```
//!
//! Outside a capture it costs one relaxed atomic load per allocation. While a
//! [`HeapCapture`] is open (inside the measured region), every allocation of
//! at least [`HeapCapture::min_bytes`] and every free is logged into a fixed
//! lock-free buffer: no allocation, no lock, one session-clock read
//! (`ct_now_ns`, which never blocks). [`HeapCapture::finish`] turns the log
//! into `memory` alloc/free records (one storage per allocation, dtype `u8`,
//! shape `[bytes]`), each attributed to the span that was current when it
//! happened ([`attribute`]; the op helpers of [`crate::candle`] set it) and in
//! that span's category, and returns the peak of the live bytes. A free of
//! memory allocated before the capture is left out (the trace never saw the
//! allocation), and so are the tracer's own allocations (made while the thread
//! is inside [`exclude`], which the capture helpers use around their work).
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::ffi;
use crate::session::{Category, Memory, MemoryAction, SessionRef, SpanId};

/// Slots of the allocation log: 65536 allocations and frees per capture
/// (2 MiB of zeroed static memory, touched only as far as a capture fills it).
pub const LOG_SLOTS: usize = 1 << 16;

/// A global allocator that forwards to `A` and, while a [`HeapCapture`] is
/// open, logs allocations and frees for it. See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingAllocator<A = System> {
    inner: A,
}

impl TracingAllocator<System> {
    /// Wraps the system allocator.
    pub const fn system() -> Self {
        TracingAllocator { inner: System }
    }
}

impl<A> TracingAllocator<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        TracingAllocator { inner }
    }
}

struct Slot {
    /// Session time + 1, written last: 0 means the slot is not (yet) filled.
    ts: AtomicU64,
    addr: AtomicUsize,
    bytes: AtomicUsize,
    /// span << 8 | category << 1 | is_free
    meta: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    ts: AtomicU64::new(0),
    addr: AtomicUsize::new(0),
    bytes: AtomicUsize::new(0),
    meta: AtomicU64::new(0),
};
static LOG: [Slot; LOG_SLOTS] = [EMPTY; LOG_SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

static CAPTURING: AtomicBool = AtomicBool::new(false);
static HANDLE: AtomicU64 = AtomicU64::new(0);
static MIN_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_MIN_BYTES);
/// span << 8 | category << 1 of the work running now.
static ATTRIBUTION: AtomicU64 = AtomicU64::new(0);
/// One capture at a time per process (the log is global).
static OPEN: AtomicBool = AtomicBool::new(false);
static OP_NAMES: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

/// Allocations smaller than this are not logged by default: tensor storages
/// are larger, and the many small `Vec`s of candle's bookkeeping would fill
/// the log.
pub const DEFAULT_MIN_BYTES: usize = 1024;

thread_local! {
    static EXCLUDED: Cell<u32> = const { Cell::new(0) };
}

fn excluded() -> bool {
    EXCLUDED.try_with(|e| e.get() > 0).unwrap_or(true)
}

#[inline]
fn log(addr: usize, bytes: usize, free: bool) {
    if excluded() {
        return;
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= LOG_SLOTS {
        return;
    }
    // SAFETY: plain handle; ct_now_ns never blocks and does not call back.
    let ts = unsafe { ffi::ct_now_ns(HANDLE.load(Ordering::Relaxed)) };
    let slot = &LOG[i];
    slot.addr.store(addr, Ordering::Relaxed);
    slot.bytes.store(bytes, Ordering::Relaxed);
    slot.meta.store(
        ATTRIBUTION.load(Ordering::Relaxed) | u64::from(free),
        Ordering::Relaxed,
    );
    slot.ts.store(ts + 1, Ordering::Release);
}

// SAFETY: every call forwards to `inner` with the same arguments; logging
// neither allocates nor touches the memory.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TracingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.inner.alloc(layout) };
        if CAPTURING.load(Ordering::Relaxed)
            && !p.is_null()
            && layout.size() >= MIN_BYTES.load(Ordering::Relaxed)
        {
            log(p as usize, layout.size(), false);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if CAPTURING.load(Ordering::Relaxed)
            && !p.is_null()
            && layout.size() >= MIN_BYTES.load(Ordering::Relaxed)
        {
            log(p as usize, layout.size(), false);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Logged before the memory goes back, so a reuse of the address is
        // always logged after this free.
        if CAPTURING.load(Ordering::Relaxed) && layout.size() >= MIN_BYTES.load(Ordering::Relaxed) {
            log(ptr as usize, layout.size(), true);
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let capturing = CAPTURING.load(Ordering::Relaxed);
        let min = MIN_BYTES.load(Ordering::Relaxed);
        if capturing && layout.size() >= min {
            log(ptr as usize, layout.size(), true);
        }
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if capturing && new_size >= min {
            if p.is_null() {
                // The old block is still live: log it again.
                if layout.size() >= min {
                    log(ptr as usize, layout.size(), false);
                }
            } else {
                log(p as usize, new_size, false);
            }
        }
        p
    }
}

fn category_bits(c: Category) -> u64 {
    match c {
        Category::Other => 0,
        Category::Parameter => 1,
        Category::Activation => 2,
        Category::Gradient => 3,
        Category::Optimizer => 4,
    }
}

fn category_of(meta: u64) -> Category {
    match (meta >> 1) & 0x7f {
        1 => Category::Parameter,
        2 => Category::Activation,
        3 => Category::Gradient,
        4 => Category::Optimizer,
        _ => Category::Other,
    }
}

/// Restores the previous attribution when dropped (from [`attribute`]).
#[must_use = "the attribution ends when the guard is dropped: bind it with `let _a = ...`"]
#[derive(Debug)]
pub struct Attribution {
    previous: u64,
}

impl Drop for Attribution {
    fn drop(&mut self) {
        ATTRIBUTION.store(self.previous, Ordering::Relaxed);
    }
}

/// Attributes the heap traffic from now until the guard drops to `span`, in
/// `category` (`memory` records name that span and category). Process-wide,
/// as candle's CPU work runs on a thread pool the span's thread drives; guards
/// nest. Outside a capture it only stores one word.
pub fn attribute(span: impl Into<SpanId>, category: Category) -> Attribution {
    let word = span.into().0 << 8 | category_bits(category) << 1;
    Attribution {
        previous: ATTRIBUTION.swap(word, Ordering::Relaxed),
    }
}

/// [`attribute`] keeping the current category.
pub fn attribute_span(span: impl Into<SpanId>) -> Attribution {
    let current = ATTRIBUTION.load(Ordering::Relaxed);
    let word = span.into().0 << 8 | (current & 0xfe);
    Attribution {
        previous: ATTRIBUTION.swap(word, Ordering::Relaxed),
    }
}

/// Names the op that `span` is (the `op_name` of its `memory` records). A
/// no-op outside a capture.
pub fn name_op(span: SpanId, name: &str) {
    if !CAPTURING.load(Ordering::Relaxed) {
        return;
    }
    let _x = exclude();
    if let Ok(mut names) = OP_NAMES.lock() {
        names.push((span.0, name.to_string()));
    }
}

/// Leaves the calling thread's allocations out of the log until the guard
/// drops (the tracer's own work). Guards nest.
#[must_use = "the exclusion ends when the guard is dropped"]
#[derive(Debug)]
pub struct Excluded {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Excluded {
    fn drop(&mut self) {
        let _ = EXCLUDED.try_with(|e| e.set(e.get().saturating_sub(1)));
    }
}

/// See [`Excluded`].
pub fn exclude() -> Excluded {
    let _ = EXCLUDED.try_with(|e| e.set(e.get() + 1));
    Excluded {
        _not_send: std::marker::PhantomData,
    }
}

/// Whether a [`HeapCapture`] is open now.
pub fn capturing() -> bool {
    CAPTURING.load(Ordering::Relaxed)
}

/// What [`HeapCapture::finish`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeapSummary {
    /// `memory` alloc records written.
    pub allocations: u64,
    /// `memory` free records written.
    pub frees: u64,
    /// Frees of memory allocated before the capture, left out.
    pub frees_of_earlier: u64,
    /// Log entries lost: the log was full, or a thread was still writing one
    /// when the capture stopped.
    pub dropped: u64,
    /// Records the library refused (reported as the error of `finish` too).
    pub refused: u64,
    /// The peak of live bytes allocated during the capture.
    pub peak_bytes: u64,
    /// When the peak was reached (session clock).
    pub peak_ns: u64,
    /// Bytes allocated during the capture and still live at its end.
    pub retained_bytes: u64,
}

/// An open heap capture (see the module documentation): from
/// [`HeapCapture::start`] to [`HeapCapture::finish`]. Dropping it without
/// finish stops logging and writes nothing.
#[must_use = "finish the capture to write its memory records"]
pub struct HeapCapture<'a> {
    session: &'a SessionRef,
    fallback: SpanId,
    _attribution: Option<Attribution>,
}

impl std::fmt::Debug for HeapCapture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapCapture")
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl<'a> HeapCapture<'a> {
    /// Starts logging heap traffic for `session`, attributed to `span` (the
    /// measured region, say) until an [`attribute`] guard says otherwise;
    /// `span` is also where a record goes whose own span refuses it.
    ///
    /// Fails with [`crate::Status::State`] when another capture is open, and
    /// when [`TracingAllocator`] is not the global allocator (checked with
    /// one probe allocation): a capture without memory must not pass for one
    /// that saw none.
    pub fn start(session: &'a SessionRef, span: impl Into<SpanId>) -> Result<HeapCapture<'a>> {
        Self::start_with(session, span, DEFAULT_MIN_BYTES)
    }

    /// [`HeapCapture::start`] logging allocations of at least `min_bytes`.
    pub fn start_with(
        session: &'a SessionRef,
        span: impl Into<SpanId>,
        min_bytes: usize,
    ) -> Result<HeapCapture<'a>> {
        let span = span.into();
        // The probe and the log's reset are the tracer's work (an aggregate
        // session keeps none apart: then it is not bracketed).
        let _work = session.tracer_work().ok();
        if OPEN.swap(true, Ordering::AcqRel) {
            return Err(Error::state(
                "heap capture: another capture is open in this process",
            ));
        }
        let min_bytes = min_bytes.max(1);
        MIN_BYTES.store(min_bytes, Ordering::Relaxed);
        HANDLE.store(session.raw(), Ordering::Relaxed);
        if let Ok(mut n) = OP_NAMES.lock() {
            n.clear();
        }
        NEXT.store(0, Ordering::Relaxed);
        let attribution = attribute(span, Category::Other);
        CAPTURING.store(true, Ordering::SeqCst);
        // The probe: one allocation the log must see.
        let probe: Vec<u8> = Vec::with_capacity(min_bytes);
        let seen = NEXT.load(Ordering::Relaxed) > 0;
        drop(probe);
        if !seen {
            CAPTURING.store(false, Ordering::SeqCst);
            OPEN.store(false, Ordering::Release);
            return Err(Error::state(
                "heap capture: candle_trace::heap::TracingAllocator is not the global allocator (add `#[global_allocator] static HEAP: TracingAllocator = TracingAllocator::system();`)",
            ));
        }
        // Forget the probe's two entries. Another thread's entry logged
        // meanwhile is forgotten too: the capture starts here.
        CAPTURING.store(false, Ordering::SeqCst);
        clear(NEXT.swap(0, Ordering::AcqRel));
        CAPTURING.store(true, Ordering::SeqCst);
        Ok(HeapCapture {
            session,
            fallback: span,
            _attribution: Some(attribution),
        })
    }

    /// The smallest allocation logged.
    pub fn min_bytes(&self) -> usize {
        MIN_BYTES.load(Ordering::Relaxed)
    }

    /// Stops logging and writes the `memory` records (as the tracer's own
    /// work: the session clock stands still meanwhile). Returns what was
    /// written; a record the library refused makes it an error after all the
    /// others were written.
    pub fn finish(mut self) -> Result<HeapSummary> {
        CAPTURING.store(false, Ordering::SeqCst);
        drop(self._attribution.take());
        let _work = self.session.tracer_work()?;
        let _x = exclude();
        self.write()
    }

    fn write(&self) -> Result<HeapSummary> {
        let used = NEXT.load(Ordering::Acquire);
        let n = used.min(LOG_SLOTS);
        let mut sum = HeapSummary {
            dropped: (used - n) as u64,
            ..HeapSummary::default()
        };
        let names: HashMap<u64, String> = OP_NAMES
            .lock()
            .map(|mut v| v.drain(..).collect())
            .unwrap_or_default();
        // address -> (storage number, bytes, category)
        let mut live: HashMap<usize, (u64, usize, Category)> = HashMap::new();
        let (mut live_bytes, mut seq) = (0u64, 0u64);
        let mut first_err = None;
        for slot in &LOG[..n] {
            let ts = slot.ts.load(Ordering::Acquire);
            if ts == 0 {
                sum.dropped += 1;
                continue;
            }
            let (addr, bytes, meta) = (
                slot.addr.load(Ordering::Relaxed),
                slot.bytes.load(Ordering::Relaxed),
                slot.meta.load(Ordering::Relaxed),
            );
            let span = SpanId(meta >> 8);
            let free = meta & 1 == 1;
            let (storage, size, category, action) = if free {
                match live.remove(&addr) {
                    Some((s, b, c)) => (s, b, c, MemoryAction::Free),
                    None => {
                        sum.frees_of_earlier += 1;
                        continue;
                    }
                }
            } else {
                seq += 1;
                if let Some((_, b, _)) = live.remove(&addr) {
                    // The free of the earlier block was lost (a full log):
                    // the trace keeps it live, the count here lets it go.
                    live_bytes = live_bytes.saturating_sub(b as u64);
                }
                (seq, bytes, category_of(meta), MemoryAction::Alloc)
            };
            let id = format!("heap-{storage}");
            let shape = [size];
            let m = Memory {
                timestamp_ns: ts - 1,
                storage_id: &id,
                tensor_id: &id,
                device: "cpu",
                dtype: "u8",
                op_name: names.get(&span.0).map(String::as_str),
                bytes: size as u64,
                shape: &shape,
                category,
            };
            // A record whose span does not contain it (a pool thread that
            // read the attribution as it changed) goes to the fallback span.
            let recorded = self
                .session
                .memory_or(span, Some(self.fallback), action, &m);
            match recorded {
                Ok(()) if free => {
                    sum.frees += 1;
                    live_bytes = live_bytes.saturating_sub(size as u64);
                }
                Ok(()) => {
                    sum.allocations += 1;
                    live.insert(addr, (storage, size, category));
                    live_bytes += size as u64;
                    if live_bytes > sum.peak_bytes {
                        sum.peak_bytes = live_bytes;
                        sum.peak_ns = ts - 1;
                    }
                }
                Err(e) => {
                    sum.refused += 1;
                    if free {
                        // Keep it live: the trace holds its allocation.
                        live.insert(addr, (storage, size, category));
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        clear(n);
        sum.retained_bytes = live_bytes;
        match first_err {
            Some(e) => Err(e),
            None => Ok(sum),
        }
    }
}

impl Drop for HeapCapture<'_> {
    fn drop(&mut self) {
        CAPTURING.store(false, Ordering::SeqCst);
        drop(self._attribution.take());
        clear(NEXT.swap(0, Ordering::AcqRel).min(LOG_SLOTS));
        OPEN.store(false, Ordering::Release);
    }
}

fn clear(n: usize) {
    for slot in &LOG[..n.min(LOG_SLOTS)] {
        slot.ts.store(0, Ordering::Relaxed);
    }
}
