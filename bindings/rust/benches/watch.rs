//! Per-update cost of a watching Schedule on the train_mlp example's update
//! (MLP 64-64-10, batch 32, f32, cpu), every kind in the same run,
//! interleaved:
//!
//! - `aggregated`: `Schedule::new` keeping aggregate statistics only (the
//!   capture step never reached) — the peer;
//! - `triggers`: `Schedule::watch` with the flight recorder off and no trace
//!   left to write (`max_traces` 0): the triggers' evaluation alone;
//! - `flight`: `Schedule::watch` with the flight recorder on (a buffered
//!   session per update, reopened with `ct_reopen`, its spans, the two
//!   `Traced` ops and the gradient facts, dropped at the end), the slow factor
//!   set out of reach so that no capture is written and every update pays the
//!   steady cost;
//! - `untraced`: the same arithmetic with no schedule.
//!
//!     cargo bench --features candle --bench watch
//!
//! Each kind has its own model, schedule and aggregate session; the body is
//! one closure for all. Medians over ROUNDS updates of each. Then 10,000
//! more flight-recorded updates alone, the resident set sampled every 1,000
//! (the recorder's memory must not grow with the run).
#[path = "../examples/common/mlp.rs"]
mod mlp;

use std::time::Instant;

use candle_core::Module;
use candle_trace::{Run, Schedule, SpanKind, Step, Triggers, WatchOptions};

const WARMUP: usize = 30;
const ROUNDS: usize = 800;
const LONG_RUN: u64 = 10_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// One update, as a watched training loop writes it.
fn update(schedule: &Schedule, s: &mut mlp::Setup) -> candle_trace::Result<f32> {
    schedule.update(|u| {
        let (x, y) = {
            let _d = u.span(mlp::AGG_DATA, Step::None)?;
            mlp::batch(s)?
        };
        let loss = {
            let f = u.span_kind(mlp::LABELS[0], SpanKind::Module, Step::Forward)?;
            let logits = s.model.forward(&x)?;
            f.record_tensor_stats("logits", &logits)?;
            candle_nn::loss::cross_entropy(&logits, &y)?
        };
        let value = u.loss_of(&loss)?;
        u.backward_step(&mut s.opt, &loss, mlp::ROOT, &s.varmap)?;
        Ok(value)
    })
}

fn main() {
    let dir = std::env::temp_dir().join(format!("candle-trace-bench-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let never = Triggers {
        slow: Some(1e9),
        ..Default::default()
    };
    let mut kinds: Vec<(&str, mlp::Setup, Option<Schedule>)> = Vec::new();
    for name in ["untraced", "aggregated", "triggers", "flight"] {
        let s = mlp::setup().unwrap();
        let run = mlp::run_description(&s);
        let summary = dir.join(format!("{name}.json"));
        let schedule = match name {
            "untraced" => None,
            "aggregated" => Some(Schedule::new(
                dir.join("never.jsonl"),
                Run::training("mlp::train", u64::MAX / 2, "cpu"),
            )),
            "triggers" => Some(
                Schedule::watch_with(
                    dir.join(name),
                    run,
                    WatchOptions {
                        max_traces: 0,
                        flight_recorder: None,
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
            _ => Some(
                Schedule::watch_with(
                    dir.join(name),
                    run,
                    WatchOptions {
                        triggers: never.clone(),
                        ..Default::default()
                    },
                )
                .unwrap(),
            ),
        };
        let schedule = schedule.map(|sc| {
            sc.with_update_span(mlp::AGG_STEP)
                .with_aggregate(&summary, None)
                .unwrap()
        });
        kinds.push((name, s, schedule));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); kinds.len()];
    for round in 0..WARMUP + ROUNDS {
        // Each kind takes its turn at being first.
        for k in 0..kinds.len() {
            let i = (round + k) % kinds.len();
            let (_, s, schedule) = &mut kinds[i];
            let t = Instant::now();
            match schedule {
                Some(sc) => {
                    update(sc, s).unwrap();
                }
                None => {
                    let (x, y) = mlp::batch(s).unwrap();
                    mlp::plain_update(s, &x, &y).unwrap();
                }
            }
            if round >= WARMUP {
                times[i].push(t.elapsed().as_nanos() as f64);
            }
        }
    }
    // The flight recorder's memory over a long run: 10,000 more updates of
    // the flight kind alone, the process's resident set every 1,000.
    let mut rss = vec![rss_kib()];
    {
        let (_, s, schedule) = &mut kinds[3];
        let sc = schedule.as_ref().unwrap();
        for n in 1..=LONG_RUN {
            update(sc, s).unwrap();
            if n % 1000 == 0 {
                rss.push(rss_kib());
            }
        }
    }
    let mut written = 0;
    let mut recorder_cost = None;
    for (_, _, schedule) in kinds.iter_mut() {
        if let Some(sc) = schedule.take() {
            let done = sc.finish().unwrap();
            written += done.traces.len();
            recorder_cost = recorder_cost.or(done.recorder_cost);
            assert!(
                done.fired.is_empty() || done.traces.is_empty(),
                "{:?}",
                done.fired
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med: Vec<f64> = times.into_iter().map(median).collect();
    println!("updates per kind: {ROUNDS} (+{WARMUP} warm-up), MLP 64-64-10, batch 32, f32, cpu, interleaved; traces written: {written}");
    for (i, (name, _, _)) in kinds.iter().enumerate() {
        println!("{name:<11} update_us median {:8.1}", med[i] / 1e3);
    }
    let (u, a, t, f) = (med[0], med[1], med[2], med[3]);
    println!("aggregated / untraced: {:.3}x", a / u);
    println!(
        "triggers   / aggregated: {:.3}x (+{:.2} us)",
        t / a,
        (t - a) / 1e3
    );
    println!(
        "flight     / aggregated: {:.3}x (+{:.2} us)",
        f / a,
        (f - a) / 1e3
    );
    match recorder_cost {
        Some(c) => println!(
            "flight recorder (Schedule::recorder_cost): adds {:.1}% to its updates, at least",
            c * 100.0
        ),
        None => println!("flight recorder's own work: not measured"),
    }
    let mib: Vec<String> = rss
        .iter()
        .map(|k| format!("{:.1}", *k as f64 / 1024.0))
        .collect();
    println!(
        "flight recorder, {LONG_RUN} more updates: RSS MiB every 1,000: {}",
        mib.join(" ")
    );
}

/// VmRSS of this process in KiB (0 where /proc has none).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
