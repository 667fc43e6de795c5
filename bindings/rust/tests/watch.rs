//! A watching Schedule on training loops that go wrong by themselves (issue
//! 13): a data step that stalls, a loss that turns NaN after a learning-rate
//! spike, an out-of-memory error (returned, or panicking) inside backward —
//! each must leave exactly the expected traces, with no capture step given,
//! every trace judged by the real candle-graph. Updates are timed by a
//! ManualClock that only the programs' data step moves, so the slow trigger
//! sees the same numbers on any machine.
#![cfg(feature = "candle")]
mod common;

#[path = "../examples/common/failures.rs"]
mod failures;
#[path = "../examples/common/mlp.rs"]
mod mlp;

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use candle_trace::triggers::Evaluator;
use candle_trace::*;
use common::*;
use failures::{Failure, Wait, DATA_WAIT, ERROR_UPDATE, NAN_UPDATE, OOM, SLOW_FACTOR, SLOW_UPDATE};
use serde_json::Value;

fn listing(folder: &Path) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(folder) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

/// Runs `failure` for `updates` updates on a manual clock; the schedule and
/// the loop's result.
fn program(
    folder: &Path,
    failure: Failure,
    updates: u64,
    opts: WatchOptions,
) -> (Schedule, Result<Vec<f32>>) {
    let wait = Wait::Clock(ManualClock::new());
    let (mut s, schedule) = failures::watched(folder, &wait, opts, None).unwrap();
    let r = failures::train(&mut s, &schedule, failure, updates, &wait);
    (schedule, r)
}

fn fired_of(done: &[Fired]) -> Vec<(u64, Trigger)> {
    done.iter().map(|f| (f.update, f.trigger)).collect()
}

fn stats_by_label(lines: &[Value]) -> std::collections::BTreeMap<String, Value> {
    of_kind(lines, "tensor_stats")
        .into_iter()
        .map(|s| (s["label"].as_str().unwrap().to_string(), s.clone()))
        .collect()
}

fn op_names(lines: &[Value]) -> BTreeSet<String> {
    of_kind(lines, "op")
        .iter()
        .map(|o| o["op_name"].as_str().unwrap().to_string())
        .collect()
}

/// A failed trace: structurally valid for candle-graph, not complete, its
/// terminal's reason.
fn judged_failed(trace: &Path) -> (Vec<Value>, String) {
    let (ok, json, stderr) = summary(trace, false);
    assert!(
        ok,
        "candle-graph summary refused {}: {stderr}",
        trace.display()
    );
    assert_eq!(
        json["health"]["structurally_valid"], true,
        "{}",
        json["health"]
    );
    assert_eq!(json["health"]["capture_complete"], false);
    let lines = lines(trace);
    let last = lines.last().unwrap().clone();
    assert_eq!(
        (last["kind"].as_str(), last["outcome"].as_str()),
        (Some("terminal"), Some("failed"))
    );
    (lines, last["reason"].as_str().unwrap().to_string())
}

#[test]
fn a_stalled_data_step_is_kept_with_the_update_after_it() {
    let dir = fresh_dir("watch-slow");
    let (schedule, r) = program(dir.path(), Failure::Slow, 40, WatchOptions::default());
    assert_eq!(r.unwrap().len(), 40);
    let done = schedule.finish().unwrap();
    assert_eq!(fired_of(&done.fired), [(SLOW_UPDATE, Trigger::Slow)]);
    assert_eq!(
        listing(dir.path()),
        ["update-000037-slow.jsonl", "update-000038-after-slow.jsonl"]
    );
    let f = &done.fired[0];
    // Every other update took exactly DATA_WAIT on the manual clock.
    let (median, slow) = (
        DATA_WAIT.as_secs_f64(),
        (DATA_WAIT * SLOW_FACTOR).as_secs_f64(),
    );
    assert_eq!(f.value, slow);
    assert_eq!(f.threshold, 3.0 * median);
    assert_eq!(f.detail, "50.0 ms > 30.0 ms (3 x median; median 10.0 ms)");
    assert_eq!(
        f.trace.as_deref(),
        Some(dir.path().join("update-000037-slow.jsonl").as_path())
    );
    assert_eq!(
        done.traces,
        [
            dir.path().join("update-000037-slow.jsonl"),
            dir.path().join("update-000038-after-slow.jsonl")
        ]
    );

    let kept = dir.path().join("update-000037-slow.jsonl");
    assert_valid_complete(&kept);
    let lines = lines(&kept);
    assert_eq!(lines[0]["capture_step"], 37);
    let stats = stats_by_label(&lines);
    // The flight recorder keeps no tensor statistics: only why it was kept.
    assert_eq!(
        stats.keys().collect::<Vec<_>>(),
        [
            "candle_trace/trigger/slow",
            "candle_trace/trigger/slow/threshold"
        ]
    );
    assert_eq!(
        stats["candle_trace/trigger/slow"]["mean"].as_f64(),
        Some(slow)
    );
    assert_eq!(
        stats["candle_trace/trigger/slow/threshold"]["mean"].as_f64(),
        Some(3.0 * median)
    );
    assert_eq!(
        op_names(&lines),
        BTreeSet::from(["fc1".to_string(), "fc2".to_string()])
    );
    let measured = lines
        .iter()
        .find(|l| l["kind"] == "span_start" && l["measured"] == true)
        .unwrap();
    assert_eq!(measured["name"], DEFAULT_UPDATE_SPAN);
    assert_eq!(
        span_named(&lines, "train/data")["parent_id"],
        measured["id"]
    );
    assert_eq!(
        of_kind(&lines, "gradient").len(),
        4,
        "the contract's gradients"
    );

    let after = dir.path().join("update-000038-after-slow.jsonl");
    assert_valid_complete(&after);
    let after = common::lines(&after);
    assert_eq!(after[0]["capture_step"], 38);
    let stats = stats_by_label(&after);
    assert!(
        stats.contains_key("logits")
            && stats.contains_key("fc1/output")
            && stats.contains_key("loss"),
        "{:?}",
        stats.keys()
    );
    assert_eq!(
        op_names(&after),
        BTreeSet::from(["fc1".to_string(), "fc2".to_string()])
    );
}

#[test]
fn a_loss_that_turns_nan_is_kept_once() {
    let dir = fresh_dir("watch-nan");
    let (schedule, r) = program(dir.path(), Failure::Nan, 25, WatchOptions::default());
    let losses = r.unwrap();
    assert!(
        losses[..NAN_UPDATE as usize - 1]
            .iter()
            .all(|l| l.is_finite())
            && losses[NAN_UPDATE as usize - 1].is_nan(),
        "{losses:?}"
    );
    let done = schedule.finish().unwrap();
    assert_eq!(fired_of(&done.fired), [(NAN_UPDATE, Trigger::NonFinite)]);
    assert!(done.fired[0].value.is_nan());
    assert_eq!(
        listing(dir.path()),
        [
            "update-000020-non_finite.jsonl",
            "update-000021-after-non_finite.jsonl"
        ]
    );
    for name in [
        "update-000020-non_finite.jsonl",
        "update-000021-after-non_finite.jsonl",
    ] {
        // The model's own finding, not a broken trace: complete, and its only
        // errors are about the NaN gradients (no family has a finite one).
        let trace = dir.path().join(name);
        let (_, json, _) = summary(&trace, false);
        let h = &json["health"];
        assert_eq!(h["capture_complete"], true, "{h}");
        let errors: BTreeSet<&str> = h["issues"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["severity"] == "error")
            .map(|i| i["code"].as_str().unwrap())
            .collect();
        assert!(errors.contains("gradient_family_non_finite"), "{h}");
        assert!(
            errors.is_subset(&BTreeSet::from([
                "gradient_family_non_finite",
                "gradient_active_family_below_minimum"
            ])),
            "{h}"
        );
        let lines = lines(&trace);
        assert_eq!(
            op_names(&lines),
            BTreeSet::from(["fc1".to_string(), "fc2".to_string()])
        );
        assert_eq!(
            of_kind(&lines, "gradient")
                .iter()
                .map(|g| g["state"].as_str().unwrap())
                .collect::<BTreeSet<_>>(),
            BTreeSet::from(["non_finite"])
        );
    }
    let kept = lines(&dir.path().join("update-000020-non_finite.jsonl"));
    assert_eq!(
        stats_by_label(&kept)["candle_trace/trigger/non_finite"]["non_finite"],
        1
    );
    let after = lines(&dir.path().join("update-000021-after-non_finite.jsonl"));
    assert!(of_kind(&after, "tensor_stats")
        .iter()
        .any(|s| s["non_finite"].as_u64().unwrap() > 0));
}

#[test]
fn an_error_in_backward_is_kept_as_a_failed_trace_and_returned() {
    let dir = fresh_dir("watch-error");
    let (schedule, r) = program(dir.path(), Failure::Error, 30, WatchOptions::default());
    let err = r.unwrap_err();
    assert_eq!(err.to_string(), format!("candle: {OOM}"));
    assert_eq!(
        schedule.updates(),
        ERROR_UPDATE,
        "the loop stopped at the error"
    );
    let done = schedule.finish().unwrap();
    assert_eq!(fired_of(&done.fired), [(ERROR_UPDATE, Trigger::Exception)]);
    assert_eq!(done.fired[0].detail, format!("candle: {OOM}"));
    assert_eq!(listing(dir.path()), ["update-000015-exception.jsonl"]);
    let (lines, reason) = judged_failed(&dir.path().join("update-000015-exception.jsonl"));
    assert_eq!(reason, format!("candle: {OOM}"));
    assert_eq!(lines[0]["capture_step"], 15);
    assert_eq!(
        op_names(&lines),
        BTreeSet::from(["fc1".to_string(), "fc2".to_string()])
    );
    // The backward span it failed in (ended as the error left it), and no optimizer.
    let bwd = span_named(&lines, "train/backward");
    assert_eq!(bwd["step"], "backward");
    assert!(!lines
        .iter()
        .any(|l| l["kind"] == "span_start" && l["name"] == "train/optimizer"));
}

#[test]
fn a_panic_in_backward_is_kept_as_a_failed_trace_and_unwinds() {
    let dir = fresh_dir("watch-panic");
    let wait = Wait::Clock(ManualClock::new());
    let (mut s, schedule) =
        failures::watched(dir.path(), &wait, WatchOptions::default(), None).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        failures::train(&mut s, &schedule, Failure::Panic, 30, &wait)
    }));
    assert_eq!(*r.unwrap_err().downcast::<String>().unwrap(), OOM);
    // The loop can go on after a caught panic: the next update is recorded again.
    schedule.update(|_| Ok::<_, Error>(())).unwrap();
    let done = schedule.finish().unwrap();
    assert_eq!(
        (fired_of(&done.fired), done.updates),
        (vec![(ERROR_UPDATE, Trigger::Exception)], 16)
    );
    assert_eq!(listing(dir.path()), ["update-000015-exception.jsonl"]);
    let (lines, reason) = judged_failed(&dir.path().join("update-000015-exception.jsonl"));
    assert!(
        reason.starts_with(&format!("panic: {OOM} (at ")),
        "{reason}"
    );
    assert_eq!(
        op_names(&lines),
        BTreeSet::from(["fc1".to_string(), "fc2".to_string()])
    );
}

#[test]
fn a_run_without_anomaly_writes_nothing_and_its_summary_lists_no_trigger() {
    let dir = fresh_dir("watch-none");
    let (folder, summary_path) = (dir.path().join("traces"), dir.path().join("s.json"));
    let wait = Wait::Clock(ManualClock::new());
    let (mut s, schedule) =
        failures::watched(&folder, &wait, WatchOptions::default(), Some(&summary_path)).unwrap();
    failures::train(&mut s, &schedule, Failure::None, 60, &wait).unwrap();
    let done = schedule.finish().unwrap();
    assert_eq!(
        (done.fired.len(), done.traces.len(), done.updates),
        (0, 0, 60)
    );
    assert!(listing(&folder).is_empty(), "{:?}", listing(&folder));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    let scalars: Vec<(&str, u64)> = doc["scalars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["label"].as_str().unwrap(), s["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(scalars, [("loss", 60)]);
    assert!(doc.get("triggers").is_none(), "no firing, no list: {doc}");
}

#[test]
fn a_run_shorter_than_the_slow_triggers_warm_up_says_it_never_armed() {
    let dir = fresh_dir("watch-unarmed");
    let folder = dir.path().join("traces");
    let wait = Wait::Clock(ManualClock::new());
    let (mut s, schedule) =
        failures::watched(&folder, &wait, WatchOptions::default(), None).unwrap();
    failures::train(&mut s, &schedule, Failure::None, 4, &wait).unwrap();
    let said = schedule.slow_unarmed().expect("4 updates: not armed");
    let timed: u64 = said
        .strip_prefix("the slow trigger arms after 10 timed updates; this run timed ")
        .unwrap_or_else(|| panic!("{said}"))
        .parse()
        .unwrap();
    assert!(timed < 10, "{said}");
    failures::train(&mut s, &schedule, Failure::None, 10 - timed, &wait).unwrap();
    assert_eq!(schedule.slow_unarmed(), None);
    assert_eq!(schedule.finish().unwrap().fired.len(), 0);
    let plain = Schedule::new(dir.path().join("t.jsonl"), failures::run(&s));
    assert_eq!(plain.slow_unarmed(), None, "not watching: nothing to arm");
}

#[test]
fn triggers_fold_into_the_summary_and_the_cap_bounds_the_traces() {
    let dir = fresh_dir("watch-cap");
    let (folder, summary_path) = (dir.path().join("traces"), dir.path().join("s.json"));
    let wait = Wait::Clock(ManualClock::new());
    let Wait::Clock(clock) = &wait else {
        unreachable!()
    };
    let schedule = Schedule::watch(&folder, Run::training("rust::cap", 1, "cpu"))
        .unwrap()
        .with_clock(clock.clone())
        .with_aggregate(&summary_path, None)
        .unwrap();
    for n in 1..=12u64 {
        schedule
            .update(|u| {
                let _d = u.span("train/data", Step::None)?;
                wait_for(&wait);
                if (5..=9).contains(&n) {
                    u.trigger(&format!("look at {n}"))?;
                }
                Ok::<_, Error>(())
            })
            .unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(
        fired_of(&done.fired),
        (5..=9).map(|n| (n, Trigger::User)).collect::<Vec<_>>()
    );
    assert_eq!(done.fired[0].detail, "look at 5");
    // 5 flight-recorded, 6 and 7 captured in full after a trigger; then the cap.
    assert_eq!(
        listing(&folder),
        [
            "update-000005-user.jsonl",
            "update-000006-after-user.jsonl",
            "update-000007-after-user.jsonl"
        ]
    );
    // 6 and 7 fired inside their full captures, which hold them; 8 and 9 found the cap.
    assert_eq!(
        done.fired
            .iter()
            .map(|f| f.trace.is_some())
            .collect::<Vec<_>>(),
        [true, true, true, false, false]
    );
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).unwrap()).unwrap();
    // Each firing listed in the summary, as candle_trace.torch.watch lists its own.
    let listed: Vec<(u64, &str, &str, String, &str)> = doc["triggers"]["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let trace = f["trace"].as_str().unwrap();
            let name = Path::new(trace)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                f["update"].as_u64().unwrap(),
                f["trigger"].as_str().unwrap(),
                f["detail"].as_str().unwrap(),
                name,
                f["no_trace"].as_str().unwrap(),
            )
        })
        .collect();
    let cap = "the run's cap of 3 traces was reached";
    assert_eq!(
        listed,
        [
            (
                5,
                "user",
                "look at 5",
                "update-000005-user.jsonl".to_string(),
                ""
            ),
            (
                6,
                "user",
                "look at 6",
                "update-000006-after-user.jsonl".to_string(),
                ""
            ),
            (
                7,
                "user",
                "look at 7",
                "update-000007-after-user.jsonl".to_string(),
                ""
            ),
            (8, "user", "look at 8", String::new(), cap),
            (9, "user", "look at 9", String::new(), cap),
        ]
    );
    assert_eq!(
        (
            doc["triggers"]["max"].as_u64(),
            doc["triggers"]["refused"].as_u64()
        ),
        (Some(256), Some(0))
    );
    let user = doc["scalars"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == "trigger/user")
        .unwrap();
    assert_eq!(user["count"], 5);
    assert_eq!(user["last"].as_f64(), Some(DATA_WAIT.as_secs_f64()));
}

#[test]
fn an_update_captured_in_full_is_not_timed() {
    // 15 stalls 5x and fires; 16, captured in full after it, stalls 10x: its
    // time is the capture's, so it neither fires nor joins the window.
    let dir = fresh_dir("watch-untimed");
    let clock = ManualClock::new();
    let schedule = Schedule::watch(dir.path(), Run::training("rust::untimed", 1, "cpu"))
        .unwrap()
        .with_clock(clock.clone());
    for n in 1..=20u64 {
        schedule
            .update(|u| {
                let _d = u.span("train/data", Step::None)?;
                clock.advance(
                    DATA_WAIT
                        * if n == 15 {
                            5
                        } else if n == 16 {
                            10
                        } else {
                            1
                        },
                );
                Ok::<_, Error>(())
            })
            .unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(fired_of(&done.fired), [(15, Trigger::Slow)]);
    assert_eq!(
        done.fired[0].detail,
        "50.0 ms > 30.0 ms (3 x median; median 10.0 ms)"
    );
    assert_eq!(
        listing(dir.path()),
        ["update-000015-slow.jsonl", "update-000016-after-slow.jsonl"]
    );
}

fn wait_for(wait: &Wait) {
    if let Wait::Clock(c) = wait {
        c.advance(DATA_WAIT);
    }
}

#[test]
fn the_flight_recorder_bound_drops_records_and_says_so() {
    let dir = fresh_dir("watch-bound");
    let opts = WatchOptions {
        flight_recorder: Some(2048),
        capture_next: false,
        ..Default::default()
    };
    let (schedule, _) = (
        Schedule::watch_with(dir.path(), Run::training("rust::bound", 1, "cpu"), opts).unwrap(),
        (),
    );
    for n in 1..=3u64 {
        schedule
            .update(|u| {
                let s = u.span("work", Step::None)?;
                if let Some(t) = u.trace() {
                    for i in 0..200 {
                        t.scalar(s.id().unwrap(), &format!("x{i}"), i as f64)?;
                    }
                }
                if n == 2 {
                    u.trigger("keep 2")?;
                }
                Ok::<_, Error>(())
            })
            .unwrap();
    }
    let done = schedule.finish().unwrap();
    assert_eq!(listing(dir.path()), ["update-000002-user.jsonl"]);
    let trace = &done.traces[0];
    assert_valid_complete(trace);
    let lines = lines(trace);
    let last = lines.last().unwrap();
    let kept = of_kind(&lines, "tensor_stats").len() as u64;
    assert!(kept < 200, "the bound held: {kept} of 200 scalars kept");
    // The two trigger notes were dropped too (past the bound): all counted.
    assert_eq!(
        last["dropped_records"].as_u64().unwrap(),
        202 - kept,
        "{last}"
    );
}

#[test]
fn the_guard_form_runs_the_same_schedule_and_fail_is_the_exception_trigger() {
    let dir = fresh_dir("watch-guard");
    let clock = ManualClock::new();
    // The run's own warm-up and correlation id give way to each update's.
    let run = Run::training("rust::guard", 1, "cpu")
        .warmup_steps(0)
        .correlation_id("mine");
    let schedule = Schedule::watch(dir.path(), run)
        .unwrap()
        .with_clock(clock.clone());
    for n in 1..=4u64 {
        let u = schedule.begin_update().unwrap();
        assert!(
            u.recorder().is_some() && u.capture().is_none(),
            "flight-recorded"
        );
        assert!(schedule.begin_update().is_err(), "one update at a time");
        let _s = u.span("work", Step::Forward).unwrap();
        clock.advance(Duration::from_millis(1));
        drop(_s);
        if n == 3 {
            u.fail("the loader died").unwrap();
        } else {
            u.end().unwrap();
        }
    }
    let done = schedule.finish().unwrap();
    assert_eq!(fired_of(&done.fired), [(3, Trigger::Exception)]);
    let (lines, reason) = judged_failed(&dir.path().join("update-000003-exception.jsonl"));
    assert_eq!(reason, "the loader died");
    let meta = &lines[0];
    assert_eq!(
        (meta["capture_step"].as_u64(), meta["warmup_steps"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(meta["correlation_id"], "rust::guard/update-3");
    assert_eq!(
        listing(dir.path()),
        ["update-000003-exception.jsonl"],
        "nothing but the failed one, and no spare left behind"
    );
}

#[test]
fn bad_options_and_a_trigger_without_watch_are_refused() {
    let run = || Run::training("rust::bad", 1, "cpu");
    for (opts, needle) in [
        (
            WatchOptions {
                triggers: Triggers {
                    slow: Some(1.0),
                    ..Default::default()
                },
                ..Default::default()
            },
            "triggers.slow must be a finite factor > 1",
        ),
        (
            WatchOptions {
                triggers: Triggers {
                    warmup: 0,
                    ..Default::default()
                },
                ..Default::default()
            },
            "triggers.warmup must be >= 1",
        ),
        (
            WatchOptions {
                triggers: Triggers {
                    window: 0,
                    ..Default::default()
                },
                ..Default::default()
            },
            "triggers.window must be >= 1",
        ),
        (
            WatchOptions {
                triggers: Triggers {
                    slow_spread: -1.0,
                    ..Default::default()
                },
                ..Default::default()
            },
            "triggers.slow_spread must be a number >= 0, got -1",
        ),
        (
            WatchOptions {
                triggers: Triggers {
                    slow_wait_share: f64::NAN,
                    ..Default::default()
                },
                ..Default::default()
            },
            "triggers.slow_wait_share must be a number >= 0, got NaN",
        ),
        (
            WatchOptions {
                flight_recorder: Some(0),
                ..Default::default()
            },
            "at least 1 byte",
        ),
    ] {
        let err = Schedule::watch_with("unused", run(), opts).unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        assert!(err.message().contains(needle), "{err}");
    }
    let err = Schedule::watch("unused", run().measured_root()).unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert!(
        err.message()
            .contains("a run with measured_root() has none to open"),
        "{err}"
    );
    let plain = Schedule::new("unused.jsonl", run());
    let err = plain.trigger("why").unwrap_err();
    assert_eq!(err.status(), Some(Status::State));
    assert!(err.message().contains("needs a watching schedule"), "{err}");
}

const MS: f64 = 1e-3;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// `n` updates of `seconds` each, none slow.
fn steady(e: &mut Evaluator, n: u64, seconds: f64) {
    for i in 1..=n {
        assert_eq!(
            e.end_of_update(i, Some(seconds), Some(1.0), 0.0),
            None,
            "update {i}"
        );
    }
}

// The numbers and details below are those candle_trace.torch._triggers gives
// for the same updates (tests/test_torch_triggers.py): the two bindings keep
// the same updates.
#[test]
fn the_slow_rule_by_numbers() {
    let mut e = Evaluator::new(Triggers {
        warmup: 3,
        ..Default::default()
    })
    .unwrap();
    // Warm-up: nothing fires before 3 updates were seen, however slow.
    assert_eq!(e.end_of_update(1, Some(0.010), None, 0.0), None);
    assert_eq!(e.end_of_update(2, Some(0.010), None, 0.0), None);
    assert!(!e.slow_armed() && e.timed() == 2);
    assert_eq!(e.end_of_update(3, Some(1.000), None, 0.0), None);
    assert_eq!((e.median(), e.mad()), (0.010, 0.0));
    assert!(e.slow_armed() && e.timed() == 3);
    // median 10 ms + 2 x median (above the 5 ms floor and 10 x MAD 0) = 30 ms.
    let f = e.end_of_update(4, Some(0.031), None, 0.0).unwrap();
    assert_eq!((f.trigger, f.value), (Trigger::Slow, 0.031));
    assert!(close(f.threshold, 0.030), "{}", f.threshold);
    assert_eq!(f.detail, "31.0 ms > 30.0 ms (3 x median; median 10.0 ms)");
    // The median is of the last `window` updates only.
    let mut w = Evaluator::new(Triggers {
        warmup: 1,
        window: 4,
        ..Default::default()
    })
    .unwrap();
    for (i, t) in [0.01, 0.01, 0.01, 0.01, 1.0, 1.0, 1.0]
        .into_iter()
        .enumerate()
    {
        w.end_of_update(i as u64 + 1, Some(t), None, 0.0);
    }
    assert_eq!(w.median(), 1.0, "[0.01, 1, 1, 1]");
    // The window holds the update's time less the machine's hold-up.
    let mut w = Evaluator::new(Triggers {
        window: 4,
        ..Default::default()
    })
    .unwrap();
    for i in 1..=4 {
        w.end_of_update(i, Some(2.0 * MS), None, 1.0 * MS);
    }
    assert!(close(w.median(), 1.0 * MS));
}

#[test]
fn a_sub_millisecond_update_held_up_by_the_machine_is_not_slow() {
    let mut e = Evaluator::new(Triggers::default()).unwrap();
    steady(&mut e, 64, 0.25 * MS);
    // 6 ms of wall time, 5.8 ms of it runnable but waiting for a CPU: the machine's stall.
    assert_eq!(
        e.end_of_update(65, Some(6.0 * MS), Some(1.0), 5.8 * MS),
        None
    );
    // 4 ms with no wait: under the floor, what a VM's own stall makes of such an update.
    assert_eq!(e.end_of_update(66, Some(4.0 * MS), Some(1.0), 0.0), None);
    // 6 ms spent in the program (a data loader's sleep is no CPU wait): slow,
    // 21x a median this small is needed to clear the 5 ms floor.
    let f = e.end_of_update(67, Some(6.0 * MS), Some(1.0), 0.0).unwrap();
    assert_eq!((f.trigger, f.value), (Trigger::Slow, 6.0 * MS));
    assert!(
        close(f.threshold, 0.25 * MS + 5.0 * MS),
        "median + slow_min_excess: {}",
        f.threshold
    );
    assert_eq!(f.detail, "6.0 ms > 5.2 ms (median + 5 ms; median 0.2 ms)");
}

#[test]
fn a_preempted_update_must_exceed_the_hold_up_too_which_is_left_out_and_bounded() {
    let mut e = Evaluator::new(Triggers::default()).unwrap();
    steady(&mut e, 64, 0.5 * MS);
    // Preempted for 25.5 ms, the update comes back to cold caches: 1.7 ms of its own.
    assert_eq!(
        e.end_of_update(65, Some(27.2 * MS), Some(1.0), 25.5 * MS),
        None
    );
    // An excess of the hold-up itself: 2.4 ms after 2.4 ms.
    assert_eq!(
        e.end_of_update(66, Some(5.3 * MS), Some(1.0), 2.4 * MS),
        None
    );
    // A stall of its own longer than the hold-up and the floor: slow.
    let f = e
        .end_of_update(67, Some(60.0 * MS), Some(1.0), 25.0 * MS)
        .unwrap();
    assert!(
        close(f.value, 35.0 * MS) && close(f.threshold, 0.5 * MS + 5.0 * MS + 25.0 * MS),
        "{f:?}"
    );
    assert_eq!(
        f.detail,
        "35.0 ms > 30.5 ms (median + 5 ms + 1 x the 25.0 ms the machine held it up; median 0.5 ms; 25.0 ms the machine held it up left out)"
    );
    // slow_wait_share 0: the hold-up is left out of the time but raises no bar.
    let mut e = Evaluator::new(Triggers {
        slow_wait_share: 0.0,
        ..Default::default()
    })
    .unwrap();
    steady(&mut e, 64, 0.5 * MS);
    assert_eq!(
        e.end_of_update(65, Some(27.2 * MS), Some(1.0), 25.5 * MS),
        None,
        "1.7 ms of its own"
    );
    let f = e
        .end_of_update(66, Some(33.0 * MS), Some(1.0), 25.0 * MS)
        .unwrap();
    assert!(
        close(f.value, 8.0 * MS) && close(f.threshold, 5.5 * MS),
        "{f:?}"
    );
    assert_eq!(
        f.detail,
        "8.0 ms > 5.5 ms (median + 5 ms + 0 x the 25.0 ms the machine held it up; median 0.5 ms; 25.0 ms the machine held it up left out)"
    );
    // A hold-up longer than the update (clock granularity) leaves 0, never less.
    let mut e = Evaluator::new(Triggers {
        window: 2,
        ..Default::default()
    })
    .unwrap();
    steady(&mut e, 20, 1.0 * MS);
    let f = e
        .end_of_update(21, Some(30.0 * MS), Some(1.0), 10.0 * MS)
        .unwrap();
    assert!(
        close(f.value, 20.0 * MS) && close(f.threshold, 16.0 * MS),
        "{f:?}"
    );
    assert!(
        f.detail
            .ends_with("; 10.0 ms the machine held it up left out)"),
        "{}",
        f.detail
    );
    assert_eq!(
        e.end_of_update(22, Some(1.0 * MS), Some(1.0), 5.0 * MS),
        None
    );
    assert!(
        close(e.median(), 10.0 * MS),
        "(20 + 0) / 2 ms: {}",
        e.median()
    );
}

#[test]
fn a_spread_out_window_widens_its_own_bar() {
    // Updates alternating 10 and 30 ms (a sequence-length mix): median 20, MAD 10 ms;
    // 70 ms is 3.5x the median but 5 MADs from it, inside the window's own spread.
    let mixed = || {
        let mut e = Evaluator::new(Triggers::default()).unwrap();
        for i in 1..=64u64 {
            assert_eq!(
                e.end_of_update(
                    i,
                    Some(if i % 2 == 1 { 10.0 } else { 30.0 } * MS),
                    Some(1.0),
                    0.0
                ),
                None
            );
        }
        e
    };
    let mut e = mixed();
    assert!(
        close(e.median(), 20.0 * MS) && close(e.mad(), 10.0 * MS),
        "{} {}",
        e.median(),
        e.mad()
    );
    assert_eq!(e.end_of_update(65, Some(70.0 * MS), Some(1.0), 0.0), None);
    let f = mixed()
        .end_of_update(65, Some(130.0 * MS), Some(1.0), 0.0)
        .unwrap();
    assert!(close(f.threshold, 120.0 * MS), "{f:?}");
    assert_eq!(
        f.detail,
        "130.0 ms > 120.0 ms (median + 10 x MAD; median 20.0 ms)"
    );
}

#[test]
fn an_update_not_timed_skips_the_slow_trigger_and_the_window() {
    // warm-up 21: the 22nd update may fire only if the 21st was counted.
    let mut e = Evaluator::new(Triggers {
        warmup: 21,
        ..Default::default()
    })
    .unwrap();
    steady(&mut e, 20, 1.0 * MS);
    assert_eq!(
        e.end_of_update(21, None, Some(1.0), 0.0),
        None,
        "captured in full: its time is the capture's"
    );
    assert_eq!(
        e.end_of_update(22, Some(1.0), Some(1.0), 0.0),
        None,
        "still warming up: 21 was not counted"
    );
    assert_eq!(
        e.end_of_update(23, Some(1.0), Some(1.0), 0.0)
            .map(|f| f.trigger),
        Some(Trigger::Slow)
    );
    // The loss and the program's own trigger still count (the user's value: 0, no time).
    assert_eq!(
        e.end_of_update(24, None, Some(f64::NAN), 0.0)
            .map(|f| f.trigger),
        Some(Trigger::NonFinite)
    );
    e.ask("look");
    assert_eq!(
        e.end_of_update(25, None, Some(1.0), 0.0)
            .map(|f| (f.trigger, f.value)),
        Some((Trigger::User, 0.0))
    );
}

/// A real run's update times (bindings/python/tests/data, shared with the
/// Python binding's tests): (update, seconds, the CPU wait in them).
fn recorded(name: &str) -> Vec<(u64, f64, f64)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../python/tests/data")
        .join(name);
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(&path)
        .output()
        .expect("gzip runs (it decompresses the recorded series)");
    assert!(
        out.status.success(),
        "gzip -dc {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0], f[1] as f64 / 1e9, f[2] as f64 / 1e9)
        })
        .collect()
}

/// The updates `cfg` fires on for the series, `stall` seconds added to update `at`.
fn fired_on(cfg: &Triggers, rows: &[(u64, f64, f64)], at: u64, stall: f64) -> Vec<Fired> {
    let mut e = Evaluator::new(cfg.clone()).unwrap();
    rows.iter()
        .filter_map(|&(u, s, w)| {
            e.end_of_update(u, Some(s + if u == at { stall } else { 0.0 }), Some(1.0), w)
        })
        .collect()
}

#[test]
fn a_real_noisy_run_fires_nothing_and_a_stall_in_it_fires_at_once() {
    // The rule before this one (3x the median or median + 1 ms, the CPU wait
    // left out and nothing more) fired on these: the series have the noise.
    let old = Triggers {
        slow_min_excess: Duration::from_millis(1),
        slow_spread: 0.0,
        slow_wait_share: 0.0,
        ..Default::default()
    };
    // And the 2 ms floor before this one fired on c (a quiet AMD EPYC VM: one
    // update of 3.0 ms in 0.4 ms ones, nothing in the thread's accounts).
    let floor_2ms = Triggers {
        slow_min_excess: Duration::from_millis(2),
        ..Default::default()
    };
    let cases: [(&str, usize, &[u64]); 3] = [
        ("noisy-updates-a.txt.gz", 8, &[]),
        ("noisy-updates-b.txt.gz", 1, &[]),
        ("noisy-updates-c.txt.gz", 5, &[1125]),
    ];
    for (name, old_fired, fired_2ms) in cases {
        let rows = recorded(name);
        assert_eq!(rows.len(), 10_000, "{name}");
        assert_eq!(fired_on(&old, &rows, 0, 0.0).len(), old_fired, "{name}");
        assert_eq!(
            fired_on(&floor_2ms, &rows, 0, 0.0)
                .iter()
                .map(|f| f.update)
                .collect::<Vec<_>>(),
            fired_2ms,
            "{name}"
        );
        assert_eq!(fired_on(&Triggers::default(), &rows, 0, 0.0), [], "{name}");
        // A 6 ms stall of the program's own (a data loader's sleep: no CPU
        // wait) at three updates: 6-24x these updates, above the 5 ms floor.
        for at in [2_500, 5_000, 9_000] {
            let fired = fired_on(&Triggers::default(), &rows, at, 6.0 * MS);
            assert_eq!(
                fired
                    .iter()
                    .map(|f| (f.update, f.trigger))
                    .collect::<Vec<_>>(),
                [(at, Trigger::Slow)],
                "{name}"
            );
            assert!(
                fired[0].value > 5.0 * (fired[0].threshold - 5.0 * MS),
                "{name}: {:?}",
                fired[0]
            );
        }
    }
}

#[test]
fn non_finite_fires_once_until_finite_again_and_the_user_comes_first() {
    let mut e = Evaluator::new(Triggers {
        slow: None,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(e.end_of_update(1, Some(0.01), Some(1.0), 0.0), None);
    assert_eq!(
        e.end_of_update(2, Some(0.01), Some(f64::INFINITY), 0.0)
            .map(|f| (f.trigger, f.detail)),
        Some((Trigger::NonFinite, "loss inf".into()))
    );
    assert_eq!(
        e.end_of_update(3, Some(0.01), Some(f64::NAN), 0.0),
        None,
        "still not finite: not again"
    );
    assert_eq!(e.end_of_update(4, Some(0.01), Some(0.5), 0.0), None);
    e.ask("mine");
    let f = e.end_of_update(5, Some(0.01), Some(f64::NAN), 0.0).unwrap();
    assert_eq!(
        (f.trigger, f.detail.as_str(), f.value),
        (Trigger::User, "mine", 0.01)
    );
    assert_eq!(
        e.end_of_update(6, Some(0.01), Some(f64::NAN), 0.0),
        None,
        "the NaN of 5 was seen"
    );
}

#[test]
fn a_flight_recorded_update_holds_its_records_until_it_is_kept() {
    let dir = fresh_dir("watch-held");
    let quiet = WatchOptions {
        triggers: Triggers {
            slow: None,
            ..Triggers::default()
        },
        capture_next: false,
        ..Default::default()
    };
    let schedule =
        Schedule::watch_with(dir.path(), Run::training("rust::held", 1, "cpu"), quiet).unwrap();
    for n in 1..=3u64 {
        let u = schedule.begin_update().unwrap();
        let t = u.recorder().expect("flight-recorded").handle();
        let s = u.span("work", Step::Forward).unwrap();
        t.scalar(s.id().unwrap(), "x", n as f64).unwrap();
        drop(s);
        // In the binding, not the library: a dropped update never calls it.
        assert_eq!(t.held_records(), 1, "update {n}");
        if n == 2 {
            u.trigger("keep").unwrap();
        }
        u.end().unwrap();
    }
    schedule.finish().unwrap();
    assert_eq!(listing(dir.path()), ["update-000002-user.jsonl"]);
    let lines = lines(&dir.path().join("update-000002-user.jsonl"));
    let stats = stats_by_label(&lines);
    assert_eq!(
        stats["x"]["mean"], 2.0,
        "the kept update's own record, sent when it was written"
    );
    assert!(stats.contains_key("candle_trace/trigger/user"));
}

/// A flight recorder reads no gradient in an update it drops; in one it keeps,
/// the facts are those of the update's own gradients, reduced as it is written.
#[test]
fn a_kept_flight_update_has_its_own_gradients_read_when_it_is_written() {
    let dir = fresh_dir("watch-grads");
    let quiet = WatchOptions {
        triggers: Triggers {
            slow: None,
            ..Triggers::default()
        },
        capture_next: false,
        ..Default::default()
    };
    let mut s = mlp::setup().unwrap();
    let schedule = Schedule::watch_with(dir.path(), mlp::run_description(&s), quiet).unwrap();
    let mut norms_of_2 = std::collections::BTreeMap::new();
    for n in 1..=3u64 {
        schedule
            .update(|u| {
                let (x, y) = mlp::batch(&mut s)?;
                let loss = {
                    let _f = u.span_kind(mlp::LABELS[0], SpanKind::Module, Step::Forward)?;
                    candle_nn::loss::cross_entropy(
                        &candle_core::Module::forward(&s.model, &x)?,
                        &y,
                    )?
                };
                let held = u.recorder().expect("flight-recorded").held_records();
                let grads = u.backward_step(&mut s.opt, &loss, mlp::ROOT, &s.varmap)?;
                // no gradient fact yet: none is read unless the update is kept
                assert_eq!(u.recorder().unwrap().held_records(), held, "update {n}");
                if n == 2 {
                    for (name, var) in candle_trace::candle::named_vars(&s.varmap) {
                        let g = grads.get(&var).expect("every variable has a gradient");
                        norms_of_2
                            .insert(name, g.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt() as f64);
                    }
                    u.trigger("keep 2")?;
                }
                Ok::<_, Error>(())
            })
            .unwrap();
    }
    schedule.finish().unwrap();
    assert_eq!(listing(dir.path()), ["update-000002-user.jsonl"]);
    let kept = dir.path().join("update-000002-user.jsonl");
    assert_valid_complete(&kept);
    let grads: std::collections::BTreeMap<String, f64> = of_kind(&lines(&kept), "gradient")
        .iter()
        .map(|g| {
            (
                g["key"].as_str().unwrap().to_string(),
                g["norm"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        grads.keys().collect::<Vec<_>>(),
        norms_of_2.keys().collect::<Vec<_>>()
    );
    for (k, want) in &norms_of_2 {
        assert!(
            (grads[k] - want).abs() <= 1e-5 * want,
            "{k}: {} vs {want}",
            grads[k]
        );
    }
}
