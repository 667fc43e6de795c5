package cupti

import (
	"errors"
	"sort"
)

// Clock alignment.
//
// CUPTI stamps records with its own clock (cuptiGetTimestamp, ns; on Linux
// a host clock, not CLOCK_MONOTONIC). The session clock is CLOCK_MONOTONIC
// less the session's start. The collector relates the two with anchors:
//
//   - An anchor takes N readings (DefaultClockTries) of (session before,
//     CUPTI, session after), back to back in C, and keeps the one with the
//     smallest bracket b = after - before. The CUPTI reading happened at
//     some instant inside the bracket, so taking the bracket's middle as its
//     session time is off by at most b/2: the anchor's error bound. Readings
//     the scheduler interrupted have wide brackets and are never chosen.
//   - One anchor is taken before CUPTI is enabled, and one each time the
//     decoder takes completed buffers (so every record it decodes is older
//     than the newest anchor), and at stop.
//   - A CUPTI time between two anchors maps by linear interpolation between
//     them. If both clocks run at constant rates relative to each other
//     between the anchors (drift, NTP slewing at a steady rate), the mapped
//     time is off by at most max(b_i, b_{i+1})/2, the larger half-bracket of
//     the two anchors. Anchors are at most DrainInterval apart, so a change
//     of rate inside one segment (an NTP slew adjustment) adds at most that
//     change x DrainInterval (500 ppm, NTP's largest slew, x 200 ms = 100 µs;
//     in practice rates change by a few ppm: well under 1 µs). A step of the
//     wall clock (settimeofday) breaks the mapping of the segment it falls in.
//   - With one anchor only (no buffer taken yet) the map is an offset (rate 1)
//     and the bound that anchor's b/2.
//
// Typical brackets are 50-200 ns, so intervals land within about 100 ns of
// where the session clock would have put them; the largest bound used is
// Stats.ClockBoundNs.

// anchor is one (CUPTI, session) clock pair.
type anchor struct {
	cupti   uint64 // CUPTI ns
	host    uint64 // session ns: the bracket's middle
	bracket uint64 // session ns between the readings before and after
}

// bound is the anchor's error bound: half its bracket.
func (a anchor) bound() uint64 { return (a.bracket + 1) / 2 }

// bestAnchor takes tries readings and keeps the one with the smallest bracket.
func bestAnchor(tries int, read func() (h0, c, h1 uint64, err error)) (anchor, error) {
	best := anchor{}
	found := false
	var last error
	for i := 0; i < max(tries, 1); i++ {
		h0, c, h1, err := read()
		if err != nil {
			last = err
			continue
		}
		if h1 < h0 {
			continue // not a clock that moves forward: skip the reading
		}
		b := h1 - h0
		if !found || b < best.bracket {
			best = anchor{cupti: c, host: h0 + b/2, bracket: b}
			found = true
		}
	}
	if !found {
		if last == nil {
			last = errors.New("no clock reading moved forward")
		}
		return anchor{}, last
	}
	return best, nil
}

// maxAnchors bounds the anchors kept: past it the oldest interior one goes
// (records that old are long decoded).
const maxAnchors = 1 << 16

// clockMap maps CUPTI time to session time through its anchors.
type clockMap struct {
	anchors []anchor // increasing cupti
}

func (m *clockMap) add(a anchor) {
	n := len(m.anchors)
	if n > 0 && a.cupti <= m.anchors[n-1].cupti {
		// CUPTI's clock did not advance since the last anchor (or went back):
		// keep the tighter of the two.
		if a.bracket < m.anchors[n-1].bracket && (n == 1 || a.cupti > m.anchors[n-2].cupti) {
			m.anchors[n-1] = a
		}
		return
	}
	if n >= maxAnchors {
		copy(m.anchors[1:], m.anchors[2:])
		m.anchors = m.anchors[:n-1]
	}
	m.anchors = append(m.anchors, a)
}

// toSession maps CUPTI time c to session ns (negative before the session's
// zero) and returns the error bound of the mapping.
func (m *clockMap) toSession(c uint64) (int64, uint64) {
	a := m.anchors
	switch len(a) {
	case 0:
		return 0, 0
	case 1:
		return int64(a[0].host) + int64(c-a[0].cupti), a[0].bound()
	}
	// The segment [a[i], a[i+1]] holding c; the first or last segment
	// outside the anchors (extrapolated; the collector avoids it).
	i := sort.Search(len(a), func(k int) bool { return a[k].cupti > c }) - 1
	i = min(max(i, 0), len(a)-2)
	lo, hi := a[i], a[i+1]
	rate := float64(int64(hi.host-lo.host)) / float64(hi.cupti-lo.cupti)
	dc := float64(int64(c - lo.cupti))
	return int64(lo.host) + int64(dc*rate+0.5*sign(dc*rate)), max(lo.bound(), hi.bound())
}

func sign(x float64) float64 {
	if x < 0 {
		return -1
	}
	return 1
}
