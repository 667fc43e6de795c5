//! Tensor statistics and gradient facts (issue 18), on the CPU, side by side
//! in one run:
//!
//! - ours: `SessionRef::record_tensor_stats` / `record_gradients`;
//! - candle-graph 0.10.1's own `TraceSession::record_tensor_stats` and
//!   `GradientCapturePlan::record` (candle ops in f32) on the same tensors;
//! - before: this crate's previous reduction (candle ops in f64 with a
//!   masked copy; its float path kept below), recorded through our session.
//!
//!     cargo bench --features candle --bench stats
//!
//! The tensors: logits 8x256x8000 f32 (64 MiB), and the 59 f32 gradients of
//! a tiny llama-like model (vocabulary 8000, hidden 256, 6 layers, grouped
//! KV heads of 64, MLP 688, a value head): 8.3 M elements, 33 MiB. Each
//! round records once with each implementation, the order rotating; every
//! record gets a fresh session of its kind (open and finish not timed).
//! Time is per record (mean, median, min); memory is the peak of live heap
//! bytes during the record above what was live before it, from a counting
//! global allocator. candle's CPU ops (candle-graph, before) run on candle's
//! thread pool; ours is one thread.
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_graph::candle::GradientCapturePlan;
use candle_graph::{
    CaptureContract as CgContract, CoverageLevel, GradientFamilyContract, ProfileRun, TraceSession,
};
use candle_nn::VarMap;
use candle_trace::candle::gradient_contract;
use candle_trace::{CaptureContract, Gradient, Run, Session, SessionRef, SpanId, TensorStats};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

/// Runs `f`; its time in ms and the peak heap bytes it held on top.
fn measure(f: impl FnOnce()) -> (f64, usize) {
    let t = Instant::now();
    counting_alloc::held_during(|| {
        f();
        t.elapsed().as_secs_f64() * 1e3
    })
}

/// The previous implementation of `candle::tensor_stats` and
/// `candle::gradient_of`, as it was before issue 18.
mod before {
    use candle_core::{DType, Tensor};
    use candle_trace::candle::Stats;
    use candle_trace::Gradient;

    pub fn tensor_stats(t: &Tensor) -> candle_core::Result<Stats> {
        let elements = t.elem_count() as u64;
        let cd = if t.device().is_metal() {
            DType::F32
        } else {
            DType::F64
        };
        let x = t.flatten_all()?.to_dtype(cd)?;
        let max = if cd == DType::F64 {
            f64::MAX
        } else {
            f32::MAX as f64
        };
        let finite = x.abs()?.le(max)?;
        let zeros = x.zeros_like()?;
        let xf = finite.where_cond(&x, &zeros)?;
        let count = finite.to_dtype(cd)?.sum_all()?;
        let sums = Tensor::stack(
            &[
                count,
                xf.sum_all()?,
                xf.sqr()?.sum_all()?,
                xf.abs()?.max_all()?,
            ],
            0,
        )?;
        let v = to_f64s(&sums)?;
        let finite_n = v[0].round().max(0.0) as u64;
        let fin = |v: f64| if v.is_finite() { v } else { 0.0 };
        let n = finite_n as f64;
        Ok(Stats {
            elements,
            non_finite: elements - finite_n,
            rms: fin((v[2] / n).sqrt()),
            abs_max: fin(v[3]),
            mean: fin(v[1] / n),
        })
    }

    fn to_f64s(t: &Tensor) -> candle_core::Result<Vec<f64>> {
        match t.dtype() {
            DType::F64 => t.to_vec1::<f64>(),
            _ => Ok(t
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .into_iter()
                .map(f64::from)
                .collect()),
        }
    }

    pub fn gradient_of(g: &Tensor) -> candle_core::Result<Gradient> {
        let cd = if g.device().is_metal() {
            DType::F32
        } else {
            DType::F64
        };
        let sumsq = g.to_dtype(cd)?.sqr()?.sum_all()?;
        let v = to_f64s(&sumsq.reshape(1)?)?[0];
        Ok(Gradient::from_norm(v.sqrt()))
    }
}

const ROOT: &str = "model";
const LOGITS: (usize, usize, usize) = (8, 256, 8000);
const ROUNDS_LOGITS: usize = 12;
const ROUNDS_GRADS: usize = 60;
const WARMUP: usize = 2;

/// The 59 parameters of a tiny llama-like model with a value head.
fn llama_shapes() -> Vec<(String, Vec<usize>)> {
    let (vocab, hidden, kv, mlp) = (8000, 256, 64, 688);
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![vocab, hidden])];
    for l in 0..6 {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![hidden, hidden]),
            ("self_attn.k_proj.weight", vec![kv, hidden]),
            ("self_attn.v_proj.weight", vec![kv, hidden]),
            ("self_attn.o_proj.weight", vec![hidden, hidden]),
            ("mlp.gate_proj.weight", vec![mlp, hidden]),
            ("mlp.up_proj.weight", vec![mlp, hidden]),
            ("mlp.down_proj.weight", vec![hidden, mlp]),
            ("input_layernorm.weight", vec![hidden]),
            ("post_attention_layernorm.weight", vec![hidden]),
        ] {
            v.push((format!("{p}.{name}"), shape));
        }
    }
    v.push(("model.norm.weight".to_string(), vec![hidden]));
    v.push(("lm_head.weight".to_string(), vec![vocab, hidden]));
    v.push(("value_head.weight".to_string(), vec![1, hidden]));
    v.push(("value_head.bias".to_string(), vec![1]));
    v
}

fn cg_session(path: &std::path::Path, contract: Option<&GradientCapturePlan>) -> TraceSession {
    let mut run = ProfileRun::training("bench::stats", 1, "cpu");
    if let Some(plan) = contract {
        run = run.capture_contract(CgContract {
            gradients: CoverageLevel::Complete,
            gradient_contract: Some(plan.contract().clone()),
            ..CgContract::default()
        });
    }
    TraceSession::open(path, run).unwrap()
}

struct Series {
    ms: Vec<f64>,
    peak: usize,
}

impl Series {
    fn new() -> Self {
        Series {
            ms: Vec::new(),
            peak: 0,
        }
    }
    fn push(&mut self, (ms, bytes): (f64, usize)) {
        self.ms.push(ms);
        self.peak = self.peak.max(bytes);
    }
    fn mean(&self) -> f64 {
        self.ms.iter().sum::<f64>() / self.ms.len() as f64
    }
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }
    fn median(&self) -> f64 {
        self.sorted()
            .get(self.ms.len() / 2)
            .copied()
            .unwrap_or(f64::NAN)
    }
    fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }
}

fn report(what: &str, bytes: usize, ours: &Series, cg: &Series, old: &Series) {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "{what} ({:.1} MiB of f32), {} records each:",
        mib(bytes),
        ours.ms.len()
    );
    println!(
        "  {:<14} {:>10} {:>10} {:>10} {:>16} {:>14} {:>12}",
        "", "mean ms", "median ms", "min ms", "peak extra MiB", "x tensor size", "median ratio"
    );
    for (name, s) in [("ours", ours), ("candle-graph", cg), ("before", old)] {
        println!(
            "  {:<14} {:>10.2} {:>10.2} {:>10.2} {:>16.3} {:>14.3} {:>11.2}x",
            name,
            s.mean(),
            s.median(),
            s.min(),
            mib(s.peak),
            s.peak as f64 / bytes as f64,
            s.median() / cg.median()
        );
    }
}

/// `rounds` rounds after `WARMUP`, each running the three records once, the
/// first of them rotating.
fn rounds(rounds: usize, records: [&mut dyn FnMut() -> (f64, usize); 3]) -> [Series; 3] {
    let mut out = [Series::new(), Series::new(), Series::new()];
    for round in 0..WARMUP + rounds {
        for k in 0..3 {
            let i = (round + k) % 3;
            let m = records[i]();
            if round >= WARMUP {
                out[i].push(m);
            }
        }
    }
    out
}

fn main() {
    let dev = Device::Cpu;
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours_path, cg_path) = (dir.join("ours.jsonl"), dir.join("cg.jsonl"));
    // One record in a fresh session of ours; open and finish not timed.
    let in_ours = |run: Run, f: &mut dyn FnMut(&SessionRef)| {
        let s = Session::open(&ours_path, run).unwrap();
        let m = measure(|| f(&s));
        s.finish().unwrap();
        m
    };

    // Logits.
    let logits = Tensor::randn(0f32, 1.0, LOGITS, &dev).unwrap();
    let run = || Run::inference("bench::stats", 1, "cpu").measured_root();
    let [ours, cg, old] = rounds(
        ROUNDS_LOGITS,
        [
            &mut || {
                in_ours(run(), &mut |s| {
                    s.record_tensor_stats(SpanId::ROOT, "logits", &logits)
                        .unwrap();
                })
            },
            &mut || {
                let s = cg_session(&cg_path, None);
                let span = s.begin_measurement("bench/measured");
                let id = span.id();
                let m = measure(|| s.record_tensor_stats(id, "logits", &logits).unwrap());
                drop(span);
                s.finish().unwrap();
                m
            },
            &mut || in_ours(run(), &mut |s| record_before(s, &logits)),
        ],
    );
    println!("CPU, {ROUNDS_LOGITS} rounds after {WARMUP} warm-up rounds, order rotating");
    report(
        &format!(
            "logits {}x{}x{} f32, one tensor_stats record",
            LOGITS.0, LOGITS.1, LOGITS.2
        ),
        logits.elem_count() * 4,
        &ours,
        &cg,
        &old,
    );
    drop(logits);

    // Gradients.
    let varmap = VarMap::new();
    let mut grads = GradStore::default();
    let mut elems = 0;
    for (name, shape) in llama_shapes() {
        let var = varmap
            .get(
                shape.as_slice(),
                &name,
                candle_nn::Init::Const(0.0),
                DType::F32,
                &dev,
            )
            .unwrap();
        let g = (Tensor::randn(0f32, 1.0, shape.as_slice(), &dev).unwrap() * 1e-3).unwrap();
        elems += g.elem_count();
        grads.insert(&var, g);
    }
    let vars: Vec<(String, candle_core::Var)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let count = vars.len();
    let plan = GradientCapturePlan::from_named_vars(
        ROOT,
        vars,
        |_| "params".to_string(),
        vec![GradientFamilyContract::data_conditional("params", 1)],
    )
    .unwrap();
    let run = || {
        Run::training("bench::stats", 1, "cpu")
            .measured_root()
            .capture_contract(
                CaptureContract::new().gradient_contract(gradient_contract(ROOT, &varmap)),
            )
    };
    let [ours, cg, old] = rounds(
        ROUNDS_GRADS,
        [
            &mut || {
                in_ours(run(), &mut |s| {
                    let facts = s.record_gradients(ROOT, &grads, &varmap).unwrap();
                    assert!(facts.iter().all(|(_, g)| matches!(g, Gradient::Present(_))));
                })
            },
            &mut || {
                let s = cg_session(&cg_path, Some(&plan));
                let m = measure(|| plan.record(&s, &grads).unwrap());
                s.finish().unwrap();
                m
            },
            &mut || in_ours(run(), &mut |s| gradients_before(s, &grads, &varmap)),
        ],
    );
    println!("CPU, {ROUNDS_GRADS} rounds after {WARMUP} warm-up rounds, order rotating");
    report(
        &format!(
            "{count} gradient facts ({:.2} M elements), one record_gradients",
            elems as f64 / 1e6
        ),
        elems * 4,
        &ours,
        &cg,
        &old,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn record_before(s: &SessionRef, t: &Tensor) {
    let st = before::tensor_stats(t).unwrap();
    let stats = TensorStats {
        label: "logits",
        dtype: "f32",
        shape: t.dims(),
        non_finite: st.non_finite,
        rms: st.rms,
        abs_max: st.abs_max,
        mean: st.mean,
    };
    s.tensor_stats(SpanId::ROOT, &stats).unwrap();
}

fn gradients_before(s: &SessionRef, grads: &GradStore, varmap: &VarMap) {
    for (name, var) in candle_trace::candle::named_vars(varmap) {
        let g = match grads.get(&var) {
            None => Gradient::Missing,
            Some(g) => before::gradient_of(g).unwrap(),
        };
        s.gradient(ROOT, &name, g).unwrap();
    }
}
