package trace

import (
	"bytes"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Skimming tells what a line holds from a few of its bytes, without
// scanning it as JSON: how a reader that wants only some records of a
// trace passes over the rest (most of a trace: ops and memory records)
// at the speed of finding its newlines. Both look only where the writers
// put things; a line laid out otherwise is not skimmed (false), and the
// reader decodes it as usual.

var kindPrefix = []byte(`{"kind":"`)

// SkimKind reads the kind of a line that starts with its "kind" member,
// as every writer of the format writes it: {"kind":"op",...
func SkimKind(line []byte) (Kind, bool) {
	if !bytes.HasPrefix(line, kindPrefix) {
		return 0, false
	}
	rest := line[len(kindPrefix):]
	end := bytes.IndexByte(rest[:min(len(rest), 16)], '"') // the longest kind is 15 bytes
	if end < 0 {
		return 0, false
	}
	i := traceformat.Index(traceformat.Kinds, string(rest[:end]))
	if i < 0 {
		return 0, false
	}
	return Kind(i), true
}

var opNameKey = []byte(`"op_name":"`)

// SkimOpName reads the first "op_name" string of a line, when it has no
// escapes. In a valid line the match is a key, not text inside a string
// (whose quotes would be escaped); it is the op's own op_name unless an
// unknown member ahead of it nests one, which no writer of the format does.
func SkimOpName(line []byte) ([]byte, bool) {
	i := bytes.Index(line, opNameKey)
	if i < 0 {
		return nil, false
	}
	rest := line[i+len(opNameKey):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, false
	}
	return rest[:end], true
}
