package events

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeLine checks that b is exactly one JSON object followed by '\n', that no value in it
// is null, and returns it with numbers kept as json.Number (so 2 and 2.0 stay distinct).
func decodeLine(t *testing.T, b []byte) map[string]any {
	t.Helper()
	require.True(t, bytes.HasSuffix(b, []byte("\n")), "line must end in newline: %q", b)
	require.Equal(t, 1, bytes.Count(b, []byte("\n")), "exactly one line: %q", b)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	require.NoError(t, dec.Decode(&m), "line: %s", b)
	require.False(t, dec.More(), "trailing data in %q", b)
	assertNoNull(t, m, "")
	return m
}

func assertNoNull(t *testing.T, v any, path string) {
	t.Helper()
	switch x := v.(type) {
	case nil:
		t.Errorf("null at %q", path)
	case map[string]any:
		for k, e := range x {
			assertNoNull(t, e, path+"."+k)
		}
	case []any:
		for _, e := range x {
			assertNoNull(t, e, path+"[]")
		}
	}
}

func num(s string) json.Number { return json.Number(s) }
