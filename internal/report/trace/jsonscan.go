package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// The trace reader needs JSON semantics that encoding/json does not offer:
// serde_json's (as used by candle-graph) rejects lone UTF-16 surrogates,
// number literals that overflow f64 and nesting deeper than its recursion
// limit, and the event decoders must see duplicate keys and distinguish an
// integer literal from a float literal. This scanner validates a whole line
// once and hands out the top-level members with their raw values; nested
// containers are re-scanned on demand (they are rare and small).

// maxJSONDepth is the deepest nesting candle-graph 0.10.1 accepts, counting
// the event object itself as 1 (measured against the real binary).
const maxJSONDepth = 127

type jsonKind uint8

const (
	jNull jsonKind = iota
	jBool
	jNumber
	jString
	jArray
	jObject
)

func (k jsonKind) String() string {
	switch k {
	case jNull:
		return "null"
	case jBool:
		return "boolean"
	case jNumber:
		return "number"
	case jString:
		return "string"
	case jArray:
		return "array"
	default:
		return "object"
	}
}

// jsonValue is one scanned value. For strings raw holds the decoded bytes,
// for numbers the literal, for containers the raw text including brackets.
// It aliases the line buffer or the scanner's arena: valid until the next
// line is scanned.
type jsonValue struct {
	kind jsonKind
	raw  []byte
}

type jsonMember struct {
	key []byte
	val jsonValue
}

// errJSONEnd marks input that ended inside a value: the signature of a line
// cut short by a killed writer.
var errJSONEnd = errors.New("unexpected end of JSON input")

type jsonSyntaxError struct {
	off int
	msg string
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.off+1, e.msg)
}

type jsonScanner struct {
	data  []byte
	pos   int
	arena []byte      // decoded strings that contained escapes
	elems []jsonValue // reused by the list decoders, which do not nest
}

func (s *jsonScanner) fail(msg string) error { return &jsonSyntaxError{off: s.pos, msg: msg} }

// scanObject validates data as exactly one JSON object (surrounding JSON
// whitespace allowed) and appends its members to dst.
func (s *jsonScanner) scanObject(data []byte, dst []jsonMember) ([]jsonMember, error) {
	s.data, s.pos = data, 0
	s.skipWS()
	if s.pos >= len(s.data) {
		return dst, errJSONEnd
	}
	if s.data[s.pos] != '{' {
		return dst, s.fail("expected an object")
	}
	dst, err := s.object(1, dst, true)
	if err != nil {
		return dst, err
	}
	s.skipWS()
	if s.pos != len(s.data) {
		return dst, s.fail("trailing characters after the object")
	}
	return dst, nil
}

func (s *jsonScanner) skipWS() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// object scans an object starting at '{'. When collect is false members are
// validated but not recorded.
func (s *jsonScanner) object(depth int, dst []jsonMember, collect bool) ([]jsonMember, error) {
	if depth > maxJSONDepth {
		return dst, s.fail("nesting too deep")
	}
	s.pos++ // '{'
	s.skipWS()
	if s.pos >= len(s.data) {
		return dst, errJSONEnd
	}
	if s.data[s.pos] == '}' {
		s.pos++
		return dst, nil
	}
	for {
		if s.pos >= len(s.data) {
			return dst, errJSONEnd
		}
		if s.data[s.pos] != '"' {
			return dst, s.fail("expected a string key")
		}
		key, err := s.str()
		if err != nil {
			return dst, err
		}
		s.skipWS()
		if s.pos >= len(s.data) {
			return dst, errJSONEnd
		}
		if s.data[s.pos] != ':' {
			return dst, s.fail("expected ':'")
		}
		s.pos++
		s.skipWS()
		val, err := s.value(depth)
		if err != nil {
			return dst, err
		}
		if collect {
			dst = append(dst, jsonMember{key: key, val: val})
		}
		s.skipWS()
		if s.pos >= len(s.data) {
			return dst, errJSONEnd
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.skipWS()
		case '}':
			s.pos++
			return dst, nil
		default:
			return dst, s.fail("expected ',' or '}'")
		}
	}
}

func (s *jsonScanner) array(depth int) error {
	if depth > maxJSONDepth {
		return s.fail("nesting too deep")
	}
	s.pos++ // '['
	s.skipWS()
	if s.pos >= len(s.data) {
		return errJSONEnd
	}
	if s.data[s.pos] == ']' {
		s.pos++
		return nil
	}
	for {
		if _, err := s.value(depth); err != nil {
			return err
		}
		s.skipWS()
		if s.pos >= len(s.data) {
			return errJSONEnd
		}
		switch s.data[s.pos] {
		case ',':
			s.pos++
			s.skipWS()
		case ']':
			s.pos++
			return nil
		default:
			return s.fail("expected ',' or ']'")
		}
	}
}

// value scans one value whose container sits at depth.
func (s *jsonScanner) value(depth int) (jsonValue, error) {
	if s.pos >= len(s.data) {
		return jsonValue{}, errJSONEnd
	}
	start := s.pos
	switch c := s.data[s.pos]; {
	case c == '"':
		b, err := s.str()
		return jsonValue{kind: jString, raw: b}, err
	case c == '{':
		_, err := s.object(depth+1, nil, false)
		return jsonValue{kind: jObject, raw: s.data[start:s.pos]}, err
	case c == '[':
		err := s.array(depth + 1)
		return jsonValue{kind: jArray, raw: s.data[start:s.pos]}, err
	case c == 't':
		err := s.literal("true")
		return jsonValue{kind: jBool, raw: s.data[start:s.pos]}, err
	case c == 'f':
		err := s.literal("false")
		return jsonValue{kind: jBool, raw: s.data[start:s.pos]}, err
	case c == 'n':
		return jsonValue{kind: jNull}, s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		err := s.number()
		return jsonValue{kind: jNumber, raw: s.data[start:s.pos]}, err
	default:
		return jsonValue{}, s.fail("expected a value")
	}
}

func (s *jsonScanner) literal(word string) error {
	for i := 0; i < len(word); i++ {
		if s.pos >= len(s.data) {
			return errJSONEnd
		}
		if s.data[s.pos] != word[i] {
			return s.fail("invalid literal")
		}
		s.pos++
	}
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number scans a JSON number and rejects literals that overflow f64, as
// serde_json does ("number out of range"); underflow to zero is accepted.
func (s *jsonScanner) number() error {
	start := s.pos
	if s.data[s.pos] == '-' {
		s.pos++
	}
	if s.pos >= len(s.data) {
		return errJSONEnd
	}
	switch {
	case s.data[s.pos] == '0':
		s.pos++
	case isDigit(s.data[s.pos]):
		for s.pos < len(s.data) && isDigit(s.data[s.pos]) {
			s.pos++
		}
	default:
		return s.fail("invalid number")
	}
	intDigits := s.pos - start
	exp := false
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if s.pos >= len(s.data) {
			return errJSONEnd
		}
		if !isDigit(s.data[s.pos]) {
			return s.fail("invalid number")
		}
		for s.pos < len(s.data) && isDigit(s.data[s.pos]) {
			s.pos++
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		exp = true
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if s.pos >= len(s.data) {
			return errJSONEnd
		}
		if !isDigit(s.data[s.pos]) {
			return s.fail("invalid number")
		}
		for s.pos < len(s.data) && isDigit(s.data[s.pos]) {
			s.pos++
		}
	}
	// Only an exponent or an integer part of 300+ digits can leave f64's range.
	if exp || intDigits >= 300 {
		if f, err := strconv.ParseFloat(string(s.data[start:s.pos]), 64); err != nil && math.IsInf(f, 0) {
			s.pos = start
			return s.fail("number out of range")
		}
	}
	return nil
}

// str scans a string starting at '"' and returns its decoded bytes. The line
// was already checked to be valid UTF-8.
// strSpecial marks the bytes that end a string's plain run: the quote, the
// backslash and the control characters.
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// specialBytes flags (the high bit of its byte) the quotes, backslashes
// and control characters among the eight bytes of w, first byte lowest.
// A flag above the lowest may be false (a borrow); the lowest is exact.
func specialBytes(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, bs := w^(ones*'"'), w^(ones*'\\')
	return ((q-ones)&^q | (bs-ones)&^bs | (w-ones*0x20)&^w) & highs
}

func (s *jsonScanner) str() ([]byte, error) {
	s.pos++ // opening quote
	start := s.pos
	for s.pos < len(s.data) {
		if s.pos+8 <= len(s.data) { // eight bytes at a time while none is special
			if m := specialBytes(binary.LittleEndian.Uint64(s.data[s.pos:])); m == 0 {
				s.pos += 8
				continue
			} else {
				s.pos += bits.TrailingZeros64(m) / 8
			}
		}
		c := s.data[s.pos]
		if !strSpecial[c] {
			s.pos++
			continue
		}
		switch {
		case c == '"':
			b := s.data[start:s.pos]
			s.pos++
			return b, nil
		case c == '\\':
			return s.strEscaped(start)
		case c < 0x20:
			return nil, s.fail("control character in string")
		default:
			s.pos++
		}
	}
	return nil, errJSONEnd
}

// strEscaped decodes the rest of a string that contains an escape into the
// arena.
func (s *jsonScanner) strEscaped(start int) ([]byte, error) {
	a0 := len(s.arena)
	s.arena = append(s.arena, s.data[start:s.pos]...)
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return s.arena[a0:len(s.arena):len(s.arena)], nil
		case c < 0x20:
			return nil, s.fail("control character in string")
		case c != '\\':
			s.arena = append(s.arena, c)
			s.pos++
			continue
		}
		s.pos++
		if s.pos >= len(s.data) {
			return nil, errJSONEnd
		}
		e := s.data[s.pos]
		s.pos++
		switch e {
		case '"', '\\', '/':
			s.arena = append(s.arena, e)
		case 'b':
			s.arena = append(s.arena, '\b')
		case 'f':
			s.arena = append(s.arena, '\f')
		case 'n':
			s.arena = append(s.arena, '\n')
		case 'r':
			s.arena = append(s.arena, '\r')
		case 't':
			s.arena = append(s.arena, '\t')
		case 'u':
			r, err := s.hex4()
			if err != nil {
				return nil, err
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return nil, s.fail("lone trailing surrogate in \\u escape")
			case r >= 0xD800 && r <= 0xDBFF:
				if s.pos+1 >= len(s.data) {
					if s.pos >= len(s.data) || s.data[s.pos] == '\\' {
						return nil, errJSONEnd
					}
					return nil, s.fail("lone leading surrogate in \\u escape")
				}
				if s.data[s.pos] != '\\' || s.data[s.pos+1] != 'u' {
					return nil, s.fail("lone leading surrogate in \\u escape")
				}
				s.pos += 2
				r2, err := s.hex4()
				if err != nil {
					return nil, err
				}
				if r2 < 0xDC00 || r2 > 0xDFFF {
					return nil, s.fail("lone leading surrogate in \\u escape")
				}
				r = 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00)
			}
			s.arena = utf8.AppendRune(s.arena, r)
		default:
			return nil, s.fail("invalid escape")
		}
	}
	return nil, errJSONEnd
}

func (s *jsonScanner) hex4() (rune, error) {
	var r rune
	for i := 0; i < 4; i++ {
		if s.pos >= len(s.data) {
			return 0, errJSONEnd
		}
		c := s.data[s.pos]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, s.fail("invalid \\u escape")
		}
		r = r<<4 | rune(v)
		s.pos++
	}
	return r, nil
}

// members re-scans an already validated object value into its members.
func (s *jsonScanner) members(v jsonValue) []jsonMember {
	sub := jsonScanner{arena: s.arena}
	out, _ := sub.scanObject(v.raw, nil)
	s.arena = sub.arena
	return out
}

// elements re-scans an already validated array value into its elements.
func (s *jsonScanner) elements(v jsonValue) []jsonValue { return s.appendElements(v, nil) }

// appendElements is elements appending to dst, so that the per-record list
// decoders can reuse one buffer.
func (s *jsonScanner) appendElements(v jsonValue, out []jsonValue) []jsonValue {
	sub := jsonScanner{data: v.raw, pos: 1, arena: s.arena}
	sub.skipWS()
	if sub.pos < len(sub.data) && sub.data[sub.pos] == ']' {
		return out
	}
	for sub.pos < len(sub.data) {
		val, err := sub.value(1)
		if err != nil {
			break
		}
		out = append(out, val)
		sub.skipWS()
		if sub.pos >= len(sub.data) || sub.data[sub.pos] != ',' {
			break
		}
		sub.pos++
		sub.skipWS()
	}
	s.arena = sub.arena
	return out
}
