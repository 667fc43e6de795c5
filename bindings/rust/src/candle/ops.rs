//! Ops from models that are no `Module` to the tracer: a closure API
//! ([`trace_op`]), an extension trait on `Tensor` ([`TraceOps`]) and phase
//! spans that attribute heap memory ([`phase`]).
//!
//! A model such as candle's `llama2_c::Llama` keeps its submodules private,
//! so no wrapper can be put around them from outside; the code that calls
//! them can name its ops instead:
//!
//! ```text
//! let q = trace_op("layers.0.attn.q_proj", &[&x], || self.q_proj.forward(&x))?;
//! let att = q.traced_matmul("layers.0.attn.scores", &k.t()?)?;
//! ```
//!
//! With a current session (inside the measured region) each op is one op
//! span (kind `op`) holding one `op` record (inputs and output by tensor id,
//! shape, dtype, input and output bytes, start and duration) and the output's
//! `tensor` record; the heap traffic of the op is attributed to its span
//! ([`crate::heap::attribute_span`]). The recording is the tracer's own work
//! (`ct_tracer_begin`/`end`): the span times the op alone. Without a current
//! session an op is the closure plus one thread-local read. A recording
//! failure never fails the op: it is deferred to `finish`.
use candle_core::{Module, Tensor, D};

use crate::error::Result;
use crate::heap;
use crate::session::{
    current, Category, SessionRef, SpanGuard, SpanId, SpanKind, Step, TracerWork,
};

use super::record_op_of;

/// The tracer's own work, when the session keeps it apart (an aggregate
/// session refuses tracer intervals: its spans are timed otherwise).
pub(crate) fn tracer_work(session: &SessionRef) -> (Option<TracerWork<'_>>, heap::Excluded) {
    (session.tracer_work().ok(), heap::exclude())
}

/// Runs `f` as the op `name` reading `inputs` (see the module
/// documentation). Returns what `f` returns.
pub fn trace_op(
    name: &str,
    inputs: &[&Tensor],
    f: impl FnOnce() -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    let Some(session) = current() else {
        return f();
    };
    let span = session.span_with(name, SpanKind::Op, Step::None);
    let id = span.id();
    if id.0 == 0 {
        return f();
    }
    heap::name_op(id, name);
    let attribution = heap::attribute_span(id);
    let start = session.now_ns();
    let ys = f()?;
    let end = session.now_ns();
    {
        let _w = tracer_work(&session);
        let recorded = record_op_of(&session, id, name, inputs, &ys, start, end).and_then(|out| {
            super::record_tensor_meta(&session, id, &ys, &out, Some(name), Category::Activation)
        });
        if let Err(e) = recorded {
            session.defer(e);
        }
        drop(attribution);
        drop(span);
    }
    Ok(ys)
}

/// Traced versions of the tensor ops users care about: each is the plain op
/// run through [`trace_op`] under the name given, reading `self` (and the
/// other operand).
pub trait TraceOps {
    /// `self.matmul(rhs)`.
    fn traced_matmul(&self, name: &str, rhs: &Tensor) -> candle_core::Result<Tensor>;
    /// `self.broadcast_matmul(rhs)`.
    fn traced_broadcast_matmul(&self, name: &str, rhs: &Tensor) -> candle_core::Result<Tensor>;
    /// `candle_nn::ops::softmax(self, dim)` (differentiable).
    fn traced_softmax(&self, name: &str, dim: D) -> candle_core::Result<Tensor>;
    /// `self.conv1d(kernel, padding, stride, dilation, groups)`.
    fn traced_conv1d(
        &self,
        name: &str,
        kernel: &Tensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> candle_core::Result<Tensor>;
    /// `self.conv2d(kernel, padding, stride, dilation, groups)`.
    fn traced_conv2d(
        &self,
        name: &str,
        kernel: &Tensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> candle_core::Result<Tensor>;
    /// `module.forward(self)`: a `Linear`, `Embedding`, `RmsNorm`... inside
    /// a model that is not a `Module` itself.
    fn traced_apply<M: Module>(&self, name: &str, module: &M) -> candle_core::Result<Tensor>;
    /// `f(self)`, for any other op.
    fn traced(
        &self,
        name: &str,
        f: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor>;
}

impl TraceOps for Tensor {
    fn traced_matmul(&self, name: &str, rhs: &Tensor) -> candle_core::Result<Tensor> {
        trace_op(name, &[self, rhs], || self.matmul(rhs))
    }
    fn traced_broadcast_matmul(&self, name: &str, rhs: &Tensor) -> candle_core::Result<Tensor> {
        trace_op(name, &[self, rhs], || self.broadcast_matmul(rhs))
    }
    fn traced_softmax(&self, name: &str, dim: D) -> candle_core::Result<Tensor> {
        trace_op(name, &[self], || candle_nn::ops::softmax(self, dim))
    }
    fn traced_conv1d(
        &self,
        name: &str,
        kernel: &Tensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> candle_core::Result<Tensor> {
        trace_op(name, &[self, kernel], || {
            self.conv1d(kernel, padding, stride, dilation, groups)
        })
    }
    fn traced_conv2d(
        &self,
        name: &str,
        kernel: &Tensor,
        padding: usize,
        stride: usize,
        dilation: usize,
        groups: usize,
    ) -> candle_core::Result<Tensor> {
        trace_op(name, &[self, kernel], || {
            self.conv2d(kernel, padding, stride, dilation, groups)
        })
    }
    fn traced_apply<M: Module>(&self, name: &str, module: &M) -> candle_core::Result<Tensor> {
        trace_op(name, &[self], || module.forward(self))
    }
    fn traced(
        &self,
        name: &str,
        f: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Tensor> {
        trace_op(name, &[self], || f(self))
    }
}

/// A phase span (from [`phase`]): the span and the heap attribution to it,
/// both ending when dropped.
#[must_use = "the phase ends when the guard is dropped: bind it with `let _p = ...`"]
pub struct Phase<'a> {
    // Field order is drop order: the attribution ends before the span.
    _attribution: heap::Attribution,
    span: SpanGuard<'a>,
}

impl Phase<'_> {
    /// The span's id.
    pub fn id(&self) -> SpanId {
        self.span.id()
    }
}

impl<'a> From<&Phase<'a>> for SpanId {
    fn from(p: &Phase<'a>) -> SpanId {
        p.id()
    }
}

impl std::fmt::Debug for Phase<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phase").field("span", &self.span).finish()
    }
}

/// The heap category of a training phase's new memory: activations in the
/// forward, gradients in the backward, optimizer state in the optimizer.
pub fn phase_category(step: Step) -> Category {
    match step {
        Step::Forward => Category::Activation,
        Step::Backward => Category::Gradient,
        Step::Optimizer => Category::Optimizer,
        Step::None => Category::Other,
    }
}

/// Opens a span tagged `step` (a module span for the forward, a function span
/// otherwise) and attributes the heap traffic until it ends to it, in the
/// phase's category ([`phase_category`]).
pub fn phase<'a>(session: &'a SessionRef, name: &str, step: Step) -> Result<Phase<'a>> {
    let kind = if step == Step::Forward {
        SpanKind::Module
    } else {
        SpanKind::Function
    };
    let span = session.try_span(name, kind, step)?;
    let attribution = heap::attribute(&span, phase_category(step));
    Ok(Phase {
        _attribution: attribution,
        span,
    })
}
