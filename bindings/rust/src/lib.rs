//! Rust binding of candle-trace: capture one representative training (or
//! inference) step of a program as a `candle-graph/trace/10` JSONL trace.
//!
//! ```no_run
//! use candle_trace::{Run, Session, Step};
//!
//! # fn main() -> candle_trace::Result<()> {
//! let session = Session::open("traces/step.jsonl", Run::training("mlp::train", 3, "cpu"))?;
//! {
//!     let update = session.measure("train/update")?;      // the one measured region
//!     {
//!         let fwd = session.step_span("train/forward", Step::Forward);
//!         session.scalar(&fwd, "loss", 0.25)?;
//!     }                                                     // span ends here
//!     let _bwd = session.step_span("train/backward", Step::Backward);
//! #   drop(_bwd); drop(update);
//! }
//! let path = session.finish()?;
//! # let _ = path; Ok(()) }
//! ```
//!
//! The library is candle-trace's Go library, built by this crate's build.rs
//! and linked statically unless `CANDLE_TRACE_LIB_DIR` names a shared one
//! (README.md says how and why; its C ABI is `include/candle_trace.h`, which
//! [`ffi`] mirrors). Features: `candle` (capture helpers for candle-core
//! and candle-nn: [`candle`]), `tracing` (a `tracing_subscriber::Layer`:
//! [`layer`]). A [`Schedule`] runs a training loop's updates: aggregate
//! statistics of all, traces of the ones that go wrong ([`triggers`]).
//! Host heap memory of a captured update comes from an opt-in global
//! allocator: [`heap`].
#![deny(unsafe_op_in_unsafe_fn)]

pub mod ffi;
pub mod heap;

mod contract;
mod device;
mod error;
mod finding;
mod held;
mod run;
mod schedule;
mod session;
pub mod triggers;

#[cfg(feature = "candle")]
pub mod candle;

#[cfg(feature = "tracing")]
pub mod layer;

pub use contract::{family_of, Expectation, ExpectedGradient, GradientContract, GradientFamily};
pub use device::{Collector, DeviceOptions, UnspannedLaunches};
pub use error::{Error, Result, Status};
pub use finding::{Completed, Finding, ParameterState, Severity};
pub use run::{
    CaptureContract, ComparisonIdentity, Level, MeasurementScope, Phase, Run, TimingMode,
};
pub use schedule::{
    Finished, Schedule, Update, UpdateSpan, WatchOptions, DEFAULT_MAX_TRACES,
    DEFAULT_RECORDER_BYTES, DEFAULT_UPDATE_SPAN, RECORDER_SHARE,
};
pub use session::{
    check_abi, current, library_version, with_current, Active, Category, DeviceInterval,
    DeviceMemory, Gradient, Measured, Memory, MemoryAction, Op, Session, SessionRef, SpanGuard,
    SpanId, SpanKind, Step, TensorMeta, TensorStats, TracerWork, TriggerTrace,
};
pub use triggers::{Clock, Fired, ManualClock, Trigger, Triggers};
