package health

import (
	"bytes"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/trace"
	"github.com/candle-trace/candle-trace/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemoryInFileOrderHoldsAnUnpairedFree(t *testing.T) {
	shuffled := testutil.Corpus(t, "valid-memory-out-of-order.jsonl")
	// Applied in file order the same events hold an unpaired free: the
	// sorted replay is what makes them valid.
	lt := newLifetimes()
	var d trace.Decoder
	for i, line := range bytes.Split(shuffled, []byte("\n")) {
		if k, err := d.Decode(line); err == nil && k == trace.KindMemory {
			r := recordOf(&d.Memory, i+1)
			lt.apply(&r)
		}
	}
	require.NotEmpty(t, lt.issues)
	assert.Equal(t, trace.CodeUnpairedFree, lt.issues[0].Code)
}
