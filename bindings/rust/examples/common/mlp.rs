//! The MLP of the `train_mlp` example, shared with its test and benchmark.
//!
//! Model 64-64-10 (Linear, ReLU, Linear), batch 32, f32, SGD lr 0.1, softmax
//! cross-entropy, synthetic data. Everything random comes from one splitmix64
//! stream seeded with 0 (`fixed-0`): weights and biases ~ U(-1/sqrt(in),
//! 1/sqrt(in)) like PyTorch's nn.Linear, inputs ~ U(-1, 1), labels uniform in
//! 0..10, drawn in that order. A PyTorch twin declares the same comparison
//! identity with implementation_id "pytorch".
#![allow(dead_code)]
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, Optimizer, VarBuilder, VarMap, SGD};
use candle_trace::candle::{backward_step, capture_contract, Traced};
use candle_trace::{ComparisonIdentity, Run, Schedule, Session, SpanKind, Step};

pub const IN: usize = 64;
pub const HIDDEN: usize = 64;
pub const OUT: usize = 10;
pub const BATCH: usize = 32;
pub const LR: f64 = 0.1;
pub const CAPTURE_STEP: u64 = 3;
pub const ROOT: &str = "mlp";
pub const LABELS: [&str; 3] = ["train/forward", "train/backward", "train/optimizer"];

#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

pub struct Mlp {
    pub fc1: Traced<Linear>,
    pub fc2: Traced<Linear>,
}

impl Module for Mlp {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(xs)?.relu()?)
    }
}

pub struct Setup {
    pub device: Device,
    pub varmap: VarMap,
    pub model: Mlp,
    pub opt: SGD,
    pub rng: Rng,
}

fn uniform_tensor(
    rng: &mut Rng,
    scale: f32,
    shape: &[usize],
    dev: &Device,
) -> candle_core::Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.uniform() * scale).collect();
    Tensor::from_vec(v, shape, dev)
}

pub fn setup() -> candle_core::Result<Setup> {
    let device = Device::Cpu;
    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let fc1 = linear(IN, HIDDEN, vb.pp("fc1"))?;
    let fc2 = linear(HIDDEN, OUT, vb.pp("fc2"))?;
    let mut rng = Rng::new(0);
    for (name, shape, fan_in) in [
        ("fc1.weight", vec![HIDDEN, IN], IN),
        ("fc1.bias", vec![HIDDEN], IN),
        ("fc2.weight", vec![OUT, HIDDEN], HIDDEN),
        ("fc2.bias", vec![OUT], HIDDEN),
    ] {
        let t = uniform_tensor(&mut rng, 1.0 / (fan_in as f32).sqrt(), &shape, &device)?;
        varmap.set_one(name, &t)?;
    }
    let opt = SGD::new(varmap.all_vars(), LR)?;
    Ok(Setup {
        device,
        varmap,
        model: Mlp {
            fc1: Traced::new("fc1", fc1),
            fc2: Traced::new("fc2", fc2),
        },
        opt,
        rng,
    })
}

/// The next synthetic batch: inputs [32, 64] f32, labels [32] u32.
pub fn batch(s: &mut Setup) -> candle_core::Result<(Tensor, Tensor)> {
    let x = uniform_tensor(&mut s.rng, 1.0, &[BATCH, IN], &s.device)?;
    let y: Vec<u32> = (0..BATCH)
        .map(|_| (s.rng.next_u64() % OUT as u64) as u32)
        .collect();
    Ok((x, Tensor::from_vec(y, BATCH, &s.device)?))
}

/// One plain update, untraced: the same arithmetic as the captured one.
pub fn plain_update(s: &mut Setup, x: &Tensor, y: &Tensor) -> candle_core::Result<f32> {
    let logits = s.model.forward(x)?;
    let loss = candle_nn::loss::cross_entropy(&logits, y)?;
    s.opt.backward_step(&loss)?;
    loss.to_scalar::<f32>()
}

pub fn identity() -> ComparisonIdentity {
    ComparisonIdentity {
        workload_id: "mlp-synthetic".into(),
        model_id: "mlp-64-64-10".into(),
        config_id: "sgd-lr0.1".into(),
        data_id: "synthetic-seed0".into(),
        seed_policy: "fixed-0".into(),
        precision: "f32".into(),
        device_state: "cpu".into(),
        physical_batch: BATCH as u64,
        accumulation_steps: 1,
        implementation_id: Some("candle".into()),
        pair_id: None,
    }
}

pub fn run_description(s: &Setup) -> Run {
    Run::training("mlp::train", CAPTURE_STEP, "cpu")
        .tag("example", "rust")
        .tag("batch", BATCH.to_string())
        .tag("model", "mlp-64-64-10")
        .capture_contract(capture_contract(ROOT, &s.varmap).required_labels(LABELS))
        .comparison_identity(identity())
}

/// The captured update: forward (module spans of fc1 and fc2 inside
/// `train/forward`), loss, then `train/backward`, gradients and
/// `train/optimizer` — all inside the measured region `train/update`.
/// Returns the loss.
pub fn captured_update(
    session: &Session,
    s: &mut Setup,
    x: &Tensor,
    y: &Tensor,
) -> candle_trace::Result<f32> {
    captured_update_with(session, None, s, x, y)
}

fn agg_span<'a>(
    agg: Option<&'a Session>,
    name: &str,
    kind: SpanKind,
    step: Step,
) -> candle_trace::Result<Option<candle_trace::SpanGuard<'a>>> {
    agg.map(|a| a.try_span(name, kind, step)).transpose()
}

/// [`captured_update`], its phases also spanned in the aggregate session
/// `agg` (when given) under the same names; the trace is the same.
pub fn captured_update_with(
    session: &Session,
    agg: Option<&Session>,
    s: &mut Setup,
    x: &Tensor,
    y: &Tensor,
) -> candle_trace::Result<f32> {
    let _update = session.measure("train/update")?;
    let loss = {
        let _agg = agg_span(agg, LABELS[0], SpanKind::Module, Step::Forward)?;
        let fwd = session.try_span(LABELS[0], SpanKind::Module, Step::Forward)?;
        session.record_tensor_as(&fwd, x, Some("input"), candle_trace::Category::Other)?;
        let logits = s.model.forward(x)?;
        let loss = candle_nn::loss::cross_entropy(&logits, y)?;
        session.record_tensor_stats(&fwd, "logits", &logits)?;
        let value = loss.to_scalar::<f32>()?;
        session.scalar(&fwd, "loss", value as f64)?;
        (loss, value)
    };
    if agg.is_none() {
        backward_step(session, &mut s.opt, &loss.0, ROOT, &s.varmap)?;
        return Ok(loss.1);
    }
    // backward_step, spelled out to put the aggregate spans around its phases.
    let grads = {
        let _agg = agg_span(agg, LABELS[1], SpanKind::Function, Step::Backward)?;
        let _bwd = session.try_span(LABELS[1], SpanKind::Function, Step::Backward)?;
        loss.0.backward()?
    };
    session.record_gradients(ROOT, &grads, &s.varmap)?;
    {
        let _agg = agg_span(agg, LABELS[2], SpanKind::Function, Step::Optimizer)?;
        let _opt = session.try_span(LABELS[2], SpanKind::Function, Step::Optimizer)?;
        s.opt.step(&grads)?;
    }
    Ok(loss.1)
}

/// Trains `steps` updates and captures update 3 into `out`.
pub fn train(out: &Path, steps: u64) -> candle_trace::Result<(PathBuf, Vec<f32>)> {
    assert!(steps >= CAPTURE_STEP);
    let mut s = setup()?;
    let mut losses = Vec::new();
    let mut written = None;
    for step in 1..=steps {
        let (x, y) = batch(&mut s)?;
        if step == CAPTURE_STEP {
            let session = Session::open(out, run_description(&s))?;
            losses.push(captured_update(&session, &mut s, &x, &y)?);
            written = Some(session.finish()?.into_path());
        } else {
            losses.push(plain_update(&mut s, &x, &y)?);
        }
    }
    Ok((written.expect("capture step reached"), losses))
}

/// Span names of the aggregate schedule ([`train_aggregate`]): the update
/// (enclosing the rest: `candle-trace report` ignores it by default), the
/// batch, and the three phases.
pub const AGG_STEP: &str = "train/step";
pub const AGG_DATA: &str = "train/data";

/// One update with the aggregate session's phase spans (the same arithmetic
/// as [`plain_update`]). Returns the loss.
pub fn aggregated_update(
    agg: &Session,
    s: &mut Setup,
    x: &Tensor,
    y: &Tensor,
) -> candle_trace::Result<f32> {
    let loss = {
        let _f = agg.try_span(LABELS[0], SpanKind::Module, Step::Forward)?;
        let logits = s.model.forward(x)?;
        candle_nn::loss::cross_entropy(&logits, y)?
    };
    let grads = {
        let _b = agg.try_span(LABELS[1], SpanKind::Function, Step::Backward)?;
        loss.backward()?
    };
    {
        let _o = agg.try_span(LABELS[2], SpanKind::Function, Step::Optimizer)?;
        s.opt.step(&grads)?;
    }
    Ok(loss.to_scalar::<f32>()?)
}

/// Both modes in one run: an aggregate session (`summary`, a
/// candle-trace/aggregate/1 file rewritten every `interval_ms`, default 10 s)
/// over all `steps` updates — `train/step`, `train/data`, the three phase
/// spans and the `loss` scalar, in constant memory — and the capture of
/// update [`CAPTURE_STEP`] into `out`, exactly as [`train`] takes it (the
/// captured update is counted too: its `train/step` carries the capture's
/// cost). The aggregate session is finished also when the capture fails.
/// Returns the trace path, the summary path and the losses.
pub fn train_aggregate(
    out: &Path,
    summary: &Path,
    interval_ms: Option<u64>,
    steps: u64,
) -> candle_trace::Result<(PathBuf, PathBuf, Vec<f32>)> {
    assert!(steps >= CAPTURE_STEP);
    let mut s = setup()?;
    let run = run_description(&s);
    let schedule = Schedule::new(out, run)
        .with_update_span(AGG_STEP)
        .with_aggregate(summary, interval_ms)?;
    let agg = schedule
        .aggregate()
        .expect("aggregate statistics requested");
    let result = (|| -> candle_trace::Result<Vec<f32>> {
        let mut losses = Vec::with_capacity(steps as usize);
        for _ in 1..=steps {
            let update = schedule.begin_update()?;
            let (x, y) = {
                let _d = agg.try_span(AGG_DATA, SpanKind::Function, Step::None)?;
                batch(&mut s)?
            };
            let loss = match update.capture() {
                Some(trace) => captured_update_with(trace, Some(agg), &mut s, &x, &y)?,
                None => aggregated_update(agg, &mut s, &x, &y)?,
            };
            update.scalar("loss", loss as f64)?;
            update.end()?;
            losses.push(loss);
        }
        Ok(losses)
    })();
    match result {
        Ok(losses) => {
            let done = schedule.finish()?;
            Ok((
                done.trace.expect("capture step reached"),
                done.summary.expect("aggregate statistics kept"),
                losses,
            ))
        }
        Err(e) => {
            let _ = schedule.finish_failed(&e.to_string());
            Err(e)
        }
    }
}
