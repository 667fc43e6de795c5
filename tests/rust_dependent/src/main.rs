//! A dependent crate's binary: one measured update with a forward span and a
//! loss, written to the trace path given as the only argument.
use candle_trace::{Run, Session, Step};
use std::process::ExitCode;

fn run(path: &str) -> candle_trace::Result<std::path::PathBuf> {
    let session = Session::open(path, Run::training("rust_dependent::train", 1, "cpu"))?;
    {
        let _update = session.measure("train/update")?;
        let forward = session.step_span("train/forward", Step::Forward);
        session.scalar(&forward, "loss", 0.5)?;
    }
    // finish() returns the trace's path with its findings (none here).
    Ok(session.finish()?.into_path())
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: rust_dependent TRACE");
        return ExitCode::from(2);
    };
    match run(&path) {
        Ok(written) => {
            println!("wrote {}", written.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rust_dependent: {e}");
            ExitCode::FAILURE
        }
    }
}
