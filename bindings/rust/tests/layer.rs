//! The tracing bridge: tracing spans become session spans.
#![cfg(feature = "tracing")]
mod common;

use candle_trace::layer::TraceLayer;
use candle_trace::*;
use common::*;
use std::sync::Mutex;
use tracing_subscriber::prelude::*;

/// Layers see every callsite of the process: one test at a time, so a
/// test's finish sees its own layer's notes alone.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` under a `for_session` layer of a measured-root session, finishes
/// it and checks the trace; returns its folder and path.
fn with_fixed_layer(name: &str, f: impl FnOnce()) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = fresh_dir(name);
    let path = dir.path().join("t.jsonl");
    let session = Session::open(
        &path,
        Run::inference("rust::layer", 1, "cpu").measured_root(),
    )
    .unwrap();
    let subscriber = tracing_subscriber::registry().with(TraceLayer::for_session(&session));
    tracing::subscriber::with_default(subscriber, f);
    let done = session.finish().unwrap();
    // (Other tests' callsites, registered before this layer, may be noted.)
    assert!(
        done.findings()
            .iter()
            .all(|f| f.check == "tracing_spans_unreachable"),
        "{done}"
    );
    assert_valid_complete(&path);
    (dir, path)
}

/// The layer's notes among `done`'s findings.
fn unreachable_notes(done: &Completed) -> Vec<String> {
    done.findings()
        .iter()
        .filter(|f| f.check == "tracing_spans_unreachable")
        .map(|f| f.message.clone())
        .collect()
}

#[test]
fn tracing_spans_inside_the_measured_region_become_session_spans() {
    let _serial = serial();
    let dir = fresh_dir("layer");
    let path = dir.path().join("t.jsonl");
    let subscriber = tracing_subscriber::registry().with(TraceLayer::current());
    tracing::subscriber::with_default(subscriber, || {
        // Without a current session the layer records nothing.
        {
            let _ignored = tracing::info_span!("before").entered();
        }
        let session = Session::open(&path, Run::training("rust::layer", 1, "cpu")).unwrap();
        {
            let _m = session.measure("update").unwrap();
            let attn = tracing::trace_span!("attn");
            {
                let _a = attn.enter();
                let _mlp = tracing::trace_span!("mlp").entered();
            }
            let _again = attn.enter(); // a second enter is a second session span
        }
        session.finish().unwrap();
    });
    assert_valid_complete(&path);
    let l = lines(&path);
    let starts = of_kind(&l, "span_start");
    assert!(!starts.iter().any(|s| s["name"] == "before"));
    let attn: Vec<_> = starts.iter().filter(|s| s["name"] == "attn").collect();
    assert_eq!(attn.len(), 2);
    let update = span_named(&l, "update");
    let mlp = span_named(&l, "attn/mlp"); // named by its path
    assert_eq!(attn[0]["parent_id"], update["id"]);
    assert_eq!(mlp["parent_id"], attn[0]["id"]);
}

#[test]
fn fixed_session_layer_records_without_a_measured_region_current() {
    let _serial = serial();
    let (_dir, path) = with_fixed_layer("layer-fixed", || {
        let _s = tracing::info_span!("decode").entered();
    });
    assert_eq!(span_named(&lines(&path), "decode")["parent_id"], "s1");
}

/// A span made under another subscriber (this one's callsite is registered,
/// unlike one made before any subscriber: tests/layer_order.rs) never
/// reaches the layer; finish names its callsite.
#[test]
fn spans_made_under_another_subscriber_are_named_by_finish() {
    let _serial = serial();
    let other = tracing::subscriber::set_default(tracing_subscriber::registry());
    let built_early = tracing::trace_span!("built_early");
    let line = line!() - 1;
    drop(other);
    let dir = fresh_dir("layer-early");
    let path = dir.path().join("t.jsonl");
    let subscriber = tracing_subscriber::registry().with(TraceLayer::current());
    let done = tracing::subscriber::with_default(subscriber, || {
        let built_late = tracing::trace_span!("built_late");
        let session = Session::open(&path, Run::training("rust::layer", 1, "cpu")).unwrap();
        {
            let _m = session.measure("update").unwrap();
            let _e = built_early.enter();
            let _l = built_late.enter();
        }
        session.finish().unwrap()
    });
    assert_valid_complete(&path);
    let l = lines(&path);
    let names: Vec<&str> = of_kind(&l, "span_start")
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["rust::layer", "update", "built_late"],
        "the early span cannot be recorded"
    );
    let notes = unreachable_notes(&done);
    assert_eq!(notes.len(), 1, "{:?}", done.findings());
    let early = format!("built_early (tests/layer.rs:{line})");
    assert!(notes[0].contains(&early), "{}", notes[0]);
    assert!(
        notes[0].contains("install the subscriber before building the model"),
        "{}",
        notes[0]
    );
    assert!(
        !notes[0].contains("built_late"),
        "a span that reached the layer is not named: {}",
        notes[0]
    );
}

/// Installed first, the same model's spans are all captured, and 15 spans
/// of one callsite (with_tracing's `linear`) are told apart.
#[test]
fn repeated_span_names_carry_their_path_and_instance() {
    let _serial = serial();
    let dir = fresh_dir("layer-paths");
    let path = dir.path().join("t.jsonl");
    let subscriber = tracing_subscriber::registry().with(TraceLayer::current());
    let done = tracing::subscriber::with_default(subscriber, || {
        // "Model build": 3 blocks of an attn span and 5 linear spans, kept.
        let blocks: Vec<(tracing::Span, Vec<tracing::Span>)> = (0..3)
            .map(|_| {
                (
                    tracing::trace_span!("attn"),
                    (0..5).map(|_| tracing::trace_span!("linear")).collect(),
                )
            })
            .collect();
        let session = Session::open(&path, Run::training("rust::layer", 1, "cpu")).unwrap();
        {
            let _m = session.measure("update").unwrap();
            for (attn, linears) in &blocks {
                let _a = attn.enter();
                for lin in linears {
                    let _l = lin.enter();
                }
            }
            // A span made afresh on each call keeps its one name.
            for _ in 0..3 {
                let _s = tracing::trace_span!("step").entered();
            }
        }
        session.finish().unwrap()
    });
    assert_valid_complete(&path);
    let l = lines(&path);
    let names: Vec<String> = of_kind(&l, "span_start")
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    let n = |i: usize| {
        if i == 0 {
            String::new()
        } else {
            format!("#{i}")
        }
    };
    let mut want = vec!["rust::layer".to_string(), "update".to_string()];
    for b in 0..3 {
        want.push(format!("attn{}", n(b)));
        want.extend((0..5).map(|j| format!("attn{}/linear{}", n(b), n(5 * b + j))));
    }
    want.extend(["step", "step", "step"].map(String::from));
    assert_eq!(names, want);
    let linear: std::collections::BTreeSet<_> =
        names.iter().filter(|s| s.contains("linear")).collect();
    assert_eq!(linear.len(), 15, "15 distinct linear spans");
    // Nesting is kept as well: each linear's parent is its block's attn.
    let attn1 = span_named(&l, "attn#1");
    assert_eq!(span_named(&l, "attn#1/linear#7")["parent_id"], attn1["id"]);
    // (Another test's `attn` callsite may be named: it was registered before
    // this layer existed. `linear` and `step` are this test's alone.)
    for note in unreachable_notes(&done) {
        assert!(
            !note.contains("linear (") && !note.contains("step ("),
            "spans that reached the layer: {note}"
        );
    }
}

/// Past 64 live spans of one callsite the numbers go on (a slower path).
#[test]
fn more_than_64_live_spans_of_one_callsite_are_numbered_too() {
    let _serial = serial();
    let (_dir, path) = with_fixed_layer("layer-many", || {
        let spans: Vec<tracing::Span> = (0..70).map(|_| tracing::trace_span!("many")).collect();
        drop(spans[3].clone()); // a clone closes nothing
        for s in &spans {
            let _e = s.enter();
        }
        drop(spans);
        let again = tracing::trace_span!("many"); // every number is free again
        let _e = again.enter();
    });
    let l = lines(&path);
    let names: Vec<&str> = of_kind(&l, "span_start")
        .iter()
        .skip(1)
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let mut want: Vec<String> = (0..70)
        .map(|i| {
            if i == 0 {
                "many".into()
            } else {
                format!("many#{i}")
            }
        })
        .collect();
    want.push("many".into());
    assert_eq!(names, want);
}
