//! The failure programs of issue 13 on the MLP of `train_mlp` (synthetic
//! data), watched by a [`Schedule`] with no capture step given, shared by the
//! `watch_failures` example, its test and its benchmark:
//!
//! - `slow`: update 37's data step waits 5x as long as every other one's;
//! - `nan`: the learning rate spikes at update 19, so update 20's loss is NaN;
//! - `error`: update 15's backward returns an out-of-memory-like error;
//! - `panic`: update 15's backward panics with it.
//!
//! Every update runs the same body through `Schedule::update`; the data
//! step's wait goes through [`Wait`]: a real sleep in the example, a
//! [`ManualClock`] the schedule times updates with in the test (so the slow
//! trigger sees exactly 10 ms per update and 50 ms for update 37, whatever
//! the machine does).
#![allow(dead_code)]
use std::path::Path;
use std::time::Duration;

use candle_core::Module;
use candle_nn::Optimizer;
use candle_trace::{ManualClock, Run, Schedule, SpanKind, Step, WatchOptions};

use crate::mlp::{self, Setup, LABELS, ROOT};

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Nothing.
    None,
    /// Update [`SLOW_UPDATE`]'s data step waits [`SLOW_FACTOR`] x [`DATA_WAIT`].
    Slow,
    /// The learning rate spikes at update [`NAN_UPDATE`] - 1.
    Nan,
    /// Update [`ERROR_UPDATE`]'s backward returns an error.
    Error,
    /// Update [`ERROR_UPDATE`]'s backward panics.
    Panic,
}

impl Failure {
    /// The program's name on the example's command line.
    pub fn parse(s: &str) -> Option<Failure> {
        Some(match s {
            "none" => Failure::None,
            "slow" => Failure::Slow,
            "nan" => Failure::Nan,
            "error" => Failure::Error,
            "panic" => Failure::Panic,
            _ => return None,
        })
    }
}

pub const SLOW_UPDATE: u64 = 37;
pub const NAN_UPDATE: u64 = 20;
pub const ERROR_UPDATE: u64 = 15;
/// Every update's data step waits this long (the update's median, nearly).
pub const DATA_WAIT: Duration = Duration::from_millis(10);
/// The slow update's data step waits this many times as long.
pub const SLOW_FACTOR: u32 = 5;
/// What update [`ERROR_UPDATE`] fails with (`error` and `panic`).
pub const OOM: &str = "CUDA out of memory. Tried to allocate 20.00 GiB";
/// The spiked learning rate of `nan`.
pub const SPIKE_LR: f64 = 1e38;

/// How the data step's wait passes.
#[derive(Debug, Clone)]
pub enum Wait {
    /// A real sleep; updates timed by the system clock.
    Sleep,
    /// The schedule's clock is advanced instead (nothing else moves it).
    Clock(ManualClock),
}

impl Wait {
    fn wait(&self, d: Duration) {
        match self {
            Wait::Sleep => std::thread::sleep(d),
            Wait::Clock(c) => c.advance(d),
        }
    }
}

/// The run of every trace the watch writes: the MLP's contract (its
/// gradients, the three phase labels) and identity.
pub fn run(s: &Setup) -> Run {
    mlp::run_description(s).tag("program", "watch_failures")
}

/// The model, and the schedule watching it into `folder` (aggregate
/// statistics in `summary` when given).
pub fn watched(
    folder: &Path,
    wait: &Wait,
    opts: WatchOptions,
    summary: Option<&Path>,
) -> candle_trace::Result<(Setup, Schedule)> {
    let s = mlp::setup()?;
    let mut schedule = Schedule::watch_with(folder, run(&s), opts)?;
    if let Wait::Clock(c) = wait {
        schedule = schedule.with_clock(c.clone());
    }
    if let Some(p) = summary {
        schedule = schedule.with_aggregate(p, None)?;
    }
    Ok((s, schedule))
}

/// Trains `updates` updates of the MLP under `schedule`, `failure` going
/// wrong on its update. Returns the losses, or the first error (`error`).
pub fn train(
    s: &mut Setup,
    schedule: &Schedule,
    failure: Failure,
    updates: u64,
    wait: &Wait,
) -> candle_trace::Result<Vec<f32>> {
    let mut losses = Vec::with_capacity(updates as usize);
    for n in 1..=updates {
        let loss = schedule.update(|u| {
            let (x, y) = {
                let _d = u.span("train/data", Step::None)?;
                let slow = failure == Failure::Slow && n == SLOW_UPDATE;
                wait.wait(if slow {
                    DATA_WAIT * SLOW_FACTOR
                } else {
                    DATA_WAIT
                });
                mlp::batch(s)?
            };
            let loss = {
                let f = u.span_kind(LABELS[0], SpanKind::Module, Step::Forward)?;
                let logits = s.model.forward(&x)?;
                f.record_tensor_stats("logits", &logits)?;
                candle_nn::loss::cross_entropy(&logits, &y)?
            };
            let value = u.loss_of(&loss)?;
            if matches!(failure, Failure::Error | Failure::Panic) && n == ERROR_UPDATE {
                let _b = u.span(LABELS[1], Step::Backward)?;
                if failure == Failure::Panic {
                    panic!("{OOM}");
                }
                return Err(candle_core::Error::Msg(OOM.into()).into());
            }
            if failure == Failure::Nan && n == NAN_UPDATE - 1 {
                s.opt.set_learning_rate(SPIKE_LR);
            }
            u.backward_step(&mut s.opt, &loss, ROOT, &s.varmap)?;
            Ok::<_, candle_trace::Error>(value)
        })?;
        losses.push(loss);
    }
    Ok(losses)
}
