package session

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// fakeDevices stands in for internal/cuda's Collectors: each Flush records a
// scalar on s1 (a collector's last sample), Stop records one more.
type fakeDevices struct {
	s                 *Session
	mu                sync.Mutex
	flushes, stops    int
	flushErr, stopErr []error
}

func (d *fakeDevices) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushes++
	err := d.s.RecordScalar(1, "dev/flushed", float64(d.flushes))
	d.flushErr = append(d.flushErr, err)
	return err
}

func (d *fakeDevices) Stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stops++
	err := d.s.RecordScalar(1, "dev/stopped", 1)
	d.stopErr = append(d.stopErr, err)
	return err
}

func startFake(t *testing.T, s *Session) *fakeDevices {
	t.Helper()
	d := &fakeDevices{s: s}
	require.NoError(t, s.StartDevices(func() (Devices, error) { return d, nil }))
	return d
}

// scalarLabels lists the tensor_stats labels of the trace, in order, and
// reports whether the last line is the terminal one.
func scalarLabels(t *testing.T, path string) (labels []string, terminal string) {
	t.Helper()
	lines := testutil.Lines(t, path)
	for _, l := range testutil.OfKind(lines, "tensor_stats") {
		labels = append(labels, l["label"].(string))
	}
	last := lines[len(lines)-1]
	if last["kind"] == "terminal" {
		terminal, _ = last["outcome"].(string)
	}
	return labels, terminal
}

func TestDevicesBelongToTheirSession(t *testing.T) {
	tests := []struct {
		name    string
		end     func(s *Session) error
		outcome string
	}{
		{"finish", (*Session).Finish, "complete"},
		{"finish failed", func(s *Session) error { return s.FinishFailed("the step raised") }, "failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, path := openT(t, measuredRootRun)
			d := startFake(t, s)
			require.NoError(t, tt.end(s))
			assert.Equal(t, 1, d.flushes)
			assert.Equal(t, 1, d.stops, "stopped with the session")
			assert.NoError(t, d.flushErr[0], "flushed while the session still took records")
			requireCode(t, d.stopErr[0], InvalidHandle, "already finished")
			labels, outcome := scalarLabels(t, path)
			assert.Equal(t, []string{"dev/flushed"}, labels, "the flush precedes the terminal line")
			assert.Equal(t, tt.outcome, outcome)
			if outcome == "complete" {
				testutil.RequireValid(t, path)
			} else {
				testutil.RequireValidFailed(t, path)
			}
		})
	}
}

func TestARefusedFinishLeavesTheDevicesRunning(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	d := startFake(t, s)
	id := begin(t, s, "step")
	requireCode(t, s.Finish(), State, "1 spans still open")
	assert.Equal(t, 1, d.flushes)
	assert.Zero(t, d.stops, "the session is still open: its collectors run on")
	end(t, s, id)
	require.NoError(t, s.Finish())
	assert.Equal(t, 2, d.flushes)
	assert.Equal(t, 1, d.stops)
	labels, outcome := scalarLabels(t, path)
	assert.Equal(t, []string{"dev/flushed", "dev/flushed"}, labels)
	assert.Equal(t, "complete", outcome)
	testutil.RequireValid(t, path)
}

func TestStartAndStopDevices(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	d := startFake(t, s)
	called := false
	err := s.StartDevices(func() (Devices, error) { called = true; return &fakeDevices{s: s}, nil })
	requireCode(t, err, State, "ct_device_start: device collectors already run on this session; ct_device_stop them first")
	assert.False(t, called, "a second set is not started")

	require.NoError(t, s.StopDevices())
	assert.Equal(t, 1, d.stops)
	require.NoError(t, s.StopDevices(), "nothing to stop: nothing happens")
	assert.Equal(t, 1, d.stops)

	boom := &Error{Code: Unavailable, Msg: "ct_device_start: NVML is unavailable"}
	require.Equal(t, boom, s.StartDevices(func() (Devices, error) { return nil, boom }))
	require.NoError(t, s.Finish(), "a failed start leaves nothing to flush")
	assert.Equal(t, 0, d.flushes)

	labels, outcome := scalarLabels(t, path)
	assert.Equal(t, []string{"dev/stopped"}, labels)
	assert.Equal(t, "complete", outcome)
	testutil.RequireValid(t, path)
}
