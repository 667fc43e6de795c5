package cupti

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakePair is a fake clock pair: CUPTI time c corresponds to session time
// h0 + (c - c0) * rate, exactly.
type fakePair struct {
	c0, h0 uint64
	rate   float64
}

func (p fakePair) truth(c uint64) float64 { return float64(p.h0) + float64(int64(c-p.c0))*p.rate }

// anchorAt is the anchor a reading at CUPTI time c would give with the given
// bracket when the CUPTI read happened at fraction at (0: at the bracket's
// start, 1: at its end) of the bracket: the middle is off by (0.5-at)*bracket.
func (p fakePair) anchorAt(c, bracket uint64, at float64) anchor {
	readAt := p.truth(c)
	h0 := readAt - at*float64(bracket)
	return anchor{cupti: c, host: uint64(h0 + float64(bracket)/2), bracket: bracket}
}

func TestClockMapErrorWithinBound(t *testing.T) {
	const base = uint64(1_700_000_000_000_000_000) // CUPTI: wall-clock-like ns
	tests := []struct {
		name    string
		pair    fakePair
		anchors []struct {
			dc      uint64 // CUPTI ns after base
			bracket uint64
			at      float64
		}
		wantBound uint64
	}{
		{
			name: "one anchor: an offset",
			pair: fakePair{c0: base, h0: 5_000_000, rate: 1},
			anchors: []struct {
				dc, bracket uint64
				at          float64
			}{{0, 120, 1}},
			wantBound: 60,
		},
		{
			name: "two anchors, clocks drifting 50 ppm",
			pair: fakePair{c0: base, h0: 1_000, rate: 1 + 50e-6},
			anchors: []struct {
				dc, bracket uint64
				at          float64
			}{
				{0, 80, 0}, {200_000_000, 200, 1},
			},
			wantBound: 100,
		},
		{
			name: "three anchors, errors of both signs",
			pair: fakePair{c0: base, h0: 42, rate: 1 - 20e-6},
			anchors: []struct {
				dc, bracket uint64
				at          float64
			}{
				{10, 64, 1}, {150_000_000, 300, 0}, {310_000_000, 90, 0.9},
			},
			wantBound: 150,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m clockMap
			for _, a := range tt.anchors {
				m.add(tt.pair.anchorAt(base+a.dc, a.bracket, a.at))
			}
			require.Len(t, m.anchors, len(tt.anchors))
			first, last := base+tt.anchors[0].dc, base+tt.anchors[len(tt.anchors)-1].dc
			if len(tt.anchors) == 1 {
				last = first + 1_000_000 // an offset map: check 1 ms on
			}
			var worst uint64
			for c := first; c <= last; c += max((last-first)/997, 1) {
				got, bound := m.toSession(c)
				assert.Equal(t, tt.wantBound, bound)
				errNs := float64(got) - tt.pair.truth(c)
				if errNs < 0 {
					errNs = -errNs
				}
				worst = max(worst, uint64(errNs))
				if len(tt.anchors) > 1 || c == first {
					require.LessOrEqual(t, errNs, float64(bound)+1, "at CUPTI %d: mapped %d, truth %.1f", c, got, tt.pair.truth(c))
				}
			}
			t.Logf("worst error %d ns, bound %d ns", worst, tt.wantBound)
		})
	}
}

func TestClockMapBeforeZeroAndOrder(t *testing.T) {
	var m clockMap
	got, bound := m.toSession(5)
	assert.Equal(t, int64(0), got)
	assert.Equal(t, uint64(0), bound)

	m.add(anchor{cupti: 1000, host: 10, bracket: 10})
	got, _ = m.toSession(900)
	assert.Equal(t, int64(-90), got, "before the session's zero is negative: the collector clamps it")

	m.add(anchor{cupti: 1000, host: 11, bracket: 4}) // CUPTI did not advance: keep the tighter
	require.Len(t, m.anchors, 1)
	assert.Equal(t, uint64(4), m.anchors[0].bracket)
	m.add(anchor{cupti: 999, host: 12, bracket: 50}) // went back, looser: ignored
	require.Len(t, m.anchors, 1)
	m.add(anchor{cupti: 3000, host: 2011, bracket: 6})
	got, bound = m.toSession(2000)
	assert.Equal(t, int64(1011), got)
	assert.Equal(t, uint64(3), bound)
}

func TestBestAnchor(t *testing.T) {
	type reading struct {
		h0, c, h1 uint64
		err       error
	}
	boom := errors.New("cuptiGetTimestamp returned CUPTI_ERROR_NOT_INITIALIZED (15)")
	tests := []struct {
		name     string
		readings []reading
		want     anchor
		err      string
	}{
		{
			name:     "smallest bracket wins",
			readings: []reading{{100, 5000, 300, nil}, {400, 5310, 440, nil}, {500, 5500, 1500, nil}},
			want:     anchor{cupti: 5310, host: 420, bracket: 40},
		},
		{
			name:     "failed and backward readings are skipped",
			readings: []reading{{0, 0, 0, boom}, {900, 7000, 800, nil}, {1000, 7100, 1010, nil}},
			want:     anchor{cupti: 7100, host: 1005, bracket: 10},
		},
		{
			name:     "every reading failed",
			readings: []reading{{0, 0, 0, boom}, {0, 0, 0, boom}},
			err:      "CUPTI_ERROR_NOT_INITIALIZED",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i := 0
			a, err := bestAnchor(len(tt.readings), func() (uint64, uint64, uint64, error) {
				r := tt.readings[i]
				i++
				return r.h0, r.c, r.h1, r.err
			})
			assert.Equal(t, len(tt.readings), i, "takes every reading")
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, a)
			assert.Equal(t, (tt.want.bracket+1)/2, a.bound())
		})
	}
}
