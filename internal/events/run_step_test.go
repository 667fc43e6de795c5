package events

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// WithCaptureStep (ct_reopen) is what ParseRun makes of the same run JSON with
// the step changed, without the parse: the defaults follow the step, what the
// JSON gave stays, and the step's rules refuse as ParseRun refuses.
func TestWithCaptureStepIsTheRunJSONWithTheStepChanged(t *testing.T) {
	for _, extra := range []string{``, `,"warmup_steps":1`, `,"correlation_id":"mine"`, `,"phase":"infer"`} {
		run := func(step string) []byte {
			phase := `"phase":"train",`
			if strings.Contains(extra, "phase") {
				phase = ""
			}
			return []byte(`{"entrypoint":"m::train",` + phase + `"capture_step":` + step + `,"device":"cpu","tags":{"k":"v"}` + extra + `}`)
		}
		r, err := ParseRun(run("3"))
		require.NoError(t, err, extra)
		want, err := ParseRun(run("9"))
		require.NoError(t, err, extra)
		got, err := r.WithCaptureStep(9)
		require.NoError(t, err, extra)
		require.Equal(t, want, got, extra)
		require.EqualValues(t, 3, r.CaptureStep, "the run it copies is unchanged")
	}
	r, err := ParseRun([]byte(`{"entrypoint":"m","phase":"train","capture_step":3,"device":"cpu","warmup_steps":2}`))
	require.NoError(t, err)
	for step, msg := range map[uint64]string{0: `"capture_step" must be >= 1, got 0`, 2: `"warmup_steps" (2) must be less than "capture_step" (2)`} {
		_, want := ParseRun([]byte(strings.Replace(`{"entrypoint":"m","phase":"train","capture_step":S,"device":"cpu","warmup_steps":2}`, "S", strings.TrimSpace(string(rune('0'+step))), 1)))
		_, err := r.WithCaptureStep(step)
		require.EqualError(t, err, want.Error())
		require.Contains(t, err.Error(), msg)
	}
}
