package events

import "slices"

// Span lines for the drainer, which writes millions of them a second: the
// same bytes as AppendSpanStart and AppendSpanEnd, built from pieces spelled
// once and copied while they repeat. A span's id is spelled at its start
// (SpanRef; the next id of a thread's run by a digit's increment) and
// copied into its end and into its children's parent_id; a name's JSON
// string is spelled once per name a thread passes (AppendName); the end of
// a start line (span kind, measured, step, tid) is spelled again only when
// it changes (StartTail). Pieces go in as whole fixed-size arrays, a
// register move or two each instead of a memmove call, into room reserved
// once per line: an array longer than its piece writes past it, and the
// next piece (or the line's final length) covers that.

// SpanRef is a span id in its wire spelling, "s<N>" without the quotes:
// 32 bytes, copied whole (two register moves), its length in the last.
type SpanRef struct {
	b [refRoom]byte
}

// refRoom is a SpanRef's array: "s", 20 digits, the spare bytes of
// putUint's eight-byte stores, and the length at refLen.
const (
	refRoom = 32
	refLen  = refRoom - 1
)

// RefOf spells span id.
func RefOf(id uint64) SpanRef {
	var r SpanRef
	r.Spell(id)
	return r
}

// Spell makes r the spelling of id.
func (r *SpanRef) Spell(id uint64) {
	r.b[0] = 's'
	r.b[refLen] = uint8(1 + putUint(r.b[1:1+uintRoom], id))
}

// Next makes r the spelling of the id after the one it spells, in place;
// false (r unchanged) when that id has one digit more.
func (r *SpanRef) Next() bool {
	n := int(r.b[refLen])
	for i := n - 1; i >= 1; i-- {
		if r.b[i] != '9' {
			r.b[i]++
			for j := i + 1; j < n; j++ {
				r.b[j] = '0'
			}
			return true
		}
	}
	return false
}

// Bytes is the spelling, "s<N>".
func (r *SpanRef) Bytes() []byte { return r.b[:r.b[refLen]] }

// IsZero reports whether r spells no span (the zero SpanRef).
func (r *SpanRef) IsZero() bool { return r.b[refLen] == 0 }

// RootRef is s1, the root span every session opens.
var RootRef = RefOf(1)

// AppendName appends name as a JSON string, quotes included, as
// AppendSpanStart writes it: the nameJSON of AppendSpanStartRef.
func AppendName(b, name []byte) []byte { return appendString(b, string(name)) }

// StartTail is the end of one thread's span_start lines, from "span_kind"
// to the newline; its bytes are spelled again only when a field changes.
type StartTail struct {
	kind     SpanKind
	measured bool
	step     Step
	tid      int64
	n        uint8 // 0: not spelled yet
	b        [tailRoom]byte
}

// tailRoom holds the longest tail: `,"span_kind":"SpanKind(4294967295)"`,
// measured, `,"step":"Step(4294967295)"` and a 19-digit tid, 105 bytes.
const tailRoom = 128

// For makes t the tail of a span_start with these fields.
func (t *StartTail) For(kind SpanKind, measured bool, step Step, tid int64) *StartTail {
	if t.n != 0 && t.kind == kind && t.measured == measured && t.step == step && t.tid == tid {
		return t
	}
	t.kind, t.measured, t.step, t.tid = kind, measured, step, tid
	t.n = uint8(copy(t.b[:], appendStartTail(nil, kind, measured, step, tid)))
	return t
}

// Bytes is the tail's spelling.
func (t *StartTail) Bytes() []byte { return t.b[:t.n] }

// The fixed parts of the two span lines, as arrays (see the top).
var (
	startOpen = [...]byte{'{', '"', 'k', 'i', 'n', 'd', '"', ':', '"', 's', 'p', 'a', 'n', '_', 's', 't', 'a', 'r', 't', '"', ',', '"', 'i', 'd', '"', ':', '"'}
	parentKey = [...]byte{'"', ',', '"', 'p', 'a', 'r', 'e', 'n', 't', '_', 'i', 'd', '"', ':', '"'}
	nameKey   = [...]byte{'"', ',', '"', 'n', 'a', 'm', 'e', '"', ':'}
	startKey  = [...]byte{',', '"', 's', 't', 'a', 'r', 't', '_', 'n', 's', '"', ':'}
	endOpen   = [...]byte{'{', '"', 'k', 'i', 'n', 'd', '"', ':', '"', 's', 'p', 'a', 'n', '_', 'e', 'n', 'd', '"', ',', '"', 'i', 'd', '"', ':', '"'}
	durKey    = [...]byte{'"', ',', '"', 'd', 'u', 'r', 'a', 't', 'i', 'o', 'n', '_', 'n', 's', '"', ':'}
	lineClose = [...]byte{'}', '\n'}
)

// The most a line writes besides its name, the arrays' spare bytes
// included.
const (
	startRoom = len(startOpen) + refRoom + len(parentKey) + refRoom + len(nameKey) + len(startKey) + uintRoom + tailRoom
	endRoom   = len(endOpen) + refRoom + len(durKey) + uintRoom + len(lineClose)
)

// AppendSpanStartRef appends the span_start AppendSpanStart would, for span
// id under parent (nil: the root span, no parent_id), named by nameJSON
// (AppendName), ended by tail.
func AppendSpanStartRef(b []byte, id, parent *SpanRef, nameJSON []byte, startNs uint64, tail *StartTail) []byte {
	l := len(b)
	b = slices.Grow(b, startRoom+len(nameJSON))
	d := b[l:cap(b)]
	*(*[len(startOpen)]byte)(d) = startOpen
	n := len(startOpen)
	*(*[refRoom]byte)(d[n:]) = id.b
	n += int(id.b[refLen])
	if parent != nil {
		*(*[len(parentKey)]byte)(d[n:]) = parentKey
		n += len(parentKey)
		*(*[refRoom]byte)(d[n:]) = parent.b
		n += int(parent.b[refLen])
	}
	*(*[len(nameKey)]byte)(d[n:]) = nameKey
	n += len(nameKey)
	n += copy(d[n:], nameJSON)
	*(*[len(startKey)]byte)(d[n:]) = startKey
	n += len(startKey)
	n += putUint(d[n:], startNs)
	*(*[tailRoom]byte)(d[n:]) = tail.b
	n += int(tail.n)
	return b[:l+n]
}

// AppendSpanEndRef appends the span_end AppendSpanEnd would.
func AppendSpanEndRef(b []byte, id *SpanRef, durationNs uint64) []byte {
	l := len(b)
	b = slices.Grow(b, endRoom)
	d := b[l:cap(b)]
	*(*[len(endOpen)]byte)(d) = endOpen
	n := len(endOpen)
	*(*[refRoom]byte)(d[n:]) = id.b
	n += int(id.b[refLen])
	*(*[len(durKey)]byte)(d[n:]) = durKey
	n += len(durKey)
	n += putUint(d[n:], durationNs)
	*(*[len(lineClose)]byte)(d[n:]) = lineClose
	return b[:l+n+len(lineClose)]
}
