package trace

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"
)

// decodeError is a record that candle-graph's serde decoding would refuse.
type decodeError struct {
	code string
	msg  string
}

func (e *decodeError) Error() string { return e.msg }

// owned copies a field name into an error message. The decoders pass keys
// converted from the line (string(m.key), or keyOf's alias); if an error
// path could keep one, escape analysis would put every such conversion on
// the heap, one allocation per field of every record, and an alias would
// change with the next line. Copying on the error path keeps the
// conversions on the stack and the messages whole.
func owned(key string) string { return strings.Clone(key) }

// keyOf is a member's key as a string that aliases the line (or the
// scanner's arena) instead of a copy: the event decoders only compare it
// and hand it to the getters, whose errors copy it (owned, and errf
// formats at once), so nothing keeps it past the line. A copy per member
// was 6% of a merge.
func keyOf(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func errf(code, format string, args ...any) *decodeError {
	return &decodeError{code: code, msg: fmt.Sprintf(format, args...)}
}

// fields tracks which known fields of one JSON object were seen, so that a
// repeated known key is rejected (serde's "duplicate field") while repeated
// unknown keys pass (serde ignores them). Objects have at most 64 known fields.
type fields struct {
	obj  string
	seen uint64
}

func (f *fields) first(bit uint, key string) error {
	if f.seen&(1<<bit) != 0 {
		return errf(CodeDuplicateKey, "%s: duplicate field `%s`", f.obj, owned(key))
	}
	f.seen |= 1 << bit
	return nil
}

func (f *fields) has(bit uint) bool { return f.seen&(1<<bit) != 0 }

// require reports the first required field (by bit) that was not seen.
func (f *fields) require(names ...string) error {
	for bit, name := range names {
		if name != "" && !f.has(uint(bit)) {
			return errf(CodeMissingField, "%s: missing field `%s`", f.obj, name)
		}
	}
	return nil
}

func typeErr(obj, key string, v jsonValue, want string) error {
	if v.kind == jNull {
		return errf(CodeNullField, "%s: field `%s` is null, expected %s", obj, owned(key), want)
	}
	return errf(CodeWrongType, "%s: field `%s` is a %s, expected %s", obj, owned(key), v.kind, want)
}

func getStr(obj, key string, v jsonValue) ([]byte, error) {
	if v.kind != jString {
		return nil, typeErr(obj, key, v, "a string")
	}
	return v.raw, nil
}

// getOptStr decodes an Option<String>: null and absent are the same.
func getOptStr(obj, key string, v jsonValue) ([]byte, bool, error) {
	if v.kind == jNull {
		return nil, false, nil
	}
	b, err := getStr(obj, key, v)
	return b, err == nil, err
}

// parseU64 accepts only JSON integer literals that fit u64; serde_json turns
// anything else (300.0, 3e2, -1, -0, 2^64) into a float or negative value
// that a u64 field refuses.
func ParseU64(lit []byte) (uint64, bool) {
	if len(lit) == 0 || len(lit) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

func getU64(obj, key string, v jsonValue) (uint64, error) {
	if v.kind != jNumber {
		return 0, typeErr(obj, key, v, "an unsigned integer")
	}
	n, ok := ParseU64(v.raw)
	if !ok {
		return 0, errf(CodeWrongType, "%s: field `%s` is %s, expected a JSON integer in 0..2^64-1", obj, owned(key), v.raw)
	}
	return n, nil
}

func getOptU64(obj, key string, v jsonValue) (uint64, bool, error) {
	if v.kind == jNull {
		return 0, false, nil
	}
	n, err := getU64(obj, key, v)
	return n, err == nil, err
}

// getF64 accepts any JSON number; the scanner already refused literals that
// overflow, so the result is finite. "-0" keeps its sign, as in serde_json.
func getF64(obj, key string, v jsonValue) (float64, error) {
	if v.kind != jNumber {
		return 0, typeErr(obj, key, v, "a number")
	}
	f, err := strconv.ParseFloat(string(v.raw), 64)
	if err != nil && f != 0 {
		return 0, errf(CodeWrongType, "%s: field `%s` is out of range: %s", obj, owned(key), v.raw)
	}
	return f, nil
}

func getOptF64(obj, key string, v jsonValue) (float64, bool, error) {
	if v.kind == jNull {
		return 0, false, nil
	}
	f, err := getF64(obj, key, v)
	return f, err == nil, err
}

func getBool(obj, key string, v jsonValue) (bool, error) {
	if v.kind != jBool {
		return false, typeErr(obj, key, v, "a boolean")
	}
	return v.raw[0] == 't', nil
}

// getEnum decodes a unit enum variant. serde also accepts the externally
// tagged map form {"variant": null} (or {"variant": {}}), so we do too.
func (s *jsonScanner) getEnum(obj, key string, v jsonValue, names []string) (int, error) {
	var name []byte
	switch v.kind {
	case jString:
		name = v.raw
	case jObject:
		ms := s.members(v)
		if len(ms) != 1 {
			return 0, errf(CodeWrongType, "%s: field `%s` must be a string or a map with a single key", obj, owned(key))
		}
		inner := ms[0].val
		if inner.kind != jNull && !(inner.kind == jObject && len(s.members(inner)) == 0) {
			return 0, errf(CodeWrongType, "%s: field `%s`: unit variant carries a value", obj, owned(key))
		}
		name = ms[0].key
	default:
		return 0, typeErr(obj, key, v, "a string")
	}
	for i, n := range names {
		if string(name) == n {
			return i, nil
		}
	}
	return 0, errf(CodeUnknownVariant, "%s: field `%s` has unknown variant %q, expected one of %v", obj, owned(key), name, names)
}

// getStrList decodes a Vec<String>, appending to dst.
func (s *jsonScanner) getStrList(obj, key string, v jsonValue, dst [][]byte) ([][]byte, error) {
	if v.kind != jArray {
		return dst, typeErr(obj, key, v, "an array of strings")
	}
	s.elems = s.appendElements(v, s.elems[:0])
	for i, e := range s.elems {
		if e.kind != jString {
			return dst, typeErr(obj, fmt.Sprintf("%s[%d]", owned(key), i), e, "a string")
		}
		dst = append(dst, e.raw)
	}
	return dst, nil
}

// getU64List decodes a Vec<usize> (64-bit), appending to dst.
func (s *jsonScanner) getU64List(obj, key string, v jsonValue, dst []uint64) ([]uint64, error) {
	if v.kind != jArray {
		return dst, typeErr(obj, key, v, "an array of unsigned integers")
	}
	s.elems = s.appendElements(v, s.elems[:0])
	for i, e := range s.elems {
		n, ok := ParseU64(e.raw)
		if e.kind != jNumber || !ok {
			_, err := getU64(obj, fmt.Sprintf("%s[%d]", owned(key), i), e)
			return dst, err
		}
		dst = append(dst, n)
	}
	return dst, nil
}
