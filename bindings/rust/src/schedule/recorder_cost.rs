//! What the flight recorder costs the loop it watches, measured once per run.

/// Updates the first measurement skips (they pay for warming up).
const SKIP: u32 = 3;
/// Updates measured.
const UPDATES: usize = 20;
/// The largest share an update can give (a clock that stood still).
const MAX_SHARE: f64 = 1e3;

/// What the flight recorder adds to the updates it records, as a share of
/// the update's own time: per update, its tracer time (what the recording
/// bracketed as the tracer's work, [`crate::SessionRef::tracer_work`]) plus
/// the arming of its recording before it began (`ct_reopen`: in C alone where
/// the library can, else with its Go runtime woken), over its wall time less that tracer
/// time; the median of [`UPDATES`] completed updates after the first
/// [`SKIP`]. A lower bound of what recording costs: the span and op records'
/// own few tens of nanoseconds each and the library's background threads are
/// not counted.
#[derive(Debug, Default)]
pub(super) struct RecorderCost {
    skipped: u32,
    shares: Vec<f64>,
    share: Option<f64>,
}

impl RecorderCost {
    /// Folds one flight-recorded update that completed; the share when this
    /// update measured it (once a run).
    pub(super) fn add(&mut self, tracer_s: f64, wall_s: f64, arming_s: f64) -> Option<f64> {
        if self.share.is_some() || wall_s <= 0.0 {
            return None;
        }
        if self.skipped < SKIP {
            self.skipped += 1;
            return None;
        }
        let (tracer_s, arming_s) = (tracer_s.max(0.0), arming_s.max(0.0));
        // A tracer time above the wall time is a clock's skew: the update's
        // own time is then taken as a thousandth of its wall time.
        let own = (wall_s - tracer_s).max(wall_s * 1e-3);
        self.shares
            .push(((tracer_s + arming_s) / own).clamp(0.0, MAX_SHARE));
        if self.shares.len() < UPDATES {
            return None;
        }
        let mut s = std::mem::take(&mut self.shares);
        s.sort_by(f64::total_cmp);
        self.share = Some((s[UPDATES / 2 - 1] + s[UPDATES / 2]) / 2.0);
        self.share
    }

    /// The median share once measured.
    pub(super) fn share(&self) -> Option<f64> {
        self.share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_the_warm_up_and_takes_the_median_of_twenty() {
        let mut c = RecorderCost::default();
        for _ in 0..SKIP {
            c.add(0.5, 1.0, 0.5); // warming up: not counted
        }
        for i in 0..UPDATES - 1 {
            // (i/100 of tracer time + i/100 arming) over 1 - i/100 of the update's own
            let t = i as f64 / 100.0;
            assert_eq!(c.add(t, 1.0, t), None);
            assert_eq!(c.share(), None);
        }
        let measured = c.add(0.5, 1.0, 0.0);
        // 0.09 and 0.10 are the middle ones: 0.18 / 0.91 and 0.20 / 0.90
        let want = (0.18 / 0.91 + 0.20 / 0.90) / 2.0;
        assert!((c.share().unwrap() - want).abs() < 1e-12, "{:?}", c.share());
        assert_eq!(measured, c.share());
        assert_eq!(c.add(1.0, 1.0, 1.0), None); // measured once: later updates change nothing
        assert!((c.share().unwrap() - want).abs() < 1e-12);
    }

    #[test]
    fn the_arming_counts_and_a_skewed_clock_is_bounded() {
        let mut c = RecorderCost {
            skipped: SKIP,
            ..Default::default()
        };
        for _ in 0..UPDATES {
            c.add(0.0, 1.0, 0.25); // a reopen of a quarter of the update, nothing bracketed
        }
        assert_eq!(c.share(), Some(0.25));
        let mut c = RecorderCost {
            skipped: SKIP,
            ..Default::default()
        };
        c.add(1.0, 0.0, 0.0); // no wall time: ignored
        for _ in 0..UPDATES {
            c.add(2.0, 1.0, 0.0); // a tracer time above the wall: bounded, not infinite
        }
        assert_eq!(c.share(), Some(MAX_SHARE));
    }
}
