//! A `tracing_subscriber::Layer` that turns `tracing` spans into session
//! spans (feature `tracing`), so code already instrumented with `tracing`
//! (candle-transformers' models are) is captured with no change.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//! tracing_subscriber::registry().with(candle_trace::layer::TraceLayer::current()).init();
//! // ... later, inside `session.measure(..)`, every entered tracing span of
//! // this thread becomes a function span of the session.
//! ```
//!
//! Each enter of a tracing span begins a session span on the entering thread
//! and the matching exit ends it, so a span entered several times gives
//! several session spans, nested as the threads entered them. The span's
//! name is the tracing span's name; kind `function`, no step.
use std::cell::RefCell;

use tracing_core::span::Id;
use tracing_core::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

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
}

impl TraceLayer {
    /// Records into the entering thread's current session (set while a
    /// measured region is open); spans entered without one are ignored.
    pub fn current() -> Self {
        TraceLayer { target: Target::Current }
    }

    /// Records every entered span, on any thread, into `session`.
    pub fn for_session(session: &SessionRef) -> Self {
        TraceLayer { target: Target::Fixed(session.clone()) }
    }
}

struct Entry {
    tracing_id: u64,
    session: SessionRef,
    span: u64,
}

thread_local! {
    static STACK: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

fn begin(session: &SessionRef, id: &Id, name: &str) {
    match session.try_span(name, SpanKind::Function, Step::None) {
        Ok(guard) => {
            let span = guard.id().0;
            std::mem::forget(guard); // ended in on_exit
            let entry = Entry { tracing_id: id.into_u64(), session: session.clone(), span };
            let _ = STACK.try_with(|s| s.borrow_mut().push(entry));
        }
        Err(e) => session.defer(e),
    }
}

impl<S> Layer<S> for TraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(meta) = ctx.metadata(id) else { return };
        match &self.target {
            Target::Fixed(s) => begin(s, id, meta.name()),
            Target::Current => with_current(|s| {
                if let Some(s) = s {
                    begin(s, id, meta.name())
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
            // SAFETY: plain values.
            let st = unsafe { crate::ffi::ct_span_end(e.session.raw(), e.span) };
            if st != crate::ffi::CT_OK {
                e.session.defer(crate::Error::last(st));
            }
        }
    }
}
