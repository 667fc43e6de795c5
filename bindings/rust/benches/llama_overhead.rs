//! The train_llama example's captured update versus the same update untraced
//! (op helpers in place, no current session; `TracingAllocator` installed in
//! both), next to candle-graph 0.10.1's own TraceSession capturing it the way
//! its README shows (the measured region, the three phase spans, the logits'
//! stats, the loss, the gradient facts of a `GradientCapturePlan`), in one
//! run.
//!
//!     cargo bench --features candle --bench llama_overhead
//!
//! Ours records more: 93 op spans and ops, and the heap (`HeapCapture`).
//! Each round runs the three kinds once, the first rotating (the update after
//! a capture runs slower: caches); each capture in a fresh session, open and
//! finish not timed. `LLAMA_BENCH_SIZE` (test|small|15m, default small),
//! `LLAMA_BENCH_BATCH` (default 4) and `LLAMA_BENCH_ROUNDS` (default 9) change
//! the workload.
#[path = "../examples/common/llama.rs"]
mod llama;

use std::time::Instant;

use candle_graph::candle::GradientCapturePlan;
use candle_graph::{
    CaptureContract as CgContract, CoverageLevel, ExecutionStep, GradientFamilyContract,
    ProfileRun, SpanKind, TraceSession,
};
use candle_nn::Optimizer;
use candle_trace::heap::TracingAllocator;

#[global_allocator]
static HEAP: TracingAllocator = TracingAllocator::system();

const WARMUP: usize = 2;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same update captured with candle-graph's TraceSession.
fn cg_update(
    session: &TraceSession,
    plan: &GradientCapturePlan,
    s: &mut llama::Setup,
    x: &candle_core::Tensor,
    y: &candle_core::Tensor,
) {
    let _update = session.begin_measurement(llama::UPDATE);
    let loss = {
        let fwd =
            session.begin_step_span(llama::LABELS[0], ExecutionStep::Forward, SpanKind::Module);
        let logits = s.model.forward(x).unwrap();
        let loss = candle_nn::loss::cross_entropy(
            &logits.flatten_to(1).unwrap(),
            &y.flatten_to(1).unwrap(),
        )
        .unwrap();
        session
            .record_tensor_stats(fwd.id(), "logits", &logits)
            .unwrap();
        session
            .record_scalar(fwd.id(), "loss", loss.to_scalar::<f32>().unwrap() as f64)
            .unwrap();
        loss
    };
    let grads = {
        let _b = session.begin_step_span(
            llama::LABELS[1],
            ExecutionStep::Backward,
            SpanKind::Function,
        );
        loss.backward().unwrap()
    };
    plan.record(session, &grads).unwrap();
    let _o = session.begin_step_span(
        llama::LABELS[2],
        ExecutionStep::Optimizer,
        SpanKind::Function,
    );
    s.opt.step(&grads).unwrap();
}

struct Series(Vec<f64>);

impl Series {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }
    fn median(&self) -> f64 {
        let v = self.sorted();
        v[v.len() / 2]
    }
    fn min(&self) -> f64 {
        self.sorted()[0]
    }
    fn max(&self) -> f64 {
        *self.sorted().last().unwrap()
    }
}

/// What `TracingAllocator` adds to an allocation outside a capture: 4 KiB
/// alloc + free pairs through it and straight through `System` (the same
/// trait calls), interleaved, best of 7 batches each.
fn allocator_cost() {
    use std::alloc::{GlobalAlloc, Layout, System};
    const N: usize = 1_000_000;
    let layout = Layout::from_size_align(4096, 8).unwrap();
    let batch = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..N {
            f();
        }
        t.elapsed().as_nanos() as f64 / N as f64
    };
    let (mut ours, mut system) = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        // SAFETY (both): a non-zero layout, freed with the same layout.
        ours = ours.min(batch(&|| unsafe {
            HEAP.dealloc(std::hint::black_box(HEAP.alloc(layout)), layout)
        }));
        system = system.min(batch(&|| unsafe {
            System.dealloc(std::hint::black_box(System.alloc(layout)), layout)
        }));
    }
    println!("  4 KiB alloc + free outside a capture: {ours:.1} ns through TracingAllocator, {system:.1} ns through System ({:+.1} ns)", ours - system);
}

fn main() {
    let size = std::env::var("LLAMA_BENCH_SIZE").unwrap_or_else(|_| "small".into());
    let cfg = llama::Config::named(&size).expect("LLAMA_BENCH_SIZE: test, small or 15m");
    let batch: usize = env_or("LLAMA_BENCH_BATCH", 4);
    let rounds: usize = env_or("LLAMA_BENCH_ROUNDS", 9);
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ours_path, cg_path) = (dir.join("ours.jsonl"), dir.join("cg.jsonl"));

    let mut s = llama::setup(cfg, batch).unwrap();
    let vars: Vec<(String, candle_core::Var)> = s
        .varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let plan = GradientCapturePlan::from_named_vars(
        llama::ROOT,
        vars,
        |k| {
            if k.starts_with("lm_head.") {
                llama::HEAD_FAMILY.to_string()
            } else {
                llama::DETACHED_FAMILY.to_string()
            }
        },
        vec![
            GradientFamilyContract::active(llama::HEAD_FAMILY, 1),
            GradientFamilyContract::inactive(llama::DETACHED_FAMILY),
        ],
    )
    .unwrap();
    let cg_run = || {
        ProfileRun::training("llama2_c::train", llama::CAPTURE_STEP, "cpu").capture_contract(
            CgContract {
                gradients: CoverageLevel::Complete,
                gradient_contract: Some(plan.contract().clone()),
                ..CgContract::default()
            },
        )
    };
    for _ in 0..WARMUP {
        let (x, y) = llama::batch(&mut s).unwrap();
        llama::plain_update(&mut s, &x, &y).unwrap();
    }
    let (mut plain, mut ours, mut cg) =
        (Series(Vec::new()), Series(Vec::new()), Series(Vec::new()));
    let (mut ours_ratio, mut cg_ratio) = (Series(Vec::new()), Series(Vec::new()));
    let mut tracer_ms = Series(Vec::new());
    for round in 0..rounds {
        let mut t = [0f64; 3];
        for k in 0..3 {
            let (x, y) = llama::batch(&mut s).unwrap();
            let kind = (round + k) % 3;
            t[kind] = match kind {
                0 => {
                    let start = Instant::now();
                    llama::plain_update(&mut s, &x, &y).unwrap();
                    start.elapsed().as_secs_f64() * 1e3
                }
                1 => {
                    let session =
                        candle_trace::Session::open(&ours_path, llama::run_description(&s))
                            .unwrap();
                    let start = Instant::now();
                    llama::captured_update(&session, &mut s, &x, &y).unwrap();
                    let ms = start.elapsed().as_secs_f64() * 1e3;
                    tracer_ms.0.push(session.tracer_ns() as f64 / 1e6);
                    // The RmsNorm finding is notes only (the default contract).
                    assert_eq!(session.finish().unwrap().violations().count(), 0);
                    ms
                }
                _ => {
                    let session = TraceSession::open(&cg_path, cg_run()).unwrap();
                    let start = Instant::now();
                    cg_update(&session, &plan, &mut s, &x, &y);
                    let ms = start.elapsed().as_secs_f64() * 1e3;
                    session.finish().unwrap();
                    ms
                }
            };
        }
        plain.0.push(t[0]);
        ours.0.push(t[1]);
        cg.0.push(t[2]);
        ours_ratio.0.push(t[1] / t[0]);
        cg_ratio.0.push(t[2] / t[0]);
    }
    let c = &cfg;
    println!(
        "llama2-c-style update, size {size} (dim {} hidden {} layers {} heads {}/{} vocab {} seq {}), batch {batch}, CPU, {rounds} rounds after {WARMUP} warm-up updates, order rotating",
        c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len
    );
    println!(
        "  {:<34} {:>10} {:>10} {:>10} {:>14}",
        "", "median ms", "min ms", "max ms", "median ratio"
    );
    for (name, v) in [
        ("untraced", &plain),
        ("captured (candle-trace)", &ours),
        ("candle-graph TraceSession", &cg),
    ] {
        println!(
            "  {:<34} {:>10.1} {:>10.1} {:>10.1} {:>13.3}x",
            name,
            v.median(),
            v.min(),
            v.max(),
            v.median() / plain.median()
        );
    }
    println!("  per-round ratio to the untraced update of the same round (median, min..max):");
    for (name, r) in [
        ("captured (candle-trace)", &ours_ratio),
        ("candle-graph TraceSession", &cg_ratio),
    ] {
        println!(
            "  {:<34} {:>9.3}x  {:.3}..{:.3}",
            name,
            r.median(),
            r.min(),
            r.max()
        );
    }
    println!("  candle-trace's own time inside the captured update (left out of its spans): median {:.2} ms", tracer_ms.median());
    allocator_cost();
    let _ = std::fs::remove_dir_all(&dir);
}
