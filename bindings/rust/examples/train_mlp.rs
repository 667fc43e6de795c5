//! Trains a candle-nn MLP (64-64-10, batch 32, f32, SGD lr 0.1) on synthetic
//! data and captures update 3 as a candle-graph/trace/10 trace.
//!
//!     cargo run --example train_mlp --features candle -- traces/train_mlp.jsonl
//!     candle-graph summary traces/train_mlp.jsonl --require-valid
//!
//! With `--aggregate SUMMARY.json` an aggregate session also keeps
//! candle-trace/aggregate/1 statistics of every update in constant memory:
//!
//!     cargo run --example train_mlp --features candle -- OUT.jsonl --steps 10000 --aggregate SUMMARY.json
//!     candle-trace report SUMMARY.json
#[path = "common/mlp.rs"]
mod mlp;

use std::path::Path;

fn usage() -> ! {
    eprintln!("usage: train_mlp [OUT.jsonl] [--steps N] [--aggregate SUMMARY.json] [--aggregate-interval-ms MS]");
    std::process::exit(2);
}

fn main() {
    let (mut out, mut steps, mut summary, mut interval) = (None, 5u64, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--steps" => steps = val().parse().unwrap_or_else(|_| usage()),
            "--aggregate" => summary = Some(val()),
            "--aggregate-interval-ms" => interval = Some(val().parse().unwrap_or_else(|_| usage())),
            _ if a.starts_with("--") || out.is_some() => usage(),
            _ => out = Some(a),
        }
    }
    let out = out.unwrap_or_else(|| "traces/train_mlp.jsonl".into());
    if steps < mlp::CAPTURE_STEP {
        eprintln!("train_mlp: --steps must be at least {}", mlp::CAPTURE_STEP);
        std::process::exit(2);
    }
    let t0 = std::time::Instant::now();
    let result = match &summary {
        None => mlp::train(Path::new(&out), steps).map(|(p, l)| (p, None, l)),
        Some(sum) => mlp::train_aggregate(Path::new(&out), Path::new(sum), interval, steps)
            .map(|(p, s, l)| (p, Some(s), l)),
    };
    match result {
        Ok((path, summary, losses)) => {
            let n = losses.len();
            for (i, l) in losses.iter().enumerate() {
                if n <= 20 || i + 1 == mlp::CAPTURE_STEP as usize || i + 1 == n {
                    println!(
                        "update {}: loss {l:.6}{}",
                        i + 1,
                        if i + 1 == mlp::CAPTURE_STEP as usize {
                            "  (captured)"
                        } else {
                            ""
                        }
                    );
                }
            }
            println!("wrote {}", path.display());
            if let Some(s) = summary {
                let wall = t0.elapsed().as_secs_f64();
                println!("wrote {} (aggregate statistics of all {n} updates, {wall:.2} s, {:.1} us per update)", s.display(), wall / n as f64 * 1e6);
                println!("report: candle-trace report {}", s.display());
            }
        }
        Err(e) => {
            eprintln!("train_mlp: {e}");
            std::process::exit(1);
        }
    }
}
