//! Cost of the train_mlp example's update in each mode versus the same update
//! untraced (wrappers in place, no current session): captured into a trace,
//! and kept as aggregate statistics (the update span, three phase spans and
//! the loss scalar, as `train_mlp --aggregate` does).
//!
//!     cargo bench --features candle --bench step_overhead
//!
//! Interleaves ROUNDS updates of each kind (each capture in a fresh session;
//! open and finish are not timed, the measured region is; one aggregate
//! session stays open for the whole run).
#[path = "../examples/common/mlp.rs"]
mod mlp;

use std::time::Instant;

const WARMUP: usize = 20;
const ROUNDS: usize = 600;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("step.jsonl");
    let agg = candle_trace::Session::open(
        dir.join("stats.json"),
        candle_trace::Run::training("bench", 1, "cpu").aggregate(None),
    )
    .unwrap();
    let mut s = mlp::setup().unwrap();
    for _ in 0..WARMUP {
        let (x, y) = mlp::batch(&mut s).unwrap();
        mlp::plain_update(&mut s, &x, &y).unwrap();
    }
    let (mut plain, mut captured, mut aggregated) = (Vec::new(), Vec::new(), Vec::new());
    // The update after a capture runs slower (caches), so the three kinds
    // take turns being first.
    for round in 0..ROUNDS {
        for k in 0..3 {
            let (x, y) = mlp::batch(&mut s).unwrap();
            match (round + k) % 3 {
                0 => {
                    let t = Instant::now();
                    mlp::plain_update(&mut s, &x, &y).unwrap();
                    plain.push(t.elapsed().as_nanos() as f64);
                }
                1 => {
                    let t = Instant::now();
                    {
                        let _u = agg
                            .try_span(
                                mlp::AGG_STEP,
                                candle_trace::SpanKind::Function,
                                candle_trace::Step::None,
                            )
                            .unwrap();
                        let loss = mlp::aggregated_update(&agg, &mut s, &x, &y).unwrap();
                        agg.scalar(candle_trace::SpanId::ROOT, "loss", loss as f64)
                            .unwrap();
                    }
                    aggregated.push(t.elapsed().as_nanos() as f64);
                }
                _ => {
                    let session =
                        candle_trace::Session::open(&trace, mlp::run_description(&s)).unwrap();
                    let t = Instant::now();
                    mlp::captured_update(&session, &mut s, &x, &y).unwrap();
                    captured.push(t.elapsed().as_nanos() as f64);
                    session.finish().unwrap();
                }
            }
        }
    }
    // The same calls with no update inside: what aggregate statistics add to
    // each update, below the noise of the update itself.
    let calls = {
        const N: usize = 100_000;
        use candle_trace::{SpanId, SpanKind, Step};
        let t = Instant::now();
        for _ in 0..N {
            let _u = agg
                .try_span(mlp::AGG_STEP, SpanKind::Function, Step::None)
                .unwrap();
            drop(
                agg.try_span(mlp::AGG_DATA, SpanKind::Function, Step::None)
                    .unwrap(),
            );
            drop(
                agg.try_span(mlp::LABELS[0], SpanKind::Module, Step::Forward)
                    .unwrap(),
            );
            drop(
                agg.try_span(mlp::LABELS[1], SpanKind::Function, Step::Backward)
                    .unwrap(),
            );
            drop(
                agg.try_span(mlp::LABELS[2], SpanKind::Function, Step::Optimizer)
                    .unwrap(),
            );
            agg.scalar(SpanId::ROOT, "loss", 0.5).unwrap();
        }
        t.elapsed().as_nanos() as f64 / N as f64
    };
    agg.finish().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (p, c, a) = (median(plain), median(captured), median(aggregated));
    println!(
        "updates per configuration: {ROUNDS} (+{WARMUP} warm-up), MLP 64-64-10, batch 32, f32, cpu"
    );
    println!("untraced_update_us   median {:9.1}", p / 1e3);
    println!("captured_update_us   median {:9.1}", c / 1e3);
    println!("aggregated_update_us median {:9.1}", a / 1e3);
    println!(
        "captured / untraced: {:.2}x (+{:.1} us)",
        c / p,
        (c - p) / 1e3
    );
    println!(
        "aggregated / untraced: {:.3}x (+{:.2} us)",
        a / p,
        (a - p) / 1e3
    );
    println!("aggregate calls alone per update (5 spans + 1 scalar): {:.2} us = {:.2}% of the untraced update", calls / 1e3, calls / p * 100.0);
}
