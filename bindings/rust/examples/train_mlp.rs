//! Trains a candle-nn MLP (64-64-10, batch 32, f32, SGD lr 0.1) on synthetic
//! data and captures update 3 as a candle-graph/trace/10 trace.
//!
//!     cargo run --example train_mlp --features candle -- traces/train_mlp.jsonl
//!     candle-graph summary traces/train_mlp.jsonl --require-valid
#[path = "common/mlp.rs"]
mod mlp;

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "traces/train_mlp.jsonl".into());
    match mlp::train(std::path::Path::new(&out), 5) {
        Ok((path, losses)) => {
            for (i, l) in losses.iter().enumerate() {
                println!("update {}: loss {l:.6}{}", i + 1, if i + 1 == mlp::CAPTURE_STEP as usize { "  (captured)" } else { "" });
            }
            println!("wrote {}", path.display());
        }
        Err(e) => {
            eprintln!("train_mlp: {e}");
            std::process::exit(1);
        }
    }
}
