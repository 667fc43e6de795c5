//! The train_llama example at its test size, the op helpers and the heap
//! capture, against the real library, judged by candle-graph. This binary
//! installs `TracingAllocator`; the heap log is process-wide, so its tests
//! take turns (one lock).
#![cfg(feature = "candle")]
mod common;

#[path = "../examples/common/llama.rs"]
mod llama;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use candle_core::{Device, Tensor};
use candle_trace::candle::{phase, trace_op, TraceOps};
use candle_trace::heap::{self, HeapCapture, TracingAllocator};
use candle_trace::{Run, Session, Severity, Status, Step};
use common::*;
use serde_json::Value;

#[global_allocator]
static HEAP: TracingAllocator = TracingAllocator::system();

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Replays the trace's memory records in file order: the peak of live bytes
/// and the live bytes at the end.
fn replay(l: &[Value]) -> (u64, u64) {
    let (mut live, mut peak) = (0u64, 0u64);
    for m in of_kind(l, "memory") {
        if m["action"] == "alloc" {
            live += u(&m["bytes"]);
            peak = peak.max(live);
        } else {
            live -= u(&m["bytes"]);
        }
    }
    (peak, live)
}

#[test]
fn example_trace_has_ops_memory_and_the_rms_norm_finding() {
    let _t = turn();
    let cfg = llama::Config::test();
    let batch = 2;
    let dir = fresh_dir("llama");
    let llama::Trained {
        path,
        heap,
        findings,
        losses,
    } = llama::train(&dir.path().join("train_llama.jsonl"), cfg, batch, 3).unwrap();
    assert_eq!(losses.len(), 3);
    assert!(
        losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{losses:?}"
    );
    let summary = assert_valid_complete(&path);
    let issues = summary["health"]["issues"].as_array().unwrap();
    assert!(
        issues.iter().all(|i| i["severity"] != "error"),
        "{issues:?}"
    );
    let l = lines(&path);

    // Ops: 15 per block, the embedding, the final norm and the head, each
    // in its own op span inside the forward.
    let ops = of_kind(&l, "op");
    assert_eq!(
        ops.len(),
        15 * cfg.n_layers + 3,
        "{:?}",
        ops.iter().map(|o| &o["op_name"]).collect::<Vec<_>>()
    );
    let spans: HashMap<&str, &Value> = of_kind(&l, "span_start")
        .into_iter()
        .map(|s| (s["id"].as_str().unwrap(), s))
        .collect();
    let fwd = span_named(&l, llama::LABELS[0]);
    for op in &ops {
        let span = spans[op["span_id"].as_str().unwrap()];
        assert_eq!(span["name"], op["op_name"]);
        assert_eq!(span["span_kind"], "op");
        assert_eq!(
            span["parent_id"], fwd["id"],
            "op spans are children of the forward: {span}"
        );
    }
    let q = ops
        .iter()
        .find(|o| o["op_name"] == "model.layers.1.self_attn.q_proj")
        .expect("q_proj of block 1");
    let (seq, dim) = (cfg.seq_len as u64, cfg.dim as u64);
    assert_eq!(q["shape"], serde_json::json!([batch, seq, dim]));
    assert_eq!(q["dtype"], "f32");
    assert_eq!(u(&q["output_dense_bytes"]), batch as u64 * seq * dim * 4);
    assert_eq!(u(&q["input_dense_bytes"]), batch as u64 * seq * dim * 4);
    assert!(u(&q["duration_ns"]) > 0);
    let scores = ops
        .iter()
        .find(|o| o["op_name"] == "model.layers.0.self_attn.scores")
        .unwrap();
    assert_eq!(
        scores["shape"],
        serde_json::json!([batch, cfg.n_heads, seq, seq])
    );
    assert_eq!(scores["inputs"].as_array().unwrap().len(), 2);
    let head = ops.iter().find(|o| o["op_name"] == "lm_head").unwrap();
    assert_eq!(
        head["shape"],
        serde_json::json!([batch, seq, cfg.vocab_size])
    );

    // Memory: what the capture says it wrote is in the trace, with the peak
    // it reported; the logits alone are one allocation of their size.
    let mem = of_kind(&l, "memory");
    let allocs = mem.iter().filter(|m| m["action"] == "alloc").count() as u64;
    assert_eq!(
        (allocs, mem.len() as u64 - allocs),
        (heap.allocations, heap.frees)
    );
    assert_eq!((heap.dropped, heap.refused), (0, 0));
    let (peak, retained) = replay(&l);
    assert_eq!((peak, retained), (heap.peak_bytes, heap.retained_bytes));
    let logits_bytes = batch as u64 * seq * cfg.vocab_size as u64 * 4;
    assert!(mem.iter().any(|m| m["action"] == "alloc"
        && u(&m["bytes"]) == logits_bytes
        && m["op_name"] == "lm_head"
        && m["category"] == "activation"));
    assert!(heap.peak_bytes >= logits_bytes, "{heap:?}");
    let by_category: BTreeMap<&str, usize> = mem.iter().fold(BTreeMap::new(), |mut m, e| {
        *m.entry(e["category"].as_str().unwrap()).or_default() += 1;
        m
    });
    for c in ["activation", "gradient", "optimizer"] {
        assert!(
            by_category.get(c).copied().unwrap_or(0) > 0,
            "no {c} memory: {by_category:?}"
        );
    }
    let bwd = span_named(&l, llama::LABELS[1]);
    assert!(mem
        .iter()
        .any(|m| m["span_id"] == bwd["id"] && m["category"] == "gradient"));

    // The finding: only the head gets a gradient.
    for g in of_kind(&l, "gradient") {
        let want = if g["key"] == "lm_head.weight" {
            "present"
        } else {
            "missing"
        };
        assert_eq!(g["state"], want, "{g}");
    }
    assert_eq!(of_kind(&l, "gradient").len(), 2 + 9 * cfg.n_layers + 1);
    // ... and finish() said so under the default contract: no violation, and
    // a note for each family without a gradient, naming exactly the
    // parameters that got none.
    assert!(
        findings.iter().all(|f| f.severity == Severity::Note),
        "{findings:?}"
    );
    let mut noted: Vec<&str> = findings
        .iter()
        .filter(|f| f.check == "gradient_family_without_gradient")
        .flat_map(|f| f.parameters.iter().map(|p| p.key.as_str()))
        .collect();
    noted.sort_unstable();
    let mut missing: Vec<&str> = of_kind(&l, "gradient")
        .into_iter()
        .filter(|g| g["state"] == "missing")
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    missing.sort_unstable();
    assert_eq!(noted, missing);

    // The tracer's work is stated on the measured span's end.
    let update = span_named(&l, llama::UPDATE);
    let end = l
        .iter()
        .find(|e| e["kind"] == "span_end" && e["id"] == update["id"])
        .unwrap();
    assert!(u(&end["tracer_ns"]) > 0, "{end}");
}

#[test]
fn heap_capture_pairs_frees_with_allocations_and_names_ops() {
    let _t = turn();
    let earlier = vec![1u8; 1 << 16];
    let dir = fresh_dir("heap");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, Run::training("rust::heap", 1, "cpu")).unwrap();
    let summary = {
        let update = session.measure("update").unwrap();
        let capture = HeapCapture::start(&session, &update).unwrap();
        let again = HeapCapture::start(&session, &update).unwrap_err();
        assert_eq!(again.status(), Some(Status::State));
        assert!(
            again.message().contains("another capture is open"),
            "{}",
            again.message()
        );
        let x = Tensor::ones((64, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
        {
            let _f = phase(&session, "forward", Step::Forward).unwrap();
            let y = x.traced_matmul("mm", &x).unwrap();
            let z = trace_op("double", &[&y], || &y + &y).unwrap();
            drop((y, z));
            drop(earlier);
            // Below the threshold: not logged.
            let small = vec![0u8; heap::DEFAULT_MIN_BYTES - 1];
            drop(small);
        }
        drop(x);
        capture.finish().unwrap()
    };
    session.finish().unwrap();
    assert_valid_complete(&path);
    let l = lines(&path);
    let mem = of_kind(&l, "memory");
    let spans: HashMap<&str, &str> = of_kind(&l, "span_start")
        .into_iter()
        .map(|s| (s["id"].as_str().unwrap(), s["name"].as_str().unwrap()))
        .collect();
    // The two op outputs (64x64 f32, 16 KiB each): allocated in their op's
    // span, named after it, freed in the forward.
    for op in ["mm", "double"] {
        // (A matmul may allocate packing buffers of its own too.)
        let a: Vec<_> = mem
            .iter()
            .filter(|m| {
                m["action"] == "alloc" && m["op_name"] == op && u(&m["bytes"]) == 64 * 64 * 4
            })
            .collect();
        assert_eq!(a.len(), 1, "{op}: {a:?}");
        assert_eq!(spans[a[0]["span_id"].as_str().unwrap()], op);
        assert_eq!(a[0]["category"], "activation");
        let f: Vec<_> = mem
            .iter()
            .filter(|m| m["action"] == "free" && m["storage_id"] == a[0]["storage_id"])
            .collect();
        assert_eq!(f.len(), 1);
        assert_eq!(spans[f[0]["span_id"].as_str().unwrap()], "forward");
    }
    assert!(summary.frees_of_earlier >= 1, "{summary:?}");
    assert!(mem
        .iter()
        .all(|m| u(&m["bytes"]) >= heap::DEFAULT_MIN_BYTES as u64));
    // Memory may stay live past the capture (2 MiB when this was written:
    // scratch a kernel or the thread pool keeps), never the op
    // outputs checked above; the summary agrees with the records.
    assert_eq!((summary.peak_bytes, summary.retained_bytes), replay(&l));
    assert!(summary.peak_bytes >= 2 * 64 * 64 * 4, "{summary:?}");
}

#[test]
fn ops_are_plain_without_a_session() {
    let _t = turn();
    let x = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
    let y = x.traced_matmul("mm", &x).unwrap();
    assert_eq!(
        y.to_vec2::<f32>().unwrap(),
        vec![vec![7.0, 10.0], vec![15.0, 22.0]]
    );
    assert!(!heap::capturing());
}
