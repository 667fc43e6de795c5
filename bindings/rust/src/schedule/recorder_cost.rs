//! What the flight recorder costs the loop it watches, measured once per run.

/// Updates the first measurement skips (they pay for warming up).
const SKIP: u32 = 3;
/// Updates measured.
const UPDATES: usize = 20;

/// The flight recorder's own work as a share of the updates it records: the
/// tracer time of each (what the recording bracketed as the tracer's work,
/// [`crate::SessionRef::tracer_work`]) over its wall time, the median of
/// [`UPDATES`] completed updates after the first [`SKIP`]. A lower bound of
/// what recording costs: the span and op records' own few tens of
/// nanoseconds each are not bracketed.
#[derive(Debug, Default)]
pub(super) struct RecorderCost {
    skipped: u32,
    shares: Vec<f64>,
    share: Option<f64>,
}

impl RecorderCost {
    /// Folds one flight-recorded update that completed; the share when this
    /// update measured it (once a run).
    pub(super) fn add(&mut self, tracer_s: f64, wall_s: f64) -> Option<f64> {
        if self.share.is_some() || wall_s <= 0.0 {
            return None;
        }
        if self.skipped < SKIP {
            self.skipped += 1;
            return None;
        }
        self.shares.push((tracer_s / wall_s).clamp(0.0, 1.0));
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
            c.add(0.9, 1.0); // warming up: not counted
        }
        for i in 0..UPDATES - 1 {
            assert_eq!(c.add(i as f64 / 100.0, 1.0), None);
            assert_eq!(c.share(), None);
        }
        let measured = c.add(0.5, 1.0);
        // 0.00 ..= 0.18 and 0.50: the two middle values are 0.09 and 0.10
        assert!((c.share().unwrap() - 0.095).abs() < 1e-12, "{:?}", c.share());
        assert_eq!(measured, c.share());
        assert_eq!(c.add(1.0, 1.0), None); // measured once: later updates change nothing
        assert!((c.share().unwrap() - 0.095).abs() < 1e-12);
    }

    #[test]
    fn shares_are_clamped_and_empty_updates_ignored() {
        let mut c = RecorderCost { skipped: SKIP, ..Default::default() };
        c.add(1.0, 0.0); // no wall time: ignored
        for _ in 0..UPDATES {
            c.add(2.0, 1.0); // a clock that stood still more than the wall: at most all
        }
        assert_eq!(c.share(), Some(1.0));
    }
}
