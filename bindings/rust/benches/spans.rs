//! SpanGuard enter+drop cost, and the same loop under `tracing` +
//! `tracing-chrome` (and under tracing + this crate's TraceLayer), in one run.
//!
//!     cargo bench --features tracing --bench spans
//!
//! Each configuration runs SAMPLES batches of BATCH spans after a warm-up;
//! the figure is the median over batches of (batch time / BATCH).
use std::hint::black_box;
use std::time::Instant;

use candle_trace::layer::TraceLayer;
use candle_trace::{Run, Session};
use tracing_subscriber::prelude::*;

const BATCH: usize = 100;
const SAMPLES: usize = 1000;
const WARMUP: usize = 10_000;

fn median_ns(mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..WARMUP {
        f();
    }
    let mut per = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t = Instant::now();
        for _ in 0..BATCH {
            f();
        }
        per.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (per[SAMPLES / 2], per[SAMPLES * 9 / 10])
}

fn main() {
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let session = Session::open(
        dir.join("spans.jsonl"),
        Run::inference("bench::spans", 1, "cpu").measured_root(),
    )
    .unwrap();
    let (guard_med, guard_p90) = median_ns(|| {
        let g = session.span("bench");
        black_box(&g);
    });

    let (chrome, flush) = tracing_chrome::ChromeLayerBuilder::new()
        .file(dir.join("chrome.json"))
        .build();
    let chrome_sub = tracing_subscriber::registry().with(chrome);
    let (chrome_med, chrome_p90) = tracing::subscriber::with_default(chrome_sub, || {
        median_ns(|| {
            let g = tracing::info_span!("bench").entered();
            black_box(&g);
        })
    });
    drop(flush);

    let layer_sub = tracing_subscriber::registry().with(TraceLayer::for_session(&session));
    let (layer_med, layer_p90) = tracing::subscriber::with_default(layer_sub, || {
        median_ns(|| {
            let g = tracing::info_span!("bench").entered();
            black_box(&g);
        })
    });
    session.finish().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "spans per configuration: {} (+{} warm-up), batches of {}",
        SAMPLES * BATCH,
        WARMUP,
        BATCH
    );
    println!("span_guard_enter_drop_ns          median {guard_med:8.1}  p90 {guard_p90:8.1}");
    println!("tracing_chrome_span_enter_exit_ns median {chrome_med:8.1}  p90 {chrome_p90:8.1}");
    println!("tracing_trace_layer_enter_exit_ns median {layer_med:8.1}  p90 {layer_p90:8.1}");
    println!(
        "ratio tracing_chrome / span_guard: {:.2}",
        chrome_med / guard_med
    );
    println!(
        "ratio trace_layer / span_guard:    {:.2}",
        layer_med / guard_med
    );
}
