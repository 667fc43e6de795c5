//! Slowdown of the train_mlp example's captured update versus the same update
//! untraced (wrappers in place, no current session).
//!
//!     cargo bench --features candle --bench step_overhead
//!
//! Interleaves ROUNDS untraced updates and captured updates (each captured in
//! a fresh session; open and finish are not timed, the measured region is).
#[path = "../examples/common/mlp.rs"]
mod mlp;

use std::time::Instant;

const WARMUP: usize = 20;
const ROUNDS: usize = 200;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("step.jsonl");
    let mut s = mlp::setup().unwrap();
    for _ in 0..WARMUP {
        let (x, y) = mlp::batch(&mut s).unwrap();
        mlp::plain_update(&mut s, &x, &y).unwrap();
    }
    let (mut plain, mut captured) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (x, y) = mlp::batch(&mut s).unwrap();
        let t = Instant::now();
        mlp::plain_update(&mut s, &x, &y).unwrap();
        plain.push(t.elapsed().as_nanos() as f64);

        let (x, y) = mlp::batch(&mut s).unwrap();
        let session = candle_trace::Session::open(&trace, mlp::run_description(&s)).unwrap();
        let t = Instant::now();
        mlp::captured_update(&session, &mut s, &x, &y).unwrap();
        captured.push(t.elapsed().as_nanos() as f64);
        session.finish().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (p, c) = (median(plain), median(captured));
    println!("updates per configuration: {ROUNDS} (+{WARMUP} warm-up), MLP 64-64-10, batch 32, f32, cpu");
    println!("untraced_update_us  median {:9.1}", p / 1e3);
    println!("captured_update_us  median {:9.1}", c / 1e3);
    println!("captured / untraced: {:.2}x", c / p);
}
