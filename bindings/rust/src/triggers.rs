//! When an update is worth a trace: the triggers of a watching
//! [`crate::Schedule`], evaluated at the end of every update from a few
//! numbers, in memory that does not grow with the run. The same rules, names
//! and defaults as the Python binding's `candle_trace.torch.watch`
//! (`_triggers.py`), so both bindings keep the same updates:
//!
//! - `slow`: the update took more than [`Triggers::slow`] times the median of
//!   the last [`Triggers::window`] updates (and at least
//!   [`Triggers::slow_min_excess`] more than it), once [`Triggers::warmup`]
//!   updates have been seen. An update's time runs from its beginning (the
//!   start of the `Schedule::update` closure, or `begin_update`) to its end:
//!   the data step belongs inside it (Python's runs from one `step()` to the
//!   next, so there the loop's whole iteration counts). With the system clock
//!   an update's time leaves
//!   out the capture's own work (the session's tracer time, see
//!   [`crate::SessionRef::tracer_work`]: a full capture after a trigger would
//!   otherwise fire the trigger again for its own cost) and, on Linux, what
//!   its thread spent runnable but waiting for a CPU (a stall of the machine,
//!   not of the program). The default factor, 3, sits above what steady
//!   training shows (an update's p99 is rarely 1.5× its median on a quiet
//!   machine) and below what is worth a look (a data-loader stall, a
//!   checkpoint, a straggler are 2–10×).
//! - `non_finite`: the loss given to [`crate::Update::loss`] is NaN or
//!   infinite, on the update it first turns so (not again until it has been
//!   finite).
//! - `exception`: the update panicked or returned an error.
//! - `user`: the program called [`crate::Schedule::trigger`].
//!
//! The rule's constants live here, once ([`Triggers::default`]).

use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The slow trigger's default factor over the running median.
pub const DEFAULT_SLOW_FACTOR: f64 = 3.0;
/// Updates seen before the slow trigger may fire.
pub const DEFAULT_WARMUP: u64 = 10;
/// How many recent updates the running median is taken over.
pub const DEFAULT_WINDOW: usize = 64;
/// The least excess over the median that is slow: a sub-millisecond excess is
/// a scheduler's hiccup, not a stall worth a trace.
pub const DEFAULT_SLOW_MIN_EXCESS: Duration = Duration::from_millis(1);

/// Which triggers fire (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Triggers {
    /// The slow factor (> 1), `None` for no slow trigger.
    pub slow: Option<f64>,
    /// Updates seen before `slow` may fire (>= 1).
    pub warmup: u64,
    /// Updates the running median is taken over (>= 1).
    pub window: usize,
    /// And slower than the median by at least this much.
    pub slow_min_excess: Duration,
    /// Whether a non-finite loss fires.
    pub non_finite: bool,
    /// Whether a panic or an error inside an update fires.
    pub exception: bool,
}

impl Default for Triggers {
    fn default() -> Self {
        Triggers {
            slow: Some(DEFAULT_SLOW_FACTOR),
            warmup: DEFAULT_WARMUP,
            window: DEFAULT_WINDOW,
            slow_min_excess: DEFAULT_SLOW_MIN_EXCESS,
            non_finite: true,
            exception: true,
        }
    }
}

impl Triggers {
    /// Refuses ([`crate::Status::InvalidArgument`]) a factor that is not a
    /// finite number above 1, and a zero warm-up or window.
    pub fn check(&self) -> Result<()> {
        if let Some(k) = self.slow {
            if !(k > 1.0 && k.is_finite()) {
                return Err(Error::invalid(format!("triggers.slow must be a finite factor > 1 (or None), got {k}")));
            }
        }
        if self.warmup < 1 {
            return Err(Error::invalid("triggers.warmup must be >= 1, got 0"));
        }
        if self.window < 1 {
            return Err(Error::invalid("triggers.window must be >= 1, got 0"));
        }
        Ok(())
    }
}

/// What fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// The update was slow (value: its seconds; threshold: the limit's).
    Slow,
    /// The loss was NaN or infinite (value: the loss).
    NonFinite,
    /// The update panicked or returned an error.
    Exception,
    /// The program asked ([`crate::Schedule::trigger`]; value: the update's seconds).
    User,
}

impl Trigger {
    /// The spelling in trace names and scalars: `slow`, `non_finite`,
    /// `exception`, `user` (the Python binding's).
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Slow => "slow",
            Trigger::NonFinite => "non_finite",
            Trigger::Exception => "exception",
            Trigger::User => "user",
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One trigger that fired: on which update, why, the value against the
/// threshold, and the trace written for it (`None` when none was: the cap
/// reached, no flight recorder).
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    /// The update (one-based).
    pub update: u64,
    /// The trigger.
    pub trigger: Trigger,
    /// Its value (seconds for `slow` and `user`, the loss for `non_finite`, 0
    /// for `exception`).
    pub value: f64,
    /// The threshold the value passed (0 where there is none).
    pub threshold: f64,
    /// In words: `"52.0 ms > 3 x median 10.0 ms"`, `"loss NaN"`, the error.
    pub detail: String,
    /// The trace written for it.
    pub trace: Option<PathBuf>,
}

/// The time the slow trigger measures updates with. The system clock
/// ([`Instant`]) unless [`crate::Schedule::with_clock`] gives another, e.g. a
/// [`ManualClock`] that a test or a simulation advances: such a clock is
/// taken as the update's time as it is (the tracer's work and CPU waits,
/// measured in real time, are not subtracted from it).
pub trait Clock: Send {
    /// Time since an origin of the clock's choosing.
    fn now(&self) -> Duration;
}

/// A clock that moves only when told to ([`ManualClock::advance`]): the slow
/// trigger made deterministic. Clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

/// The system clock.
#[derive(Debug)]
pub(crate) struct SystemClock(Instant);

impl SystemClock {
    pub(crate) fn new() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// How long the calling thread has waited, runnable, for a CPU: the second
/// field of Linux's `/proc/thread-self/schedstat` (ns on a runqueue); 0
/// elsewhere. [`CpuWait::take`] is the wait since the call before, on the
/// thread of the call before (a new thread starts from 0).
#[derive(Debug, Default)]
pub(crate) struct CpuWait {
    #[cfg(target_os = "linux")]
    file: Option<(std::fs::File, std::thread::ThreadId)>,
    last: u64,
}

impl CpuWait {
    #[cfg(target_os = "linux")]
    fn read(file: &std::fs::File) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = file.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().nth(1)?.parse().ok()
    }

    /// Seconds waited since the call before on this thread.
    #[cfg(target_os = "linux")]
    pub(crate) fn take(&mut self) -> f64 {
        let me = std::thread::current().id();
        if self.file.as_ref().map(|f| f.1) != Some(me) {
            self.file = std::fs::File::open("/proc/thread-self/schedstat").ok().map(|f| (f, me));
            self.last = self.file.as_ref().and_then(|f| Self::read(&f.0)).unwrap_or(0);
            return 0.0;
        }
        let Some(now) = self.file.as_ref().and_then(|f| Self::read(&f.0)) else { return 0.0 };
        let waited = now.saturating_sub(self.last);
        self.last = now;
        waited as f64 / 1e9
    }

    /// Seconds waited since the call before (0: not measured here).
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn take(&mut self) -> f64 {
        let _ = self.last;
        0.0
    }
}

/// The triggers' state over a run: the last `window` update times, also kept
/// sorted for the median.
#[derive(Debug)]
pub struct Evaluator {
    cfg: Triggers,
    times: VecDeque<f64>,
    sorted: Vec<f64>,
    seen: u64,
    loss_was_finite: bool,
    asked: Option<String>,
}

impl Evaluator {
    /// The state of a run that has seen no update; refuses a bad `cfg`
    /// ([`Triggers::check`]).
    pub fn new(cfg: Triggers) -> Result<Self> {
        cfg.check()?;
        Ok(Evaluator { cfg, times: VecDeque::new(), sorted: Vec::new(), seen: 0, loss_was_finite: true, asked: None })
    }

    /// The configuration.
    pub fn triggers(&self) -> &Triggers {
        &self.cfg
    }

    /// The program's own trigger, for the update under way.
    pub fn ask(&mut self, why: &str) {
        self.asked = Some(if why.is_empty() { "trigger()".to_string() } else { why.to_string() });
    }

    /// The median of the update times in the window (0 before the first).
    pub fn median(&self) -> f64 {
        let s = &self.sorted;
        let n = s.len();
        if n == 0 {
            0.0
        } else {
            (s[(n - 1) / 2] + s[n / 2]) / 2.0
        }
    }

    /// The first trigger that fires for the update just ended (user,
    /// non-finite, slow), its `trace` not yet written; the update's time
    /// (`seconds` less `cpu_wait`) joins the window either way.
    pub fn end_of_update(&mut self, update: u64, seconds: f64, loss: Option<f64>, cpu_wait: f64) -> Option<Fired> {
        let waited = cpu_wait.max(0.0).min(seconds.max(0.0));
        let seconds = seconds - waited;
        let fired_at = |trigger, value, threshold, detail| Some(Fired { update, trigger, value, threshold, detail, trace: None });
        let mut fired = None;
        if let Some(why) = self.asked.take() {
            fired = fired_at(Trigger::User, seconds, 0.0, why);
        }
        if let Some(loss) = loss {
            let finite = loss.is_finite();
            if self.cfg.non_finite && !finite && self.loss_was_finite && fired.is_none() {
                fired = fired_at(Trigger::NonFinite, loss, 0.0, format!("loss {loss}"));
            }
            self.loss_was_finite = finite;
        }
        if let Some(k) = self.cfg.slow {
            if fired.is_none() && self.seen >= self.cfg.warmup {
                let median = self.median();
                let limit = (k * median).max(median + self.cfg.slow_min_excess.as_secs_f64());
                if seconds > limit {
                    let wait = if waited > 0.0 { format!(" ({:.1} ms waiting for a CPU left out)", waited * 1e3) } else { String::new() };
                    let detail = format!("{:.1} ms > {k} x median {:.1} ms{wait}", seconds * 1e3, median * 1e3);
                    fired = fired_at(Trigger::Slow, seconds, limit, detail);
                }
            }
        }
        self.add(seconds);
        fired
    }

    fn add(&mut self, seconds: f64) {
        self.seen += 1;
        self.times.push_back(seconds);
        let at = self.sorted.partition_point(|&x| x < seconds);
        self.sorted.insert(at, seconds);
        if self.times.len() > self.cfg.window {
            let old = self.times.pop_front().expect("longer than the window");
            let at = self.sorted.partition_point(|&x| x < old);
            self.sorted.remove(at);
        }
    }
}
