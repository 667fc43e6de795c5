//! Trains a llama2-c-style model (candle's llama2-c training example in
//! shape: RmsNorm, attention with RoPE, SwiGLU MLP, AdamW, cross-entropy on
//! synthetic tokens) and captures update 3 with its ops and heap memory.
//!
//!     cargo run --release --example train_llama --features candle -- traces/train_llama.jsonl
//!     candle-graph summary traces/train_llama.jsonl --require-valid
//!     candle-trace report traces/train_llama.jsonl
//!
//! `--size test|small|15m` picks the model (default small; 15m is llama2-c's
//! `Config::tiny_15m`), `--batch N` the batch (default 4), `--steps N` the
//! updates (default 4).
#[path = "common/llama.rs"]
mod llama;

use std::path::Path;

use candle_trace::heap::TracingAllocator;

// The heap capture's source: one relaxed load per allocation outside it.
#[global_allocator]
static HEAP: TracingAllocator = TracingAllocator::system();

fn usage() -> ! {
    eprintln!("usage: train_llama [OUT.jsonl] [--size test|small|15m] [--batch N] [--steps N]");
    std::process::exit(2);
}

fn main() {
    let (mut out, mut cfg, mut batch, mut steps) = (None, llama::Config::small(), 4usize, 4u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--size" => cfg = llama::Config::named(&val()).unwrap_or_else(|| usage()),
            "--batch" => batch = val().parse().unwrap_or_else(|_| usage()),
            "--steps" => steps = val().parse().unwrap_or_else(|_| usage()),
            _ if a.starts_with("--") || out.is_some() => usage(),
            _ => out = Some(a),
        }
    }
    if steps < llama::CAPTURE_STEP || batch == 0 {
        eprintln!(
            "train_llama: --steps must be at least {} and --batch at least 1",
            llama::CAPTURE_STEP
        );
        std::process::exit(2);
    }
    let out = out.unwrap_or_else(|| "traces/train_llama.jsonl".into());
    match llama::train(Path::new(&out), cfg, batch, steps) {
        Ok(llama::Trained {
            path,
            heap,
            findings,
            losses,
        }) => {
            for (i, l) in losses.iter().enumerate() {
                let mark = if i as u64 + 1 == llama::CAPTURE_STEP {
                    "  (captured)"
                } else {
                    ""
                };
                println!("update {}: loss {l:.6}{mark}", i + 1);
            }
            println!(
                "heap during the capture: {} allocations, {} frees, peak {:.2} MiB, {:.2} MiB retained",
                heap.allocations,
                heap.frees,
                heap.peak_bytes as f64 / (1 << 20) as f64,
                heap.retained_bytes as f64 / (1 << 20) as f64
            );
            // Violations in full; the notes (one per family without a
            // gradient: 56 here) counted, with the first as an example.
            let notes: Vec<_> = findings
                .iter()
                .filter(|f| f.severity == candle_trace::Severity::Note)
                .collect();
            for f in findings
                .iter()
                .filter(|f| f.severity != candle_trace::Severity::Note)
            {
                println!("finish: {f}");
            }
            if let Some(first) = notes.first() {
                println!("finish: {} notes, the first: {first}", notes.len());
            }
            println!("wrote {}", path.display());
        }
        Err(e) => {
            eprintln!("train_llama: {e}");
            std::process::exit(1);
        }
    }
}
