//! The safe API against the real library, judged by candle-graph.
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_trace::*;
use common::*;
use serde_json::Value;

fn small_run() -> Run {
    Run::training("rust::test", 3, "cpu").tag("test", "session")
}

#[test]
fn every_record_kind_gives_a_valid_complete_trace() {
    let dir = fresh_dir("records");
    let path = dir.path().join("t.jsonl");
    let contract = GradientContract::new()
        .expect("vb", "fc.weight", "fc")
        .expect("vb", "fc.bias", "fc")
        .with_default_families();
    let run = small_run()
        .capture_contract(
            CaptureContract::new()
                .measurement_scope(MeasurementScope::ProfiledWork)
                .operations(Level::Partial)
                .tensors(Level::Partial)
                .logical_memory(Level::Partial)
                .physical_memory(Level::Partial)
                .device_timing(Level::Partial)
                .gradient_contract(contract)
                .required_labels(["train/forward"]),
        )
        .comparison_identity(ComparisonIdentity {
            workload_id: "w".into(),
            model_id: "m".into(),
            config_id: "c".into(),
            data_id: "d".into(),
            seed_policy: "fixed-0".into(),
            precision: "f32".into(),
            device_state: "cpu".into(),
            physical_batch: 4,
            accumulation_steps: 1,
            implementation_id: Some("candle".into()),
            pair_id: None,
        });
    let session = Session::open(&path, run).unwrap();
    {
        let update = session.measure("train/update").unwrap();
        let fwd = session.span_with("train/forward", SpanKind::Module, Step::Forward);
        let t0 = session.now_ns();
        session
            .op(
                &fwd,
                &Op {
                    name: "matmul",
                    dtype: "f32",
                    device: "cpu",
                    inputs: &["x", "w"],
                    output: Some("y"),
                    shape: &[4, 8],
                    duration_ns: 1,
                    timestamp_ns: t0,
                    input_dense_bytes: 64,
                    ..Default::default()
                },
            )
            .unwrap();
        session
            .tensor(
                &fwd,
                &TensorMeta {
                    tensor_id: "y",
                    dtype: "f32",
                    device: "cpu",
                    label: Some("y"),
                    shape: &[4, 8],
                    category: Category::Activation,
                    ..Default::default()
                },
            )
            .unwrap();
        session.data_edge("x", "y").unwrap();
        session
            .tensor_stats(
                &fwd,
                &TensorStats {
                    label: "y/stats",
                    dtype: "f32",
                    shape: &[4, 8],
                    rms: 1.0,
                    abs_max: 2.0,
                    mean: 0.5,
                    non_finite: 0,
                },
            )
            .unwrap();
        let data: Vec<f32> = (0..32).map(|i| i as f32).collect();
        session
            .tensor_stats_f32(&fwd, "y/f32", &data, &[4, 8])
            .unwrap();
        session.scalar(&fwd, "loss", 0.25).unwrap();
        let mem = Memory {
            storage_id: "st-y",
            tensor_id: "y",
            device: "cpu",
            dtype: "f32",
            bytes: 128,
            shape: &[4, 8],
            category: Category::Activation,
            ..Default::default()
        };
        session.memory(&fwd, MemoryAction::Alloc, &mem).unwrap();
        session.memory(&fwd, MemoryAction::Free, &mem).unwrap();
        session
            .device_memory(&DeviceMemory {
                device: "cpu",
                used_bytes: Some(1 << 20),
                ..Default::default()
            })
            .unwrap();
        session
            .device_interval(
                &fwd,
                &DeviceInterval {
                    device: "cpu",
                    stream_id: "0",
                    backend: "host",
                    name: Some("k"),
                    start_ns: t0,
                    duration_ns: 5,
                    correlation_id: Some(7),
                    ..Default::default()
                },
            )
            .unwrap();
        let fwd_id = fwd.id();
        drop(fwd);
        session.call_edge(&update, fwd_id, None).unwrap();
        session
            .gradient("vb", "fc.weight", Gradient::Present(0.5))
            .unwrap();
        session
            .gradient("vb", "fc.bias", Gradient::from_norm(0.0))
            .unwrap();
        let now = session.now_ns();
        session
            .completed_span("loader", SpanKind::Function, now / 2, 1)
            .unwrap();
        drop(update);
    }
    let written = session.finish().unwrap();
    assert_eq!(written, path);
    let summary = assert_valid_complete(&path);
    let l = lines(&path);
    assert_eq!(l[0]["comparison_identity"]["implementation_id"], "candle");
    assert_eq!(l[0]["tags"]["test"], "session");
    assert_eq!(
        l[0]["producer"]["binding"], "rust",
        "the trace names the binding that wrote it"
    );
    assert_eq!(of_kind(&l, "gradient").len(), 2);
    assert_eq!(span_named(&l, "train/update")["measured"], true);
    assert_eq!(span_named(&l, "train/forward")["step"], "forward");
    assert_eq!(l.last().unwrap()["outcome"], "complete");
    let _ = summary;
}

#[test]
fn guards_nest_and_end_in_reverse_order() {
    let dir = fresh_dir("nest");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    {
        let _m = session.measure("update").unwrap();
        let a = session.span("a");
        {
            let b = session.step_span("b", Step::Backward);
            let _c = session.span_kind("c", SpanKind::Op);
            assert_ne!(a.id(), b.id());
        }
    }
    session.finish().unwrap();
    assert_valid_complete(&path);
    let l = lines(&path);
    let (m, a, b, c) = (
        span_named(&l, "update"),
        span_named(&l, "a"),
        span_named(&l, "b"),
        span_named(&l, "c"),
    );
    assert_eq!(a["parent_id"], m["id"]);
    assert_eq!(b["parent_id"], a["id"]);
    assert_eq!(c["parent_id"], b["id"]);
    assert_eq!(c["span_kind"], "op");
}

#[test]
fn panic_inside_a_span_leaves_a_valid_failed_trace() {
    let dir = fresh_dir("panic");
    let path = dir.path().join("t.jsonl");
    let p = path.clone();
    let result = catch_unwind(AssertUnwindSafe(move || {
        let session = Session::open(&p, small_run()).unwrap();
        let _m = session.measure("update").unwrap();
        let _s = session.span("forward");
        panic!("boom in forward");
    }));
    assert!(result.is_err());
    let l = lines(&path);
    let terminal = l.last().unwrap();
    assert_eq!(terminal["kind"], "terminal");
    assert_eq!(terminal["outcome"], "failed");
    let reason = terminal["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("session dropped while panicking: boom in forward"),
        "{reason}"
    );
    // The guards ended their spans while unwinding: only the root stays open.
    let ends: Vec<&Value> = of_kind(&l, "span_end");
    assert_eq!(ends.len(), 2, "forward and update closed: {ends:?}");
    let (_, summary, stderr) = common::summary(&path, false);
    assert_eq!(
        summary["health"]["structurally_valid"], true,
        "{stderr} {}",
        summary["health"]
    );
    assert_eq!(summary["health"]["capture_complete"], false);
}

#[test]
fn dropping_an_unfinished_session_fails_the_trace() {
    let dir = fresh_dir("drop");
    let path = dir.path().join("t.jsonl");
    drop(Session::open(&path, small_run()).unwrap());
    let l = lines(&path);
    assert_eq!(l.last().unwrap()["outcome"], "failed");
    assert_eq!(
        l.last().unwrap()["reason"],
        "session dropped without finish"
    );
    let (_, summary, _) = common::summary(&path, false);
    assert_eq!(summary["health"]["structurally_valid"], true);
}

#[test]
fn finish_failed_writes_the_reason() {
    let dir = fresh_dir("failed");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    session.finish_failed("ran out of batches").unwrap();
    assert_eq!(lines(&path).last().unwrap()["reason"], "ran out of batches");
}

#[test]
fn bad_run_json_returns_the_library_message_and_status() {
    let dir = fresh_dir("badrun");
    let path = dir.path().join("t.jsonl");
    let err = Session::open(&path, Run::training("e", 3, "cpu").warmup_steps(3)).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert_eq!(
        err.message(),
        r#"ct_open: run JSON: "warmup_steps" (3) must be less than "capture_step" (3)"#
    );
    assert!(!path.exists(), "nothing is created for bad provenance");

    let err = Session::open(&path, Run::training("e", 0, "cpu")).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(
        err.message().starts_with("ct_open: run JSON: "),
        "{}",
        err.message()
    );

    let err = Session::open_json(
        &path,
        r#"{"entrypoint":"e","phase":"train","capture_step":3,"device":"cpu","runid":"x"}"#,
        false,
    )
    .unwrap_err();
    assert!(
        err.message()
            .starts_with(r#"ct_open: run JSON: unknown key "runid""#),
        "{}",
        err.message()
    );
    assert!(err.to_string().contains("CT_ERR_INVALID_ARGUMENT"), "{err}");
}

#[test]
fn bad_records_return_err_and_write_nothing() {
    let dir = fresh_dir("badrec");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    {
        let m = session.measure("update").unwrap();
        // Library refusals carry ct_last_error().
        let err = session
            .tensor_stats(
                &m,
                &TensorStats {
                    label: " ",
                    dtype: "f32",
                    shape: &[2],
                    rms: 1.0,
                    abs_max: 1.0,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        assert!(
            !err.message().is_empty() && !err.message().starts_with("candle-trace:"),
            "{}",
            err.message()
        );
        let err = session
            .gradient("vb", "k", Gradient::Present(-1.0))
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        let err = session
            .op(
                SpanId(999_999),
                &Op {
                    name: "x",
                    dtype: "f32",
                    device: "cpu",
                    shape: &[1],
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidHandle));
        let err = session.data_edge("nope", "nada").unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        // A second measured region is a state error.
        let err = session.measure("again").err().unwrap();
        assert_eq!(err.status(), Some(Status::State));
        // Refused by the binding before the call: the library could not see these.
        let err = session
            .tensor_stats_f32(&m, "short", &[1.0, 2.0], &[3])
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        assert!(err.message().starts_with("candle-trace:"));
        let err = session
            .try_span("nul\0name", SpanKind::Function, Step::None)
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
    }
    // None of the refused calls wrote anything; the trace is still complete.
    session.finish().unwrap();
    assert_valid_complete(&path);
}

#[test]
fn finish_refusal_is_an_error_and_the_trace_ends_failed() {
    let dir = fresh_dir("refuse");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    let err = session.finish().unwrap_err(); // no measured region
    assert_eq!(err.status(), Some(Status::State));
    let l = lines(&path);
    assert_eq!(l.last().unwrap()["outcome"], "failed");
    assert!(l.last().unwrap()["reason"]
        .as_str()
        .unwrap()
        .starts_with("ct_finish refused: "));
}

#[test]
fn deferred_span_errors_surface_at_finish() {
    let dir = fresh_dir("deferred");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    {
        let _m = session.measure("update").unwrap();
        let g = session.span("bad\0name"); // inert guard, error deferred
        assert_eq!(g.id(), SpanId(0));
    }
    assert_eq!(session.deferred_errors().len(), 1);
    let err = session.finish().unwrap_err();
    assert!(matches!(err, Error::Deferred { count: 1, .. }), "{err}");
    assert_eq!(lines(&path).last().unwrap()["outcome"], "failed");
}

#[test]
fn session_ref_records_from_other_threads() {
    let dir = fresh_dir("threads");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    {
        let _m = session.measure("update").unwrap();
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let s = session.handle();
                std::thread::spawn(move || {
                    let g = s.span(&format!("worker-{i}"));
                    s.scalar(&g, &format!("w{i}"), i as f64).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    session.finish().unwrap();
    assert_valid_complete(&path);
    let l = lines(&path);
    for i in 0..4 {
        assert_eq!(
            span_named(&l, &format!("worker-{i}"))["parent_id"],
            "s1",
            "other threads nest under the root"
        );
    }
}

#[test]
fn measured_root_and_current_session() {
    let dir = fresh_dir("root");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(
        &path,
        Run::inference("rust::infer", 1, "cpu").measured_root(),
    )
    .unwrap();
    assert!(current().is_none());
    {
        let _a = session.activate();
        assert_eq!(current().unwrap().raw(), session.raw());
        let _s = session.span("forward");
    }
    assert!(current().is_none());
    session.finish().unwrap();
    let summary = assert_valid_complete(&path);
    let _ = summary;
    assert_eq!(lines(&path)[1]["measured"], true);
}

#[test]
fn aggregate_sessions_count_spans_over_a_window() {
    let dir = fresh_dir("aggregate");
    let path = dir.path().join("summary.json");
    let session = Session::open(
        &path,
        Run::training("mlp::train", 1, "cpu").aggregate(Some(60_000)),
    )
    .unwrap();
    for i in 0..300u32 {
        if i == 100 {
            session.aggregate_enable(false).unwrap();
        }
        if i == 200 {
            session.aggregate_enable(true).unwrap();
        }
        let _step = session.span("train/step");
    }
    session.finish().unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(summary["schema"], "candle-trace/aggregate/1");
    let spans = summary["spans"].as_array().unwrap();
    let step = spans.iter().find(|s| s["name"] == "train/step").unwrap();
    assert_eq!(step["count"], 200, "steps 100..199 ran with statistics off");
}

fn busy(d: std::time::Duration) {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < d {}
}

#[test]
fn tracer_work_is_left_out_of_spans_and_stated() {
    use std::time::Instant;
    let dir = fresh_dir("tracer");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, small_run()).unwrap();
    // The forward's wall time and the tracer work's, measured around and inside
    // them: the bound holds however long a loaded machine stretches either.
    let (forward_wall, tracer_wall) = {
        let _m = session.measure("update").unwrap();
        let start = Instant::now();
        let f = session.step_span("forward", Step::Forward);
        busy(std::time::Duration::from_millis(10));
        let tracer_wall = {
            let _w = session.tracer_work().unwrap();
            let _nested = session.tracer_work().unwrap();
            let inside = Instant::now();
            busy(std::time::Duration::from_millis(50));
            inside.elapsed()
        };
        drop(f);
        (start.elapsed(), tracer_wall)
    };
    assert!(session.tracer_ns() >= 50_000_000);
    assert_eq!(session.tracer_estimated_ns(), 0);
    session.finish().unwrap();
    assert_valid_complete(&path);
    let l = lines(&path);
    let fwd = span_named(&l, "forward")["id"].clone();
    let end = of_kind(&l, "span_end")
        .into_iter()
        .find(|e| e["id"] == fwd)
        .unwrap();
    let d = end["duration_ns"].as_u64().unwrap();
    assert!(
        d >= 10_000_000,
        "the forward's own 10 ms are counted: {d} ns"
    );
    let (forward_wall, tracer_wall) = (
        forward_wall.as_nanos() as u64,
        tracer_wall.as_nanos() as u64,
    );
    assert!(
        d + tracer_wall <= forward_wall,
        "the forward counted the tracer's work: {d} + {tracer_wall} > {forward_wall} ns"
    );
    let m = span_named(&l, "update")["id"].clone();
    let mend = of_kind(&l, "span_end")
        .into_iter()
        .find(|e| e["id"] == m)
        .unwrap();
    assert!(mend["tracer_ns"].as_u64().unwrap() >= 50_000_000);
}

#[test]
fn a_buffered_session_writes_only_at_finish_and_discard_leaves_nothing() {
    let dir = fresh_dir("buffered");
    let kept = dir.path().join("flight").join("kept.jsonl");
    let session = Session::open(&kept, small_run().buffered(1 << 12)).unwrap();
    {
        let _update = session.measure("train/update").unwrap();
        let fwd = session.span_with("train/forward", SpanKind::Module, Step::Forward);
        for i in 0..200 {
            session.scalar(&fwd, "loss", f64::from(i)).unwrap();
        }
    }
    session.flush().unwrap();
    assert!(
        !kept.parent().unwrap().exists(),
        "nothing is created before finish"
    );
    let dropped = session.dropped_records();
    assert!(
        dropped > 0,
        "past max_bytes records are dropped, not refused"
    );
    session.finish().unwrap();
    let l = lines(&kept);
    assert_eq!(l.last().unwrap()["dropped_records"].as_u64(), Some(dropped));
    assert_valid_complete(&kept);

    let gone = dir.path().join("gone").join("t.jsonl");
    let session = Session::open(&gone, small_run().buffered(1 << 20)).unwrap();
    {
        let _update = session.measure("train/update").unwrap();
    }
    session.discard().unwrap();
    assert!(
        !gone.parent().unwrap().exists(),
        "a discarded session leaves nothing"
    );

    let streaming = dir.path().join("streaming.jsonl");
    let session = Session::open(&streaming, small_run()).unwrap();
    let err = session.discard().unwrap_err();
    assert_eq!(err.status(), Some(Status::State));
    assert_eq!(
        lines(&streaming).last().unwrap()["outcome"],
        "failed",
        "a refused discard ends the session as failed"
    );
}
