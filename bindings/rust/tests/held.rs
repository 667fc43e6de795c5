//! Records held in the binding until the session ends with a trace
//! (`SessionRef::hold_records`, a flight recorder's), against the real
//! library, judged by candle-graph.
mod common;

use candle_trace::*;
use common::*;
use serde_json::Value;

fn buffered_run() -> Run {
    Run::training("rust::held", 1, "cpu").buffered(1 << 20)
}

/// One of each record kind a capture helper makes, inside a forward span of
/// the measured region; returns the span's id. Times of 0 are "now".
fn record_all(s: &SessionRef) -> SpanId {
    let _m = s.measure("train/update").unwrap();
    let fwd = s.span_with("train/forward", SpanKind::Module, Step::Forward);
    std::thread::sleep(std::time::Duration::from_millis(1));
    s.op(
        &fwd,
        &Op {
            name: "matmul",
            dtype: "f32",
            device: "cpu",
            inputs: &["x", "w"],
            output: Some("y"),
            shape: &[4, 8],
            duration_ns: 10,
            input_dense_bytes: 64,
            ..Default::default()
        },
    )
    .unwrap();
    s.tensor(
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
    s.data_edge("x", "y").unwrap();
    s.scalar(&fwd, "loss", 0.25).unwrap();
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
    s.memory(&fwd, MemoryAction::Alloc, &mem).unwrap();
    s.gradient("vb", "fc.weight", Gradient::Present(0.5))
        .unwrap();
    fwd.id()
}

/// The records of a trace as they would compare between two runs: times
/// and the process left out.
fn records(lines: &[Value]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| {
            ["op", "tensor", "edge", "tensor_stats", "memory", "gradient"]
                .contains(&l["kind"].as_str().unwrap())
        })
        .map(|l| {
            let mut l = l.clone();
            for k in ["timestamp_ns", "duration_ns"] {
                l.as_object_mut().unwrap().remove(k);
            }
            l
        })
        .collect()
}

#[test]
fn held_records_reach_the_trace_as_sent_ones_do() {
    let dir = fresh_dir("held-same");
    let mut traces = vec![];
    for hold in [0usize, 1 << 20] {
        let path = dir.path().join(format!("t-{hold}.jsonl"));
        let s = Session::open(&path, buffered_run()).unwrap();
        s.hold_records(hold);
        let fwd = record_all(&s);
        assert_eq!(
            s.held_records(),
            if hold > 0 { 6 } else { 0 },
            "hold {hold}"
        );
        s.finish().unwrap();
        assert_valid_complete(&path);
        let l = lines(&path);
        // A "now" held is the time it was recorded at: inside its span.
        let span = of_kind(&l, "span_start")
            .into_iter()
            .find(|x| x["name"] == "train/forward")
            .unwrap()
            .clone();
        let start = span["start_ns"].as_u64().unwrap();
        let end = start
            + of_kind(&l, "span_end")
                .into_iter()
                .find(|x| x["id"] == span["id"])
                .unwrap()["duration_ns"]
                .as_u64()
                .unwrap();
        let op = of_kind(&l, "op")[0];
        let op_start = op["timestamp_ns"].as_u64().unwrap();
        assert!(
            start + 1_000_000 <= op_start && op_start + 10 <= end,
            "op {op_start} in [{start}, {end}] after 1 ms"
        );
        let mem_at = of_kind(&l, "memory")[0]["timestamp_ns"].as_u64().unwrap();
        assert!(
            op_start + 10 <= mem_at && mem_at <= end,
            "memory {mem_at} after the op, in its span"
        );
        assert_ne!(fwd.0, 0);
        traces.push(records(&l));
    }
    assert_eq!(traces[0], traces[1], "the same records, in the same order");
}

#[test]
fn a_dropped_session_s_held_records_never_reach_the_library() {
    let dir = fresh_dir("held-dropped");
    let bad = Op {
        name: "matmul",
        dtype: "f32",
        device: "cpu",
        shape: &[1],
        duration_ns: 1,
        timestamp_ns: 1,
        ..Default::default()
    };
    // Sent at once, a record on a span that does not exist is refused at once.
    let s = Session::open(dir.path().join("sent.jsonl"), buffered_run()).unwrap();
    let err = s.op(SpanId(999), &bad).unwrap_err();
    assert!(err.message().contains("999"), "{err}");
    s.discard().unwrap();
    // Held, it is not looked at by a session that is discarded...
    let s = Session::open(dir.path().join("a.jsonl"), buffered_run()).unwrap();
    s.hold_records(1 << 20);
    s.op(SpanId(999), &bad).unwrap();
    assert_eq!(s.held_records(), 1);
    // ... or reopened for the next update, which holds with the same bound.
    let s = s.reopen(dir.path().join("b.jsonl"), 2).unwrap();
    assert_eq!(s.held_records(), 0);
    s.op(SpanId(999), &bad).unwrap();
    assert_eq!(s.held_records(), 1);
    s.discard().unwrap();
    assert_eq!(listing(dir.path()), Vec::<String>::new());
}

#[test]
fn a_held_record_the_library_refuses_fails_the_trace_at_finish() {
    let dir = fresh_dir("held-refused");
    let path = dir.path().join("t.jsonl");
    let s = Session::open(&path, buffered_run()).unwrap();
    s.hold_records(1 << 20);
    {
        let _m = s.measure("update").unwrap();
        s.op(
            SpanId(999),
            &Op {
                name: "matmul",
                dtype: "f32",
                device: "cpu",
                shape: &[1],
                duration_ns: 1,
                timestamp_ns: 1,
                ..Default::default()
            },
        )
        .unwrap();
    }
    let err = s.finish().unwrap_err();
    let Error::Deferred { count, first } = &err else {
        panic!("deferred: {err}")
    };
    assert_eq!(*count, 1);
    assert!(first.message().contains("999"), "{first}");
    let last = lines(&path).pop().unwrap();
    assert_eq!(last["outcome"], "failed");
    assert!(last["reason"].as_str().unwrap().contains("999"), "{last}");
}

#[test]
fn a_failed_or_dropped_session_keeps_its_held_evidence() {
    let dir = fresh_dir("held-failed");
    for how in ["finish_failed", "drop"] {
        let path = dir.path().join(format!("{how}.jsonl"));
        let s = Session::open(&path, buffered_run()).unwrap();
        s.hold_records(1 << 20);
        record_all(&s);
        match how {
            "finish_failed" => s.finish_failed("out of memory").unwrap(),
            _ => drop(s),
        }
        let l = lines(&path);
        assert_eq!(l.last().unwrap()["outcome"], "failed", "{how}");
        assert_eq!(of_kind(&l, "op").len(), 1, "{how}");
        assert_eq!(of_kind(&l, "gradient").len(), 1, "{how}");
        let (ok, json, stderr) = summary(&path, false);
        assert!(ok, "{how}: {stderr}");
        assert_eq!(
            json["health"]["structurally_valid"], true,
            "{how}: {}",
            json["health"]
        );
    }
}

#[test]
fn past_the_bound_held_records_go_to_the_library_at_once() {
    let dir = fresh_dir("held-bound");
    let path = dir.path().join("t.jsonl");
    let s = Session::open(&path, buffered_run()).unwrap();
    s.hold_records(1); // every record is over it
    record_all(&s);
    assert_eq!(s.held_records(), 0);
    s.finish().unwrap();
    assert_valid_complete(&path);
    assert_eq!(of_kind(&lines(&path), "op").len(), 1);
}

#[test]
fn holding_less_sends_what_is_held_first_so_records_stay_in_order() {
    let dir = fresh_dir("held-less");
    for (then, name) in [(0usize, "none"), (1, "one-byte")] {
        let path = dir.path().join(format!("{name}.jsonl"));
        let s = Session::open(&path, buffered_run()).unwrap();
        s.hold_records(1 << 20);
        {
            let _m = s.measure("update").unwrap();
            let fwd = s.span_with("forward", SpanKind::Module, Step::Forward);
            for (i, op) in ["first", "second"].into_iter().enumerate() {
                if i == 1 {
                    assert_eq!(s.held_records(), 1);
                    s.hold_records(then); // the held "first" goes now, before "second"
                    assert_eq!(s.held_records(), 0, "{name}");
                }
                s.op(
                    &fwd,
                    &Op {
                        name: op,
                        dtype: "f32",
                        device: "cpu",
                        shape: &[1],
                        duration_ns: 1,
                        ..Default::default()
                    },
                )
                .unwrap();
            }
        }
        assert_eq!(
            s.held_records(),
            0,
            "{name}: held past its bound, or not at all"
        );
        s.finish().unwrap();
        assert_valid_complete(&path);
        let names: Vec<String> = of_kind(&lines(&path), "op")
            .iter()
            .map(|o| o["op_name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["first", "second"], "{name}");
    }
}

fn listing(folder: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
