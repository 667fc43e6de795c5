//! A `tracing_subscriber::Layer` that turns `tracing` spans into session
//! spans (feature `tracing`), so code already instrumented with `tracing`
//! (candle-transformers' models are) is captured with no change.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//! // Install it before building the model (see "Order" below).
//! tracing_subscriber::registry().with(candle_trace::layer::TraceLayer::current()).init();
//! // ... later, inside `session.measure(..)`, every entered tracing span of
//! // this thread becomes a function span of the session.
//! ```
//!
//! Each enter of a tracing span begins a session span on the entering thread
//! and the matching exit ends it, so a span entered several times gives
//! several session spans, nested as the threads entered them. Kind
//! `function`, no step.
//!
//! **Names carry their path.** A session span is named after the chain of
//! tracing spans entered on the thread within the same session, outermost
//! first, joined by `/`: `block/attn/linear`. Tracing spans of one callsite
//! alive at the same time are numbered in creation order, the first
//! unnumbered: the 15 `linear` spans a model built at start-up are
//! `linear`, `linear#1`, …, `linear#14` (a number is free again once its
//! span closes, so a span made afresh on each call keeps its name).
//!
//! **Order.** A tracing span belongs to the subscriber that was current when
//! it was created; one created before this layer's subscriber was installed
//! (candle-transformers' `with_tracing` creates its spans when the model is
//! built) never reaches it, whenever it is entered. Nothing can record such
//! spans, so the layer says so in `Session::finish`'s findings: a
//! `tracing_layer_recorded_nothing` note when it recorded no span in a
//! capture it could record into (a `for_session` layer's session, or a
//! session that was current: measured), and a `tracing_spans_unreachable`
//! note naming every span callsite registered with the layer none of whose
//! spans reached it (spans made under another subscriber; before any
//! subscriber exists `tracing` does not even register a callsite, so the
//! first note is the one a late install gets).
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tracing_core::callsite::Identifier;
use tracing_core::span::{Attributes, Id};
use tracing_core::{Interest, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::ffi;
use crate::finding::Finding;
use crate::session::{with_current, SessionRef, SpanKind, Step};

/// Where the layer records.
#[derive(Debug, Clone)]
enum Target {
    /// The entering thread's current session (a measured region's).
    Current,
    /// One session, from any thread.
    Fixed(SessionRef),
}

/// The layer. See the module docs.
#[derive(Debug, Clone)]
pub struct TraceLayer {
    target: Target,
    state: Arc<State>,
}

/// What the layer knows of the span callsites registered with it.
#[derive(Debug, Default)]
struct State {
    /// Unique per layer (the callsite cache's key; an address may be reused).
    id: u64,
    /// The session of a `for_session` layer (its notes go to it alone).
    fixed: Option<ffi::ct_session>,
    callsites: Mutex<HashMap<Identifier, Arc<Callsite>>>,
    /// Sessions the layer began a span in (until they finish), and the last
    /// one, so that a span of the same session takes no lock.
    recorded: Mutex<HashSet<ffi::ct_session>>,
    last_recorded: AtomicU64,
}

impl State {
    fn note_recorded(&self, session: ffi::ct_session) {
        if self.last_recorded.load(Ordering::Relaxed) != session {
            if let Ok(mut r) = self.recorded.lock() {
                r.insert(session);
            }
            self.last_recorded.store(session, Ordering::Relaxed);
        }
    }

    /// Whether the layer began a span in `session`; forgets it (a handle
    /// may be handed out again).
    fn take_recorded(&self, session: ffi::ct_session) -> bool {
        let _ =
            self.last_recorded
                .compare_exchange(session, 0, Ordering::Relaxed, Ordering::Relaxed);
        self.recorded
            .lock()
            .map(|mut r| r.remove(&session))
            .unwrap_or(false)
    }
}

#[derive(Debug)]
struct Callsite {
    name: &'static str,
    location: Option<(&'static str, u32)>,
    /// A span of this callsite reached the layer (`on_new_span`).
    reached: AtomicBool,
    /// Instance numbers 0..64 in use by live spans, one bit each (a span
    /// made and closed on each call takes no lock: see `cached`).
    live: AtomicU64,
    /// Instance numbers from 64 on in use.
    more: Mutex<Vec<bool>>,
}

impl Callsite {
    fn take_instance(&self) -> u32 {
        let mut cur = self.live.load(Ordering::Relaxed);
        while cur != u64::MAX {
            let i = (!cur).trailing_zeros();
            match self.live.compare_exchange_weak(
                cur,
                cur | (1 << i),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return i,
                Err(now) => cur = now,
            }
        }
        let Ok(mut more) = self.more.lock() else {
            return 64;
        };
        let free = more.iter().position(|used| !used).unwrap_or(more.len());
        if free == more.len() {
            more.push(true);
        } else {
            more[free] = true;
        }
        64 + free as u32
    }

    fn free_instance(&self, i: u32) {
        if i < 64 {
            self.live.fetch_and(!(1u64 << i), Ordering::Relaxed);
        } else if let Ok(mut more) = self.more.lock() {
            if let Some(used) = more.get_mut(i as usize - 64) {
                *used = false;
            }
        }
    }
}

/// Every layer alive, for the notes `finish` gives.
static LAYERS: Mutex<Vec<Weak<State>>> = Mutex::new(Vec::new());

/// The instance number of a live span (in its extensions).
struct Instance(u32);

impl TraceLayer {
    fn with_target(target: Target) -> Self {
        let fixed = match &target {
            Target::Fixed(s) => Some(s.raw()),
            Target::Current => None,
        };
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let state = Arc::new(State {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            fixed,
            callsites: Mutex::new(HashMap::new()),
            recorded: Mutex::new(HashSet::new()),
            last_recorded: AtomicU64::new(0),
        });
        if let Ok(mut l) = LAYERS.lock() {
            l.retain(|w| w.strong_count() > 0);
            l.push(Arc::downgrade(&state));
        }
        TraceLayer { target, state }
    }

    /// Records into the entering thread's current session (set while a
    /// measured region is open); spans entered without one are ignored.
    pub fn current() -> Self {
        Self::with_target(Target::Current)
    }

    /// Records every entered span, on any thread, into `session`.
    pub fn for_session(session: &SessionRef) -> Self {
        Self::with_target(Target::Fixed(session.clone()))
    }
}

impl State {
    fn callsite(&self, meta: &'static Metadata<'static>) -> Option<Arc<Callsite>> {
        let mut map = self.callsites.lock().ok()?;
        let c = map.entry(meta.callsite()).or_insert_with(|| {
            Arc::new(Callsite {
                name: meta.name(),
                location: meta.file().zip(meta.line()),
                reached: AtomicBool::new(false),
                live: AtomicU64::new(0),
                more: Mutex::new(Vec::new()),
            })
        });
        Some(c.clone())
    }

    /// The callsite of `meta`, from this thread's one-entry cache when it
    /// was the last one asked for (a loop's span: no lock, no hash).
    fn cached(&self, meta: &'static Metadata<'static>) -> Option<Arc<Callsite>> {
        let key = (self.id, meta as *const Metadata<'static> as usize);
        let hit = LAST
            .try_with(|l| {
                l.borrow()
                    .as_ref()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, c)| c.clone())
            })
            .ok()
            .flatten();
        if hit.is_some() {
            return hit;
        }
        let c = self.callsite(meta)?;
        let _ = LAST.try_with(|l| *l.borrow_mut() = Some((key, c.clone())));
        Some(c)
    }
}

/// The `tracing_spans_unreachable` notes for a session finishing: one per
/// live layer that may record into it and has unreached span callsites.
pub(crate) fn findings(session: &SessionRef) -> Vec<Finding> {
    let layers: Vec<Arc<State>> = match LAYERS.lock() {
        Ok(l) => l.iter().filter_map(Weak::upgrade).collect(),
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for st in layers {
        if st.fixed.is_some_and(|h| h != session.raw()) {
            continue;
        }
        // A `current()` layer records only while a session is current.
        let expected = st.fixed.is_some() || session.was_activated();
        if !st.take_recorded(session.raw()) && expected {
            out.push(Finding::note(
                "tracing_layer_recorded_nothing",
                "the tracing layer recorded no span in this capture: tracing spans created before the layer's subscriber was installed (candle-transformers' with_tracing creates them when the model is built) belong to no subscriber and can never be recorded, nor can spans the subscriber filters out or spans entered outside the measured region: install the subscriber before building the model".to_string(),
            ));
        }
        let Ok(map) = st.callsites.lock() else {
            continue;
        };
        let mut names: Vec<String> = map
            .values()
            .filter(|c| !c.reached.load(Ordering::Relaxed))
            .map(|c| match c.location {
                Some((file, line)) => format!("{} ({file}:{line})", c.name),
                None => c.name.to_string(),
            })
            .collect();
        if names.is_empty() {
            continue;
        }
        names.sort();
        out.push(Finding::note(
            "tracing_spans_unreachable",
            format!(
                "the tracing layer never saw a span of {} span callsite(s): {}; a tracing span belongs to the subscriber current when it was created, so spans created before the layer's subscriber was installed (candle-transformers' with_tracing creates them when the model is built) or filtered out by it are not in this trace: install the subscriber before building the model",
                names.len(),
                names.join(", ")
            ),
        ));
    }
    out
}

/// (layer id, metadata address) and its callsite.
type Cached = ((u64, usize), Arc<Callsite>);

struct Entry {
    tracing_id: u64,
    session: SessionRef,
    span: u64,
    /// Where this entry's name starts in `PATH`, and `PATH`'s length before it.
    start: usize,
    prev_len: usize,
}

thread_local! {
    static STACK: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    /// The names of the entered spans, each a suffix of the one before.
    static PATH: RefCell<String> = const { RefCell::new(String::new()) };
    /// The last callsite looked up: (layer state, metadata) → callsite.
    static LAST: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

fn begin(state: &State, session: &SessionRef, id: &Id, name: &str, instance: u32) {
    let _ = STACK.try_with(|stack| {
        let Ok(mut stack) = stack.try_borrow_mut() else {
            return;
        };
        let _ = PATH.try_with(|path| {
            let Ok(mut path) = path.try_borrow_mut() else {
                return;
            };
            let prev_len = path.len();
            // The parent is the innermost entered span of the same session.
            let start = match stack.last() {
                Some(top) if top.session.raw() == session.raw() => {
                    path.push('/');
                    top.start
                }
                _ => prev_len,
            };
            path.push_str(name);
            if instance > 0 {
                let _ = write!(path, "#{instance}");
            }
            match session.try_span(&path[start..], SpanKind::Function, Step::None) {
                Ok(guard) => {
                    let span = guard.id().0;
                    std::mem::forget(guard); // ended in on_exit
                    state.note_recorded(session.raw());
                    stack.push(Entry {
                        tracing_id: id.into_u64(),
                        session: session.clone(),
                        span,
                        start,
                        prev_len,
                    });
                }
                Err(e) => {
                    path.truncate(prev_len);
                    session.defer(e);
                }
            }
        });
    });
}

impl<S> Layer<S> for TraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.is_span() {
            self.state.callsite(meta);
        }
        Interest::always()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(c) = self.state.cached(attrs.metadata()) else {
            return;
        };
        if !c.reached.load(Ordering::Relaxed) {
            c.reached.store(true, Ordering::Relaxed);
        }
        let instance = c.take_instance();
        // Instance 0, the usual one, is the absence of the extension.
        if instance > 0 {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(Instance(instance));
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let instance = span.extensions().get::<Instance>().map_or(0, |i| i.0);
        if let Some(c) = self.state.cached(span.metadata()) {
            c.free_instance(instance);
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let name = span.metadata().name();
        let instance = span.extensions().get::<Instance>().map_or(0, |i| i.0);
        match &self.target {
            Target::Fixed(s) => begin(&self.state, s, id, name, instance),
            Target::Current => with_current(|s| {
                if let Some(s) = s {
                    begin(&self.state, s, id, name, instance)
                }
            }),
        }
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let raw = id.into_u64();
        let entry = STACK.try_with(|s| {
            let mut s = s.borrow_mut();
            match s.last() {
                Some(top) if top.tracing_id == raw => s.pop(),
                _ => None,
            }
        });
        if let Ok(Some(e)) = entry {
            let _ = PATH.try_with(|p| p.borrow_mut().truncate(e.prev_len));
            // SAFETY: plain values.
            let st = unsafe { ffi::ct_span_end(e.session.raw(), e.span) };
            if st != ffi::CT_OK {
                e.session.defer(crate::Error::last(st));
            }
        }
    }
}
