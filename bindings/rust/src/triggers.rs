//! When an update is worth a trace: the triggers of a watching
//! [`crate::Schedule`], evaluated at the end of every update from a few
//! numbers, in memory that does not grow with the run. The same rules, names,
//! defaults and details as the Python binding's `candle_trace.torch.watch`
//! (`bindings/python/candle_trace/torch/_triggers.py`, whose doc gives the
//! measurements behind the defaults), so both bindings keep the same updates:
//!
//! - `slow`: the update took longer than the median of the last
//!   [`Triggers::window`] updates (once [`Triggers::warmup`] have been seen)
//!   plus an excess that clears three bars at once: `(slow - 1) x median`
//!   ([`Triggers::slow`], 3: steady training's p99 is rarely 1.5x its
//!   median, a data-loader stall or a checkpoint is 2-10x);
//!   [`Triggers::slow_spread`] (10) times the window's median absolute
//!   deviation (a workload that varies by nature widens its own bar); and
//!   [`Triggers::slow_min_excess`] (5 ms: a VM's own stalls of a sub-ms
//!   update reach 2.5-5 ms with nothing in the thread's accounts) plus
//!   [`Triggers::slow_wait_share`] (1) times the time the machine held the
//!   update up — on Linux the time its thread waited, runnable, for a CPU
//!   (schedstat) and, when it never blocked in the update (no voluntary
//!   context switch), all of its time off the CPU (a vCPU the host took
//!   away). That hold-up is also left out of the update's time: a stall of
//!   the machine, not of the program, which a trace would not explain; and a
//!   thread the machine held up comes back to cold caches, an excess up to
//!   the hold-up itself.
//!   An update's time runs from its beginning (the start of the
//!   `Schedule::update` closure, or `begin_update`) to its end: the data step
//!   belongs inside it (Python's runs from one `step()` to the next). It
//!   leaves out the flight recorder's tracer time
//!   ([`crate::SessionRef::tracer_work`]); an update captured in full (after
//!   a trigger) is not timed at all: its statistics cost several times the
//!   update, and would fire the trigger again for itself. With a clock other
//!   than the system's ([`crate::Schedule::with_clock`]) the update's time is
//!   the clock's as it is.
//! - `non_finite`: the loss given to [`crate::Update::loss`] is NaN or
//!   infinite, on the update it first turns so (not again until it has been
//!   finite).
//! - `exception`: the update panicked or returned an error.
//! - `user`: the program called [`crate::Schedule::trigger`].
//!
//! The rule's constants live here, once (`DEFAULT_*`, [`Triggers::default`]).

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
/// The least excess over the median that is slow, before the hold-up's
/// share: a smaller excess is the machine's hiccup, not a stall worth a trace.
pub const DEFAULT_SLOW_MIN_EXCESS: Duration = Duration::from_millis(5);
/// How many median absolute deviations of the window the excess must pass.
pub const DEFAULT_SLOW_SPREAD: f64 = 10.0;
/// The share of the time the machine held the update up that is added to
/// [`DEFAULT_SLOW_MIN_EXCESS`].
pub const DEFAULT_SLOW_WAIT_SHARE: f64 = 1.0;
/// A hold-up from this long on (seconds) is named in a firing's detail.
const HELD_UP_SHOWN: f64 = 5e-5;

/// Which triggers fire (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Triggers {
    /// The slow factor (> 1), `None` for no slow trigger.
    pub slow: Option<f64>,
    /// Updates seen before `slow` may fire (>= 1).
    pub warmup: u64,
    /// Updates the running median is taken over (>= 1).
    pub window: usize,
    /// And slower than the median by at least this much plus
    /// `slow_wait_share` x the time the machine held the update up.
    pub slow_min_excess: Duration,
    /// And by more than this many median absolute deviations of the window
    /// (>= 0).
    pub slow_spread: f64,
    /// The share of the machine's hold-up added to `slow_min_excess` (>= 0).
    pub slow_wait_share: f64,
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
            slow_spread: DEFAULT_SLOW_SPREAD,
            slow_wait_share: DEFAULT_SLOW_WAIT_SHARE,
            non_finite: true,
            exception: true,
        }
    }
}

impl Triggers {
    /// Refuses ([`crate::Status::InvalidArgument`]) a factor that is not a
    /// finite number above 1, a zero warm-up or window, and a spread or a
    /// wait share that is not a number >= 0.
    pub fn check(&self) -> Result<()> {
        if let Some(k) = self.slow {
            if !(k > 1.0 && k.is_finite()) {
                return Err(Error::invalid(format!(
                    "triggers.slow must be a finite factor > 1 (or None), got {k}"
                )));
            }
        }
        if self.warmup < 1 {
            return Err(Error::invalid("triggers.warmup must be >= 1, got 0"));
        }
        if self.window < 1 {
            return Err(Error::invalid("triggers.window must be >= 1, got 0"));
        }
        for (name, v) in [
            ("slow_spread", self.slow_spread),
            ("slow_wait_share", self.slow_wait_share),
        ] {
            if v.is_nan() || v < 0.0 {
                return Err(Error::invalid(format!(
                    "triggers.{name} must be a number >= 0, got {v}"
                )));
            }
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
    /// The program asked ([`crate::Schedule::trigger`]; value: the update's
    /// seconds, the machine's hold-up included; 0 when it is not timed).
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
    /// In words: `"68.1 ms > 32.6 ms (3 x median; median 10.9 ms)"`,
    /// `"loss NaN"`, the error.
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

/// How long the machine held the calling thread up (seconds): the time it
/// waited, runnable, for a CPU (the second field of Linux's
/// `/proc/thread-self/schedstat`, ns on a runqueue) and — given the
/// interval's wall time — the time it was off its CPU without having blocked
/// (no voluntary context switch: it neither slept nor waited for I/O or a
/// lock, so the time is a vCPU the host took away, an interrupt's, the
/// machine's in any case). A thread that blocked keeps its off-CPU time: a
/// data loader's wait is the program's. [`CpuWait::take`] covers the time
/// since the call before, on the thread of the call before (a new thread
/// starts from 0). 0 where not measured (not Linux; the off-CPU part needs
/// 64-bit Linux).
///
/// To read the CPU clock of the running thread the kernel takes its
/// scheduler's lock, and on a VM whose other vCPU holds that lock when the
/// host preempts it the read waits for the host (the likely cause of what
/// was seen): on the 2-vCPU VM of
/// BENCHMARKS.md, for stretches of an hour, ~5 ms in 1–3% of the reads made
/// after a millisecond of work (130–640 µs on average). A read slower than
/// [`CpuWait::SLOW_READ`] makes the next [`CpuWait::FALLBACK_TAKES`] calls use
/// schedstat's own CPU time (its first field, read with the wait anyway),
/// which is up to a tick behind at each end, so off-CPU time then counts
/// only beyond [`CpuWait::TICK_S`].
#[derive(Debug, Default)]
pub(crate) struct CpuWait {
    #[cfg(target_os = "linux")]
    thread: Option<std::thread::ThreadId>,
    #[cfg(target_os = "linux")]
    file: Option<std::fs::File>,
    /// The runqueue ns at the call before.
    last: u64,
    /// The thread's CPU ns at the call before, from its clock (`None`: not
    /// read).
    cpu: Option<u64>,
    /// The thread's CPU ns at the call before, from schedstat.
    sched: Option<u64>,
    /// Its voluntary context switches at the call before.
    blocks: Option<i64>,
    /// Calls left that do not read the clock (after a slow read).
    fallback: u32,
}

impl CpuWait {
    /// A read of the CPU clock slower than this is the host's lock-holder
    /// preemption.
    pub(crate) const SLOW_READ: Duration = Duration::from_millis(1);
    /// Calls that use schedstat's CPU time after a slow read.
    pub(crate) const FALLBACK_TAKES: u32 = 1000;
    /// Seconds: the most schedstat's CPU time can be off at both ends of an
    /// interval together (a tick at CONFIG_HZ=250), taken off the off-CPU
    /// time when it is used.
    pub(crate) const TICK_S: f64 = 0.004;

    /// The thread's (CPU ns, runqueue ns) from schedstat.
    #[cfg(target_os = "linux")]
    fn read(file: &std::fs::File) -> Option<(u64, u64)> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = file.read_at(&mut buf, 0).ok()?;
        Self::parse(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// A schedstat line's (CPU ns, runqueue ns).
    #[cfg(target_os = "linux")]
    fn parse(line: &str) -> Option<(u64, u64)> {
        let mut f = line.split_whitespace();
        Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
    }

    /// The thread's CPU clock, unless a slow read made the calls go without.
    #[cfg(target_os = "linux")]
    fn read_clock(&mut self) -> Option<u64> {
        if self.fallback > 0 {
            self.fallback -= 1;
            return None;
        }
        let t = Instant::now();
        let ns = sys::thread_cpu_ns();
        if t.elapsed() > Self::SLOW_READ {
            self.fallback = Self::FALLBACK_TAKES;
        }
        ns
    }

    /// Seconds the machine held the thread up since the call before on this
    /// thread; `wall`, the interval's wall time (seconds), adds the off-CPU
    /// time of a thread that never blocked in it.
    #[cfg(target_os = "linux")]
    pub(crate) fn take(&mut self, wall: Option<f64>) -> f64 {
        let cpu = self.read_clock();
        let me = std::thread::current().id();
        if self.thread != Some(me) {
            self.thread = Some(me);
            self.file = std::fs::File::open("/proc/thread-self/schedstat").ok();
            let stat = self.file.as_ref().and_then(Self::read);
            self.last = stat.map_or(0, |s| s.1);
            (self.cpu, self.sched, self.blocks) =
                (cpu, stat.map(|s| s.0), sys::voluntary_switches());
            return 0.0;
        }
        let stat = self.file.as_ref().and_then(Self::read);
        let now = stat.map_or(self.last, |s| s.1);
        let waited = now.saturating_sub(self.last) as f64 / 1e9;
        self.last = now;
        let sched = stat.map(|s| s.0);
        let elapsed = |now: Option<u64>, then: Option<u64>| {
            now.zip(then)
                .map(|(c, c0)| c.saturating_sub(c0) as f64 / 1e9)
        };
        // The clock at both ends, else schedstat's (less what its error could
        // make of nothing).
        let ran = match elapsed(cpu, self.cpu) {
            Some(ran) => Some(ran),
            None => elapsed(sched, self.sched).map(|ran| ran + Self::TICK_S),
        };
        (self.cpu, self.sched) = (cpu, sched);
        let off = wall.zip(ran).map(|(wall, ran)| wall - ran);
        if matches!(off, Some(off) if off <= waited) {
            // Nothing to add (the usual update: on its CPU all along), so no
            // asking whether it blocked; a call without wall time (the next
            // update's start) asks afresh.
            self.blocks = None;
            return waited;
        }
        let blocks = sys::voluntary_switches();
        let slept = blocks.is_none() || blocks != self.blocks;
        self.blocks = blocks;
        match off {
            // It never blocked: all of its off-CPU time was the machine's.
            Some(off) if !slept => waited.max(off),
            _ => waited,
        }
    }

    /// Seconds the machine held the thread up (0: not measured here).
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn take(&mut self, _wall: Option<f64>) -> f64 {
        let _ = (self.last, self.cpu, self.sched, self.blocks, self.fallback);
        0.0
    }
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: schedstat's own
/// figure for a running thread lags up to a scheduler tick behind) and its
/// voluntary context switches (`getrusage(RUSAGE_THREAD)`), from the C
/// library std links anyway: two calls declared here rather than a
/// dependency, with the layouts of 64-bit Linux (glibc and musl alike).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::os::raw::{c_int, c_long};

    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: c_long,
    }

    /// `struct rusage`: two `timeval`s, 14 `long`s (`ru_nvcsw` the 13th),
    /// and musl's 16 reserved ones.
    #[repr(C)]
    struct Rusage {
        times: [c_long; 4],
        counts: [c_long; 14],
        reserved: [c_long; 16],
    }

    const CLOCK_THREAD_CPUTIME_ID: c_int = 3;
    const RUSAGE_THREAD: c_int = 1;

    extern "C" {
        fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
        fn getrusage(who: c_int, usage: *mut Rusage) -> c_int;
    }

    pub(super) fn thread_cpu_ns() -> Option<u64> {
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: a valid out-pointer to a timespec of this platform's layout.
        let ok = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
        ok.then(|| ts.sec as u64 * 1_000_000_000 + ts.nsec as u64)
    }

    pub(super) fn voluntary_switches() -> Option<i64> {
        let mut ru = Rusage {
            times: [0; 4],
            counts: [0; 14],
            reserved: [0; 16],
        };
        // SAFETY: a valid out-pointer, at least as large as the struct rusage
        // of this platform.
        let ok = unsafe { getrusage(RUSAGE_THREAD, &mut ru) } == 0;
        ok.then_some(ru.counts[12])
    }
}

/// Neither measured elsewhere: only the runqueue wait counts there.
#[cfg(all(target_os = "linux", not(target_pointer_width = "64")))]
mod sys {
    pub(super) fn thread_cpu_ns() -> Option<u64> {
        None
    }

    pub(super) fn voluntary_switches() -> Option<i64> {
        None
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
        Ok(Evaluator {
            cfg,
            times: VecDeque::new(),
            sorted: Vec::new(),
            seen: 0,
            loss_was_finite: true,
            asked: None,
        })
    }

    /// The configuration.
    pub fn triggers(&self) -> &Triggers {
        &self.cfg
    }

    /// The program's own trigger, for the update under way.
    pub fn ask(&mut self, why: &str) {
        self.asked = Some(if why.is_empty() {
            "trigger()".to_string()
        } else {
            why.to_string()
        });
    }

    /// How many updates' times the slow trigger has seen (an update captured
    /// in full is not timed).
    pub fn timed(&self) -> u64 {
        self.seen
    }

    /// Whether the slow trigger can fire: on, and [`Triggers::warmup`]
    /// updates timed.
    pub fn slow_armed(&self) -> bool {
        self.cfg.slow.is_some() && self.seen >= self.cfg.warmup
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

    /// The window's median absolute deviation from its median.
    pub fn mad(&self) -> f64 {
        let median = self.median();
        let mut dev: Vec<f64> = self.sorted.iter().map(|x| (x - median).abs()).collect();
        dev.sort_by(f64::total_cmp);
        let n = dev.len();
        if n == 0 {
            0.0
        } else {
            (dev[(n - 1) / 2] + dev[n / 2]) / 2.0
        }
    }

    /// The first trigger that fires for the update just ended (user,
    /// non-finite, slow), its `trace` not yet written. The update's time is
    /// `seconds` less `cpu_wait` (the time the machine held its thread up),
    /// and joins the window; `seconds` `None`: the update is not timed
    /// (captured in full: its time is the capture's), the slow trigger skips
    /// it.
    pub fn end_of_update(
        &mut self,
        update: u64,
        seconds: Option<f64>,
        loss: Option<f64>,
        cpu_wait: f64,
    ) -> Option<Fired> {
        let fired_at = |trigger, value, threshold, detail| {
            Some(Fired {
                update,
                trigger,
                value,
                threshold,
                detail,
                trace: None,
            })
        };
        let mut fired = None;
        if let Some(why) = self.asked.take() {
            fired = fired_at(Trigger::User, seconds.unwrap_or(0.0), 0.0, why);
        }
        if let Some(loss) = loss {
            let finite = loss.is_finite();
            if self.cfg.non_finite && !finite && self.loss_was_finite && fired.is_none() {
                fired = fired_at(Trigger::NonFinite, loss, 0.0, format!("loss {loss}"));
            }
            self.loss_was_finite = finite;
        }
        let Some(seconds) = seconds else { return fired };
        let waited = cpu_wait.max(0.0).min(seconds.max(0.0));
        let seconds = seconds - waited;
        if fired.is_none() && self.slow_armed() {
            fired = self.slow(update, seconds, waited);
        }
        self.add(seconds);
        fired
    }

    /// The slow trigger (see the module's doc): the cheap bars first, the
    /// spread's (a sort of the window) only for an update that clears them;
    /// the words only for one that fires.
    fn slow(&self, update: u64, seconds: f64, waited: f64) -> Option<Fired> {
        let k = self.cfg.slow?;
        let median = self.median();
        let (min_excess, share, spread) = (
            self.cfg.slow_min_excess.as_nanos() as f64,
            self.cfg.slow_wait_share,
            self.cfg.slow_spread,
        );
        let bars = [(k - 1.0) * median, min_excess / 1e9 + share * waited];
        if seconds <= median + bars[0].max(bars[1]) {
            return None;
        }
        let bars = [bars[0], bars[1], spread * self.mad()];
        // The largest bar, the first of equals (as Python's max()).
        let at = (1..3).fold(0, |at, i| if bars[i] > bars[at] { i } else { at });
        let limit = median + bars[at];
        if seconds <= limit {
            return None;
        }
        let held = waited >= HELD_UP_SHOWN;
        let why = match at {
            0 => format!("{k} x median"),
            1 if held => format!(
                "median + {} ms + {share} x the {:.1} ms the machine held it up",
                min_excess / 1e6,
                waited * 1e3
            ),
            1 => format!("median + {} ms", min_excess / 1e6),
            _ => format!("median + {spread} x MAD"),
        };
        let wait = if held {
            format!("; {:.1} ms the machine held it up left out", waited * 1e3)
        } else {
            String::new()
        };
        let detail = format!(
            "{:.1} ms > {:.1} ms ({why}; median {:.1} ms{wait})",
            seconds * 1e3,
            limit * 1e3,
            median * 1e3
        );
        Some(Fired {
            update,
            trigger: Trigger::Slow,
            value: seconds,
            threshold: limit,
            detail,
            trace: None,
        })
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

#[cfg(all(test, target_os = "linux", target_pointer_width = "64"))]
mod tests {
    use super::*;

    // The kernel's accounting, not the machine's speed: the bounds hold
    // however loaded it is (a wait after waking is inside the wall time).
    #[test]
    fn off_cpu_time_is_the_machines_only_when_the_thread_never_blocked() {
        let mut w = CpuWait::default();
        assert_eq!(w.take(None), 0.0, "the first call starts the count");
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(50)); // blocks: its 50 ms off the CPU are the program's
        let wall = t.elapsed().as_secs_f64();
        assert!(
            w.take(Some(wall)) <= wall - 0.049,
            "at most the CPU wait after waking"
        );
        // A wall time longer than the thread ran, with no block between: the
        // difference is the machine's (as a vCPU taken away by the host leaves it).
        let (t, c) = (Instant::now(), sys::thread_cpu_ns().unwrap());
        while sys::thread_cpu_ns().unwrap() - c < 5_000_000 {}
        let ran = t.elapsed().as_secs_f64();
        let held = w.take(Some(ran + 0.030));
        assert!(0.029 < held && held < 0.031 + ran, "{held}");
        // An interval with nothing off the CPU to add skips the question;
        // the next start asks afresh, and the count after it holds again.
        assert!(w.take(Some(0.0)) < 0.005);
        w.take(None);
        let (t, c) = (Instant::now(), sys::thread_cpu_ns().unwrap());
        while sys::thread_cpu_ns().unwrap() - c < 5_000_000 {}
        let ran = t.elapsed().as_secs_f64();
        let held = w.take(Some(ran + 0.030));
        assert!(0.029 < held && held < 0.031 + ran, "{held}");
    }

    #[test]
    fn after_a_slow_clock_read_the_calls_take_schedstats_cpu_time() {
        assert_eq!(
            CpuWait::parse("123456789 2000 31\n"),
            Some((123_456_789, 2000))
        );
        assert_eq!(CpuWait::parse("123456789\n"), None);
        let mut w = CpuWait::default();
        w.take(None);
        w.fallback = CpuWait::FALLBACK_TAKES; // as a read over SLOW_READ leaves it
        for _ in 0..3 {
            w.take(None);
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(10) {}
            let ran = t.elapsed().as_secs_f64();
            let held = w.take(Some(ran + 0.030));
            // schedstat's CPU time is up to a tick off, either way, and a tick
            // is taken off what is counted
            let tick = CpuWait::TICK_S;
            assert!(0.029 - 2.0 * tick < held && held < 0.031 + ran, "{held}");
        }
        assert_eq!(
            w.fallback,
            CpuWait::FALLBACK_TAKES - 6,
            "no clock read meanwhile"
        );
        // used up: the clock is read again
        w.fallback = 1;
        w.take(None);
        assert_eq!(w.cpu, None);
        w.take(None);
        assert!(w.cpu.is_some());
    }
}
