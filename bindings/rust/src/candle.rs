//! Capture helpers for candle (feature `candle`).
//!
//! candle has no hook points of its own (no forward hooks; `Tensor::op()` is
//! private), so capture comes from wrappers and explicit calls:
//!
//! - [`SessionRef::record_tensor`] / [`SessionRef::record_tensor_stats`]:
//!   metadata, and statistics reduced on the tensor's device (in place on
//!   the CPU, by candle ops elsewhere: [`tensor_stats`]);
//! - [`SessionRef::record_gradients`]: one gradient fact per `VarMap` variable,
//!   under the exact contract [`gradient_contract`] builds;
//! - [`Traced`]: a `Module` wrapper that spans the forward, records it as an
//!   op and records its output's metadata and stats;
//! - [`backward_step`]: `Optimizer::backward_step` split in two spans, with the
//!   gradients recorded in between;
//! - [`trace_op`], [`TraceOps`] and [`phase`]: ops and phases of a model that
//!   is no `Module` to the tracer (private submodules, as candle's own
//!   `llama2_c::Llama`), with their heap memory ([`crate::heap`]).
//!
//! What these helpers do for the tracer (statistics, gradient norms, encoding
//! records) is bracketed as the tracer's own work (`ct_tracer_begin`/`end`),
//! so span durations count the model alone.
//!
//! The wrappers record into the thread's [`crate::current`] session (set while
//! a measured region is open) and cost one thread-local read otherwise.
use candle_core::{Device, DeviceLocation, Tensor};
use candle_nn::{Module, Optimizer, VarMap};

use candle_core::backprop::GradStore;

use crate::error::Result;
use crate::run::{CaptureContract, GradientContract, Level, MeasurementScope};
use crate::session::{
    current, Category, Gradient, Measured, Op, SessionRef, SpanId, SpanKind, Step, TensorMeta,
    TensorStats,
};

mod ops;
mod reduce;

use ops::tracer_work;
pub use ops::{phase, phase_category, trace_op, Phase, TraceOps};

/// The trace's name of a candle device: `cpu`, `cuda:N`, `metal:N`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        DeviceLocation::Cpu => "cpu".to_string(),
        DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// The tensor's identity in traces: `t<N>` from candle's `TensorId`.
pub fn tensor_id(t: &Tensor) -> String {
    // TensorId's number is private; its Debug form is `TensorId(N)`.
    let dbg = format!("{:?}", t.id());
    let digits: String = dbg.chars().filter(|c| c.is_ascii_digit()).collect();
    format!("t{digits}")
}

/// Statistics of a tensor (the trace's `tensor_stats`), reduced on its own
/// device by [`tensor_stats`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// All elements, finite or not.
    pub elements: u64,
    /// NaN and ±inf elements.
    pub non_finite: u64,
    /// Root mean square of the finite elements (0 when none is).
    pub rms: f64,
    /// Largest magnitude of the finite elements (0 when none is).
    pub abs_max: f64,
    /// Mean of the finite elements (0 when none is).
    pub mean: f64,
}

/// The count of non-finite elements of `t`, and rms, abs_max and mean of the
/// finite ones (all 0 when none is finite; a reduction that overflows `f64`
/// is written as 0).
///
/// On the CPU the storage is read in place in its own dtype (f32, f64, f16,
/// bf16, u8, u32, i16, i32, i64), strided layouts included, with `f64`
/// accumulators (compensated across blocks of 4096; integer sums exact): one
/// pass, no allocation of the tensor's size, on candle's CPU thread pool
/// from 2^20 elements on (the same result on any number of threads).
///
/// On CUDA and Metal, candle ops reduce chunks of 2^22 elements in `f32`
/// (`f64` for f64 tensors, and for integers on CUDA): a chunk's temporaries
/// are a few chunk sizes, its partial sums a few scalars, all of them read
/// back in one transfer and combined in `f64`. A strided tensor is first
/// made contiguous (one copy). Other dtypes on the CPU take this path too.
pub fn tensor_stats(t: &Tensor) -> candle_core::Result<Stats> {
    let elements = t.elem_count() as u64;
    if elements == 0 {
        return Ok(Stats {
            elements,
            non_finite: 0,
            rms: 0.0,
            abs_max: 0.0,
            mean: 0.0,
        });
    }
    reduce::stats(t)
}

/// The L2 norm of a gradient, reduced on its device as [`gradient_norms`]
/// does, classified.
pub fn gradient_of(g: &Tensor) -> candle_core::Result<Gradient> {
    Ok(gradient_norms(&[g])?
        .into_iter()
        .next()
        .unwrap_or(Gradient::Missing))
}

/// The L2 norms of `grads`, classified (`present`, `zero`, or `non_finite`
/// when an element or the sum of squares is not finite), in order. CPU
/// tensors are read in place as for [`tensor_stats`] (squares summed in
/// `f64`); the others are reduced by candle ops in chunks (in `f32`, `f64`
/// for f64 and integer tensors on CUDA; an `f32` sum of squares past
/// `f32::MAX` reads as non-finite), all of one device's partial sums coming
/// back in a single transfer.
pub fn gradient_norms(grads: &[&Tensor]) -> Result<Vec<Gradient>> {
    let sums = reduce::sums_of_squares(grads, reduce::OPS_CHUNK, true)?;
    Ok(sums
        .into_iter()
        .map(|s| Gradient::from_norm(s.sqrt()))
        .collect())
}

/// The variables of a `VarMap` as `(name, tensor)`, sorted by name.
pub fn named_vars(varmap: &VarMap) -> Vec<(String, Tensor)> {
    let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
    let mut v: Vec<(String, Tensor)> = data
        .iter()
        .map(|(k, var)| (k.clone(), var.as_tensor().clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The exact gradient contract of a `VarMap`: every variable, sorted by name,
/// under `root`, in the family [`crate::family_of`] gives it (`fc1.weight` →
/// `fc1`), each family `data_conditional` with `min_present` 1 (the default of
/// [`GradientContract`]: valid for layers that legitimately get no gradient).
/// Declare stricter expectations with its builders (`all_active`, `active`,
/// `frozen`, `data_conditional`).
pub fn gradient_contract(root: &str, varmap: &VarMap) -> GradientContract {
    GradientContract::from_keys(root, named_vars(varmap).iter().map(|(k, _)| k.as_str()))
}

/// The capture contract of an update this module records: the profiled work
/// measured, operations and tensors partial (what [`trace_op`],
/// [`Traced`] and [`backward_step`] record, not every candle op), no
/// activations, and [`gradient_contract`] of `varmap`. Add what a program
/// records beyond that (`logical_memory` with [`crate::heap`], the
/// `required_labels` its statistics carry).
pub fn capture_contract(root: &str, varmap: &VarMap) -> CaptureContract {
    CaptureContract::new()
        .measurement_scope(MeasurementScope::ProfiledWork)
        .operations(Level::Partial)
        .activations(Level::None)
        .tensors(Level::Partial)
        .gradient_contract(gradient_contract(root, varmap))
}

fn dims(t: &Tensor) -> &[usize] {
    t.dims()
}

fn record_tensor_meta(
    session: &SessionRef,
    span: SpanId,
    t: &Tensor,
    id: &str,
    label: Option<&str>,
    category: Category,
) -> Result<()> {
    let device = device_name(t.device());
    session.tensor(
        span,
        &TensorMeta {
            tensor_id: id,
            dtype: t.dtype().as_str(),
            device: &device,
            label,
            shape: dims(t),
            requires_grad: t.is_variable(),
            category,
            dense_bytes: None,
        },
    )
}

impl SessionRef {
    /// Records `t`'s metadata in `span`: identity `t<N>`, dtype, device,
    /// shape; a variable is a `parameter` (requires_grad), anything else an
    /// `activation`.
    pub fn record_tensor(&self, span: impl Into<SpanId>, t: &Tensor) -> Result<()> {
        let category = if t.is_variable() {
            Category::Parameter
        } else {
            Category::Activation
        };
        self.record_tensor_as(span, t, None, category)
    }

    /// [`SessionRef::record_tensor`] with a label and category of your choice.
    pub fn record_tensor_as(
        &self,
        span: impl Into<SpanId>,
        t: &Tensor,
        label: Option<&str>,
        category: Category,
    ) -> Result<()> {
        let _w = tracer_work(self);
        record_tensor_meta(self, span.into(), t, &tensor_id(t), label, category)
    }

    /// Reduces `t` on its device ([`tensor_stats`]) and records the result
    /// under `label`. Returns the statistics.
    pub fn record_tensor_stats(
        &self,
        span: impl Into<SpanId>,
        label: &str,
        t: &Tensor,
    ) -> Result<Stats> {
        let _w = tracer_work(self);
        let s = tensor_stats(t)?;
        self.tensor_stats(
            span,
            &TensorStats {
                label,
                dtype: t.dtype().as_str(),
                shape: dims(t),
                non_finite: s.non_finite,
                rms: s.rms,
                abs_max: s.abs_max,
                mean: s.mean,
            },
        )?;
        Ok(s)
    }

    /// One gradient fact per variable of `varmap` (sorted by name) under
    /// `root`: `missing` when `grads` has none for it, else `present`, `zero`
    /// or `non_finite` from its L2 norm reduced on its device (all of them
    /// first, one transfer per device: [`gradient_norms`]). Pair it with
    /// [`gradient_contract`] in the run's capture contract. Returns the facts.
    pub fn record_gradients(
        &self,
        root: &str,
        grads: &GradStore,
        varmap: &VarMap,
    ) -> Result<Vec<(String, Gradient)>> {
        self.record_gradients_of(root, &gradients_of(grads, varmap))
    }

    /// [`record_gradients`](Self::record_gradients) of the gradients
    /// [`gradients_of`] took.
    pub(crate) fn record_gradients_of(
        &self,
        root: &str,
        taken: &[(String, Option<Tensor>)],
    ) -> Result<Vec<(String, Gradient)>> {
        let _w = tracer_work(self);
        let present: Vec<&Tensor> = taken.iter().filter_map(|(_, g)| g.as_ref()).collect();
        let mut norms = gradient_norms(&present)?.into_iter();
        let mut out = Vec::with_capacity(taken.len());
        for (name, g) in taken {
            let g = match g {
                None => Gradient::Missing,
                Some(_) => norms.next().unwrap_or(Gradient::Missing),
            };
            self.gradient(root, name, g)?;
            out.push((name.clone(), g));
        }
        Ok(out)
    }
}

/// Each variable of `varmap` (sorted by name) with its gradient in `grads`, if
/// any: the tensors themselves (shared, not copied), to be reduced later.
pub(crate) fn gradients_of(grads: &GradStore, varmap: &VarMap) -> Vec<(String, Option<Tensor>)> {
    named_vars(varmap)
        .into_iter()
        .map(|(name, var)| (name, grads.get(&var).cloned()))
        .collect()
}

/// Opens the measured region like [`SessionRef::measure`], synchronizing
/// `device` right after it opens and right before it ends, as a run declared
/// with [`crate::Run::device_synchronized`] promises.
pub fn measure_synchronized<'a>(
    session: &'a SessionRef,
    name: &str,
    device: &'a Device,
) -> Result<Measured<'a>> {
    device.synchronize()?;
    let m = session.measure(name)?;
    Ok(m.before_end(move || {
        let _ = device.synchronize();
    }))
}

/// A `Module` that, while a session is current, spans its forward (a module
/// span tagged `forward`, named as given), records the forward as one op (the
/// input and output by tensor id), the output's metadata, and the output's
/// stats labelled `<name>/output` (unless the session [`SessionRef::records_stats`]
/// is off: a flight recorder). Without a current session it is the inner
/// module plus one thread-local read.
///
/// Capture failures never fail the forward: they are deferred to `finish`.
#[derive(Debug, Clone)]
pub struct Traced<M> {
    name: String,
    inner: M,
}

impl<M> Traced<M> {
    pub fn new(name: impl Into<String>, inner: M) -> Self {
        Traced {
            name: name.into(),
            inner,
        }
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn inner(&self) -> &M {
        &self.inner
    }
    pub fn into_inner(self) -> M {
        self.inner
    }
}

impl<M: Module> Module for Traced<M> {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        let Some(session) = current() else {
            return self.inner.forward(xs);
        };
        let span = session.span_with(&self.name, SpanKind::Module, Step::Forward);
        let id = span.id();
        let attribution = (id.0 != 0).then(|| crate::heap::attribute(id, Category::Activation));
        let start = session.now_ns();
        let ys = self.inner.forward(xs)?;
        let end = session.now_ns();
        if id.0 != 0 {
            // The op must lie inside the open span; recording it, the
            // output's metadata and stats is the tracer's work, left out of
            // the module's time.
            let _w = tracer_work(&session);
            let recorded =
                record_op_of(&session, id, &self.name, &[xs], &ys, start, end).and_then(|o| {
                    record_forward_output(&session, id, &self.name, &tensor_id(xs), &o, &ys)
                });
            if let Err(e) = recorded {
                session.defer(e);
            }
            drop(attribution);
            drop(span);
        }
        Ok(ys)
    }
}

/// Records `ys = name(inputs)`, timed from `start` to `end` on the session
/// clock, as an op of `span`. Returns the output's tensor id.
pub(crate) fn record_op_of(
    session: &SessionRef,
    span: SpanId,
    name: &str,
    inputs: &[&Tensor],
    ys: &Tensor,
    start: u64,
    end: u64,
) -> Result<String> {
    let ids: Vec<String> = inputs.iter().map(|t| tensor_id(t)).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let out_id = tensor_id(ys);
    let device = device_name(ys.device());
    session.op(
        span,
        &Op {
            name,
            dtype: ys.dtype().as_str(),
            device: &device,
            inputs: &refs,
            output: Some(&out_id),
            shape: ys.dims(),
            duration_ns: end.saturating_sub(start).max(1),
            timestamp_ns: start.max(1),
            output_dense_bytes: None,
            input_dense_bytes: inputs
                .iter()
                .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
                .sum(),
        },
    )?;
    Ok(out_id)
}

fn record_forward_output(
    session: &SessionRef,
    span: SpanId,
    name: &str,
    in_id: &str,
    out_id: &str,
    ys: &Tensor,
) -> Result<()> {
    record_tensor_meta(session, span, ys, out_id, Some(name), Category::Activation)?;
    session.data_edge(in_id, out_id)?;
    if session.records_stats() {
        session.record_tensor_stats(span, &format!("{name}/output"), ys)?;
    }
    Ok(())
}

/// Span names of [`backward_step_named`].
#[derive(Debug, Clone, Copy)]
pub struct UpdateSpans<'a> {
    pub backward: &'a str,
    pub optimizer: &'a str,
}

impl Default for UpdateSpans<'_> {
    fn default() -> Self {
        UpdateSpans {
            backward: "train/backward",
            optimizer: "train/optimizer",
        }
    }
}

/// `Optimizer::backward_step` split for capture, to be called inside the
/// measured region: `loss.backward()` in a `train/backward` span (tagged
/// backward), one gradient fact per `varmap` variable under `root`, then
/// `optimizer.step(&grads)` in a `train/optimizer` span (tagged optimizer).
/// Returns the gradients and the facts.
pub fn backward_step<O: Optimizer>(
    session: &SessionRef,
    optimizer: &mut O,
    loss: &Tensor,
    root: &str,
    varmap: &VarMap,
) -> Result<(GradStore, Vec<(String, Gradient)>)> {
    backward_step_named(
        session,
        optimizer,
        loss,
        root,
        varmap,
        UpdateSpans::default(),
    )
}

/// [`backward_step`] with span names of your choice.
pub fn backward_step_named<O: Optimizer>(
    session: &SessionRef,
    optimizer: &mut O,
    loss: &Tensor,
    root: &str,
    varmap: &VarMap,
    names: UpdateSpans<'_>,
) -> Result<(GradStore, Vec<(String, Gradient)>)> {
    let grads = {
        let _bwd = phase(session, names.backward, Step::Backward)?;
        loss.backward()?
    };
    let facts = session.record_gradients(root, &grads, varmap)?;
    {
        let _opt = phase(session, names.optimizer, Step::Optimizer)?;
        optimizer.step(&grads)?;
    }
    Ok((grads, facts))
}
