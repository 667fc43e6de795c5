package job

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// FuzzRead: reading a rank's trace never panics, and whatever the full
// read (ForAnalysis) accepts, the job clock's read (ForClock, which skims
// the rest) reads too, with the same meta and collectives.
func FuzzRead(f *testing.F) {
	paths, err := jobtest.Even(2).Write(f.TempDir())
	require.NoError(f, err)
	for _, p := range paths {
		data, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add([]byte(testMeta(`,"process":{"rank":2}`) + "\n" + `{"kind":"op","span_id":"s","op_name":"gloo:all_reduce","inputs":[],"shape":[2],"dtype":"f32","device":"cpu","duration_ns":5,"timestamp_ns":1}`))
	more, _ := filepath.Glob(filepath.Join(testutil.CorpusDir(f), "valid-*.jsonl"))
	for _, p := range more {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		full, ferr := Read(bytes.NewReader(data), 1, ForAnalysis)
		clock, cerr := Read(bytes.NewReader(data), 1, ForClock)
		if ferr != nil {
			return
		}
		if cerr != nil {
			t.Fatalf("the full read took it, the clock's refused it: %v", cerr)
		}
		if full.Rank != clock.Rank || full.WallNS != clock.WallNS || full.HasWall != clock.HasWall || full.Complete != clock.Complete {
			t.Fatalf("meta differs: full %+v, clock %+v", full, clock)
		}
		if len(full.Collectives) != len(clock.Collectives) {
			t.Fatalf("collectives: full %v, clock %v", full.Collectives, clock.Collectives)
		}
		for i := range full.Collectives {
			if full.Collectives[i] != clock.Collectives[i] {
				t.Fatalf("collective %d: full %v, clock %v", i, full.Collectives[i], clock.Collectives[i])
			}
		}
	})
}
