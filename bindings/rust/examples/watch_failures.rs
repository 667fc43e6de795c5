//! Trains the MLP of `train_mlp` under a watching `Schedule` (no capture step
//! given) with one thing going wrong, and prints the triggers that fired and
//! the traces they left:
//!
//!     cargo run --example watch_failures --features candle -- slow traces/slow
//!     cargo run --example watch_failures --features candle -- nan traces/nan
//!     cargo run --example watch_failures --features candle -- error traces/error
//!     candle-graph summary traces/slow/update-000037-slow.jsonl --require-valid
//!
//! Programs (examples/common/failures.rs): `slow` (update 37's data step
//! waits 5x the others' 10 ms), `nan` (the learning rate spikes: update 20's
//! loss is NaN), `error` / `panic` (update 15's backward fails with an
//! out-of-memory-like error), `none`. `--updates N` (default 40),
//! `--aggregate SUMMARY.json` keeps whole-run statistics beside.
#[path = "common/failures.rs"]
mod failures;
#[path = "common/mlp.rs"]
mod mlp;

use std::path::PathBuf;

use candle_trace::WatchOptions;
use failures::{Failure, Wait};

fn usage() -> ! {
    eprintln!("usage: watch_failures none|slow|nan|error|panic OUT_DIR [--updates N] [--aggregate SUMMARY.json]");
    std::process::exit(2);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let failure = args
        .next()
        .and_then(|a| Failure::parse(&a))
        .unwrap_or_else(|| usage());
    let folder = PathBuf::from(args.next().unwrap_or_else(|| usage()));
    let (mut updates, mut summary) = (40u64, None);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--updates" => updates = val().parse().unwrap_or_else(|_| usage()),
            "--aggregate" => summary = Some(PathBuf::from(val())),
            _ => usage(),
        }
    }
    let wait = Wait::Sleep;
    let (mut s, schedule) =
        failures::watched(&folder, &wait, WatchOptions::default(), summary.as_deref())
            .unwrap_or_else(|e| {
                eprintln!("watch_failures: {e}");
                std::process::exit(1)
            });
    let outcome = failures::train(&mut s, &schedule, failure, updates, &wait);
    let (fired, traces) = (schedule.fired(), schedule.traces());
    let done = match &outcome {
        Ok(_) => schedule.finish().map(|f| f.findings),
        Err(e) => schedule.finish_failed(&e.to_string()).map(|_| vec![]),
    };
    let findings = done.unwrap_or_else(|e| {
        eprintln!("watch_failures: {e}");
        std::process::exit(1)
    });
    match &outcome {
        Ok(losses) => println!("{} updates, last loss {:?}", losses.len(), losses.last()),
        Err(e) => println!("the loop stopped: {e}"),
    }
    for f in &fired {
        println!(
            "update {} {}: {} (value {:.6}, threshold {:.6}) -> {:?}",
            f.update, f.trigger, f.detail, f.value, f.threshold, f.trace
        );
    }
    for t in &traces {
        println!("wrote {}", t.display());
    }
    for (t, notes) in &findings {
        println!("{}: {} finding(s)", t.display(), notes.len());
        for n in notes {
            println!("  {n}");
        }
    }
}
