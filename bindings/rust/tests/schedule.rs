//! Schedule: aggregate statistics of every update plus the capture of one.
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use candle_trace::*;
use common::*;
use serde_json::Value;

fn run() -> Run {
    Run::training("rust::schedule", 3, "cpu").tag("test", "schedule")
}

fn read_summary(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn span_count(doc: &Value, name: &str, step: Option<&str>) -> u64 {
    doc["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name && s["step"].as_str() == step)
        .map_or(0, |s| s["count"].as_u64().unwrap())
}

/// One update's work: a forward span in whichever session records it.
fn work(update: &Update<'_>) -> Result<()> {
    if let Some(trace) = update.capture() {
        let _m = trace.measure("train/update")?;
        let fwd = trace.try_span("train/forward", SpanKind::Module, Step::Forward)?;
        trace.scalar(&fwd, "loss", 0.5)?;
    } else if let Some(stats) = update.aggregate() {
        let _fwd = stats.try_span("train/forward", SpanKind::Module, Step::Forward)?;
    }
    Ok(())
}

#[test]
fn counts_every_update_and_captures_the_chosen_one() {
    let dir = fresh_dir("schedule");
    let (trace, summary) = (dir.path().join("t.jsonl"), dir.path().join("s.json"));
    let schedule = Schedule::new(&trace, run())
        .with_aggregate(&summary, None)
        .unwrap();
    assert_eq!(schedule.capture_step(), 3);
    let mut captured = vec![];
    for i in 0..50u64 {
        let update = schedule.begin_update().unwrap();
        assert_eq!(update.number(), i + 1);
        if update.capture().is_some() {
            captured.push(update.number());
        }
        work(&update).unwrap();
        update.scalar("loss", i as f64).unwrap();
        update.end().unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(captured, [3]);
    assert_eq!(done.updates, 50);
    assert_eq!(done.trace.as_deref(), Some(trace.as_path()));
    assert_eq!(done.summary.as_deref(), Some(summary.as_path()));

    let lines = lines(&trace);
    assert_valid_complete(&trace);
    assert_eq!(
        of_kind(&lines, "span_start")
            .iter()
            .filter(|l| l["name"] == "train/forward")
            .count(),
        1
    );

    let doc = read_summary(&summary);
    assert_eq!(doc["final"], true);
    assert_eq!(span_count(&doc, DEFAULT_UPDATE_SPAN, None), 50, "{doc}");
    // The captured update's forward span went to the trace, not the statistics.
    assert_eq!(
        span_count(&doc, "train/forward", Some("forward")),
        49,
        "{doc}"
    );
    let loss = &doc["scalars"][0];
    assert_eq!(
        (
            loss["label"].as_str(),
            loss["count"].as_u64(),
            loss["last"].as_f64()
        ),
        (Some("loss"), Some(50), Some(49.0))
    );
}

#[test]
fn a_dropped_update_ends_like_end_and_one_update_at_a_time() {
    let dir = fresh_dir("schedule-drop");
    let (trace, summary) = (dir.path().join("t.jsonl"), dir.path().join("s.json"));
    let schedule = Schedule::new(&trace, run())
        .with_update_span("loop/update")
        .with_aggregate(&summary, None)
        .unwrap();
    for _ in 0..5 {
        let update = schedule.begin_update().unwrap();
        let err = schedule.begin_update().unwrap_err();
        assert_eq!(err.status(), Some(Status::State));
        assert!(err.message().contains("has not ended"), "{err}");
        work(&update).unwrap();
        // dropped here
    }
    let done = schedule.finish().unwrap();
    assert_valid_complete(done.trace.as_ref().unwrap());
    assert_eq!(span_count(&read_summary(&summary), "loop/update", None), 5);
}

#[test]
fn a_failed_capture_is_returned_and_the_summary_still_written() {
    let dir = fresh_dir("schedule-fail");
    let (trace, summary) = (dir.path().join("t.jsonl"), dir.path().join("s.json"));
    let schedule = Schedule::new(&trace, run())
        .with_aggregate(&summary, None)
        .unwrap();
    for _ in 0..4 {
        let update = schedule.begin_update().unwrap();
        // No measured region in the capture: ct_finish refuses it.
        if let Some(t) = update.capture() {
            let _s = t.span("train/forward");
        }
        if let Err(e) = update.end() {
            assert_eq!(e.status(), Some(Status::State));
            assert!(e.message().contains("no measured region"), "{e}");
        }
    }
    let err = schedule.finish().unwrap_err();
    assert!(err.message().contains("no measured region"), "{err}");
    let doc = read_summary(&summary);
    assert_eq!(doc["final"], true);
    assert_eq!(span_count(&doc, DEFAULT_UPDATE_SPAN, None), 4);
    let last = lines(&trace).pop().unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["outcome"].as_str()),
        (Some("terminal"), Some("failed")),
        "{last}"
    );
}

#[test]
fn a_panic_in_the_captured_update_fails_the_capture_only() {
    let dir = fresh_dir("schedule-panic");
    let (trace, summary) = (dir.path().join("t.jsonl"), dir.path().join("s.json"));
    let schedule = Schedule::new(&trace, run())
        .with_aggregate(&summary, None)
        .unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        for _ in 0..5 {
            let update = schedule.begin_update().unwrap();
            if update.capture().is_some() {
                panic!("boom in update {}", update.number());
            }
            update.end().unwrap();
        }
    }));
    assert!(r.is_err());
    // The loop goes on after the panic was caught.
    schedule.begin_update().unwrap().end().unwrap();
    let done = schedule.finish().unwrap();
    assert_eq!((done.trace, done.updates), (None, 4));
    let last = lines(&trace).pop().unwrap();
    assert_eq!(last["outcome"], "failed");
    assert!(
        last["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("boom in update 3"),
        "{last}"
    );
    assert_eq!(
        span_count(&read_summary(&summary), DEFAULT_UPDATE_SPAN, None),
        4,
        "the panicking update still ended"
    );
}

#[test]
fn without_statistics_only_the_capture_is_taken_and_stopping_early_writes_none() {
    let dir = fresh_dir("schedule-plain");
    let trace = dir.path().join("t.jsonl");
    let schedule = Schedule::new(&trace, run());
    assert!(schedule.aggregate().is_none());
    for _ in 0..2 {
        let update = schedule.begin_update().unwrap();
        assert!(update.aggregate().is_none() && update.capture().is_none());
        update.scalar("loss", 1.0).unwrap(); // nothing to fold into
        update.end().unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(
        done,
        Finished {
            trace: None,
            summary: None,
            updates: 2,
            fired: vec![],
            traces: vec![],
            findings: vec![],
            recorder_cost: None
        }
    );
    assert!(!trace.exists(), "no capture was opened before update 3");
}

#[test]
fn the_closure_form_runs_one_body_and_opens_the_measured_region_on_the_capture_step() {
    let dir = fresh_dir("schedule-closure");
    let (trace, summary) = (dir.path().join("t.jsonl"), dir.path().join("s.json"));
    let schedule = Schedule::new(&trace, run())
        .with_aggregate(&summary, None)
        .unwrap();
    for i in 0..6u64 {
        let n = schedule
            .update(|u| {
                {
                    let _f = u.span_kind("train/forward", SpanKind::Module, Step::Forward)?;
                    // In the trace only on the capture step.
                    assert_eq!(_f.id().is_some(), u.number() == 3);
                }
                u.loss(i as f64);
                Ok::<_, Error>(u.number())
            })
            .unwrap();
        assert_eq!(n, i + 1);
    }
    let done = schedule.finish().unwrap();
    assert_eq!(done.trace.as_deref(), Some(trace.as_path()));
    assert_valid_complete(&trace);
    let lines = lines(&trace);
    let measured = lines
        .iter()
        .find(|l| l["kind"] == "span_start" && l["measured"] == true)
        .unwrap();
    assert_eq!(measured["name"], DEFAULT_UPDATE_SPAN);
    assert_eq!(
        span_named(&lines, "train/forward")["parent_id"],
        measured["id"]
    );
    let loss = of_kind(&lines, "tensor_stats")
        .into_iter()
        .find(|s| s["label"] == "loss")
        .unwrap();
    assert_eq!(loss["mean"], 2.0, "update 3's loss in its measured region");
    let doc = read_summary(&summary);
    assert_eq!(
        span_count(&doc, "train/forward", Some("forward")),
        6,
        "every update in the statistics"
    );
    let loss = &doc["scalars"][0];
    assert_eq!(
        (
            loss["label"].as_str(),
            loss["count"].as_u64(),
            loss["last"].as_f64()
        ),
        (Some("loss"), Some(6), Some(5.0))
    );
}

#[test]
fn an_err_from_the_closure_on_the_capture_step_fails_the_capture_with_it() {
    let dir = fresh_dir("schedule-closure-err");
    let trace = dir.path().join("t.jsonl");
    let schedule = Schedule::new(&trace, run());
    for _ in 0..3 {
        let r = schedule.update(|u| {
            let _f = u.span("train/forward", Step::Forward)?;
            if u.number() == 3 {
                return Err(Error::Trace {
                    status: Status::Internal,
                    message: "the loader died".into(),
                });
            }
            Ok(())
        });
        assert_eq!(r.is_err(), schedule.updates() == 3);
    }
    let done = schedule.finish().unwrap();
    assert_eq!(done.trace, None);
    let last = lines(&trace).pop().unwrap();
    assert_eq!(
        (last["outcome"].as_str(), last["reason"].as_str()),
        (Some("failed"), Some("the loader died [CT_ERR_INTERNAL]"))
    );
}

#[test]
fn reopen_refuses_a_bad_step_and_keeps_the_session() {
    let dir = fresh_dir("schedule-reopen");
    let run = Run::training("rust::reopen", 1, "cpu").buffered(1 << 20);
    let s = Session::open(dir.path().join("a.jsonl"), run).unwrap();
    let (kept, err) = s.reopen(dir.path().join("b.jsonl"), 0).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(err.message().contains("capture_step"), "{err}");
    let s = kept
        .expect("refused before the discard: still open")
        .reopen(dir.path().join("b.jsonl"), 2)
        .unwrap();
    assert_eq!(s.path(), dir.path().join("b.jsonl"));
    {
        let _m = s.measure("update").unwrap();
    }
    let path = s.finish().unwrap();
    assert_eq!(lines(&path)[0]["capture_step"], 2);
    assert_valid_complete(&path);
    assert!(
        !dir.path().join("a.jsonl").exists(),
        "the first one was discarded unwritten"
    );
    // A session that writes as it records is refused, and stays open.
    let plain = Session::open(
        dir.path().join("c.jsonl"),
        Run::training("rust::reopen", 1, "cpu"),
    )
    .unwrap();
    let (kept, err) = plain.reopen(dir.path().join("d.jsonl"), 2).unwrap_err();
    assert_eq!(err.status(), Some(Status::State), "{err}");
    kept.unwrap().finish_failed("done").unwrap();
}

/// A run whose contract names two families that no update records a
/// gradient of: each trace written has a note per family.
fn run_without_gradients(capture_step: u64) -> Run {
    let contract = GradientContract::from_keys("vb", ["a.weight", "b.weight"]);
    Run::training("rust::schedule", capture_step, "cpu")
        .capture_contract(CaptureContract::new().gradient_contract(contract))
}

/// Both of the contract's parameters, recorded without a gradient.
fn no_gradients(trace: &SessionRef) {
    for key in ["a.weight", "b.weight"] {
        trace.gradient("vb", key, Gradient::Missing).unwrap();
    }
}

fn noted_families(findings: &[Finding]) -> Vec<(&'static str, Severity, Option<String>)> {
    findings
        .iter()
        .map(|f| (f.check, f.severity, f.family.clone()))
        .collect()
}

#[test]
fn the_fixed_captures_findings_are_handed_over_in_finished() {
    let dir = fresh_dir("schedule-findings");
    let trace = dir.path().join("t.jsonl");
    let schedule = Schedule::new(&trace, run_without_gradients(2));
    for _ in 0..3 {
        let update = schedule.begin_update().unwrap();
        if let Some(t) = update.capture() {
            let _m = t.measure("train/update").unwrap();
            no_gradients(t);
        }
        update.end().unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(done.trace.as_deref(), Some(trace.as_path()));
    assert_valid_complete(&trace);
    let [(path, findings)] = done.findings.as_slice() else {
        panic!("one trace with findings: {:?}", done.findings)
    };
    assert_eq!(path, &trace);
    let note = "gradient_family_without_gradient";
    assert_eq!(
        noted_families(findings),
        [
            (note, Severity::Note, Some("a".into())),
            (note, Severity::Note, Some("b".into()))
        ]
    );
}

#[test]
fn a_watchs_findings_are_keyed_by_each_traces_final_name() {
    let dir = fresh_dir("schedule-watch-findings");
    let schedule = Schedule::watch(dir.path(), run_without_gradients(1)).unwrap();
    for n in 1..=3 {
        let update = schedule.begin_update().unwrap();
        if let Some(t) = update.trace() {
            no_gradients(t);
        }
        if n == 2 {
            update.trigger("look at this one").unwrap();
        }
        update.end().unwrap();
    }
    let done = schedule.finish().unwrap();
    let (user, after) = (
        dir.path().join("update-000002-user.jsonl"),
        dir.path().join("update-000003-after-user.jsonl"),
    );
    assert_eq!(done.traces, [user.clone(), after.clone()]);
    let paths: Vec<&Path> = done.findings.iter().map(|(p, _)| p.as_path()).collect();
    assert_eq!(
        paths,
        [user.as_path(), after.as_path()],
        "every written trace, under its final name"
    );
    for (path, findings) in &done.findings {
        assert_valid_complete(path);
        assert_eq!(findings.len(), 2, "{path:?}: {findings:?}");
        assert!(
            findings.iter().all(|f| f.severity == Severity::Note),
            "{findings:?}"
        );
    }
}

/// The flight recorder's cost on the system clock: each update 2 ms of the
/// program's work and, in the first loop, 1 ms of the recorder's (bracketed
/// as tracer work); measured once, over the 20 updates after the first 3.
#[test]
fn the_recorder_cost_is_the_tracer_and_arming_share_of_the_recorded_updates() {
    let quiet = WatchOptions {
        triggers: Triggers {
            slow: None,
            ..Triggers::default()
        },
        ..WatchOptions::default()
    };
    // Sleeps overshoot on a loaded machine, each on its own: 1 ms over 2 is a
    // half on an idle one, plus each update's arming (its ct_reopen: tens of
    // µs idle, a millisecond or two loaded); the bounds ask only that it is
    // clearly there. With no tracer work the arming alone is left: above 0,
    // where tracer time alone would be 0, and well below the update.
    for (tracer_ms, low, high) in [(1u64, 0.05, 3.0), (0, f64::MIN_POSITIVE, 0.5)] {
        let dir = fresh_dir("schedule-recorder-cost");
        let summary = dir.path().join("summary.json");
        let schedule = Schedule::watch_with(
            dir.path(),
            Run::training("rust::cost", 1, "cpu"),
            quiet.clone(),
        )
        .unwrap()
        .with_aggregate(&summary, None)
        .unwrap();
        for n in 1..=24u64 {
            let u = schedule.begin_update().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
            if tracer_ms > 0 {
                let _t = u
                    .recorder()
                    .expect("flight-recorded")
                    .tracer_work()
                    .unwrap();
                std::thread::sleep(std::time::Duration::from_millis(tracer_ms));
            }
            u.end().unwrap();
            assert_eq!(schedule.recorder_cost().is_some(), n >= 23, "update {n}");
        }
        let share = schedule.recorder_cost().unwrap();
        assert!(
            (low..=high).contains(&share),
            "{tracer_ms} ms of tracer work in 2: share {share}"
        );
        let done = schedule.finish().unwrap();
        assert_eq!((done.recorder_cost, done.traces.len()), (Some(share), 0));
        // stated once in the summary too
        let doc = read_summary(&summary);
        let stated: Vec<(u64, f64)> = doc["scalars"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["label"] == RECORDER_SHARE)
            .map(|s| (s["count"].as_u64().unwrap(), s["last"].as_f64().unwrap()))
            .collect();
        assert_eq!(stated, [(1, share)], "{doc}");
    }
    // Without a flight recorder there is nothing to measure.
    let dir = fresh_dir("schedule-recorder-cost-off");
    let off = WatchOptions {
        flight_recorder: None,
        ..quiet
    };
    let schedule =
        Schedule::watch_with(dir.path(), Run::training("rust::cost", 1, "cpu"), off).unwrap();
    for _ in 0..30 {
        schedule.begin_update().unwrap().end().unwrap();
    }
    assert_eq!(schedule.finish().unwrap().recorder_cost, None);
}
