package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A strict JSON reader for the run provenance. encoding/json alone accepts what candle-graph
// rejects (duplicate keys, 2.0 for an integer) and silently replaces invalid UTF-8, so the
// run JSON is first read into a small tree that keeps number literals and refuses duplicate
// keys, and the fields are then taken from the tree with exact type checks.

// maxDepth bounds nesting; the deepest valid run JSON is 5 levels, and the bound keeps a
// hostile input from recursing without limit.
const maxDepth = 32

// jsonObject keeps keys in document order so that the first unknown key reported is the
// first one in the input.
type jsonObject struct {
	keys []string
	vals map[string]any
}

// A tree value is one of: *jsonObject, []any, string, json.Number, bool, nil.

func decodeStrict(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("input is not valid UTF-8")
	}
	if err := checkSurrogates(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: unexpected data after the top-level value")
	}
	return v, nil
}

func readValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, errors.New("invalid JSON: unexpected end of input")
		}
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxDepth {
			return nil, fmt.Errorf("invalid JSON: nested deeper than %d levels", maxDepth)
		}
		if t == '{' {
			return readObject(dec, depth+1)
		}
		if t == '[' {
			return readArray(dec, depth+1)
		}
		return nil, fmt.Errorf("invalid JSON: unexpected %q", rune(t))
	default:
		return t, nil
	}
}

func readObject(dec *json.Decoder, depth int) (any, error) {
	o := &jsonObject{vals: map[string]any{}}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON: %v", err)
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			return o, nil
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("invalid JSON: object key is not a string")
		}
		if _, dup := o.vals[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		v, err := readValue(dec, depth)
		if err != nil {
			return nil, err
		}
		o.keys = append(o.keys, key)
		o.vals[key] = v
	}
}

func readArray(dec *json.Decoder, depth int) (any, error) {
	arr := []any{}
	for {
		if !dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("invalid JSON: %v", err)
			}
			if d, ok := tok.(json.Delim); ok && d == ']' {
				return arr, nil
			}
			return nil, errors.New("invalid JSON: malformed array")
		}
		v, err := readValue(dec, depth)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
	}
}

// describe names a tree value's type (and short value) for error messages.
func describe(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(t)
	case string:
		if len(t) > 40 {
			t = t[:40] + "..."
		}
		return "string " + strconv.Quote(t)
	case json.Number:
		return "number " + t.String()
	case []any:
		return "an array"
	case *jsonObject:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// fields reads typed values out of one object; path is the dotted path of the object ("" for
// the top level), used to name fields in messages.
type fields struct {
	path string
	obj  *jsonObject
}

func (f fields) name(key string) string {
	if f.path == "" {
		return strconv.Quote(key)
	}
	return strconv.Quote(f.path + "." + key)
}

// checkKeys refuses any key not in allowed; a typo would otherwise silently fall back to a
// default.
func (f fields) checkKeys(allowed ...string) error {
	for _, k := range f.obj.keys {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("unknown key %s (allowed: %s)", f.name(k), strings.Join(allowed, ", "))
		}
	}
	return nil
}

// get returns the value of key and whether the key is present.
func (f fields) get(key string) (any, bool) {
	v, ok := f.obj.vals[key]
	return v, ok
}

// str reads a string. nullable: JSON null counts as absent (candle-graph Option fields);
// otherwise null is refused, as candle-graph refuses it for defaulted fields.
func (f fields) str(key string, required, nullable bool) (string, bool, error) {
	v, ok := f.get(key)
	if !ok || (v == nil && nullable) {
		if required {
			return "", false, fmt.Errorf("%s is required", f.name(key))
		}
		return "", false, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", false, fmt.Errorf("%s must be a string, got %s", f.name(key), describe(v))
	}
	return s, true, nil
}

func (f fields) uint(key string, required bool) (uint64, bool, error) {
	v, ok := f.get(key)
	if !ok {
		if required {
			return 0, false, fmt.Errorf("%s is required", f.name(key))
		}
		return 0, false, nil
	}
	n, err := asUint(v)
	if err != nil {
		return 0, false, fmt.Errorf("%s %v", f.name(key), err)
	}
	return n, true, nil
}

// asUint accepts only a JSON integer literal in u64 range: candle-graph refuses 2.0, 2e0
// and "2" for a u64.
func asUint(v any) (uint64, error) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("must be a non-negative integer, got %s", describe(v))
	}
	s := num.String()
	if strings.ContainsAny(s, ".eE") {
		return 0, fmt.Errorf("must be an integer literal (no fraction or exponent), got %s", s)
	}
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("must be a non-negative integer, got %s", s)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("must fit in a u64, got %s", s)
	}
	return n, nil
}

func (f fields) boolean(key string) (bool, error) {
	v, ok := f.get(key)
	if !ok {
		return false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, fmt.Errorf("%s must be true or false, got %s", f.name(key), describe(v))
	}
	return b, nil
}

// object reads a nested object; nullable as for str.
func (f fields) object(key string, nullable bool) (fields, bool, error) {
	v, ok := f.get(key)
	if !ok || (v == nil && nullable) {
		return fields{}, false, nil
	}
	o, isObj := v.(*jsonObject)
	if !isObj {
		return fields{}, false, fmt.Errorf("%s must be an object, got %s", f.name(key), describe(v))
	}
	p := key
	if f.path != "" {
		p = f.path + "." + key
	}
	return fields{path: p, obj: o}, true, nil
}

// array reads a nested array (absent = nil, null refused).
func (f fields) array(key string) ([]any, bool, error) {
	v, ok := f.get(key)
	if !ok {
		return nil, false, nil
	}
	a, isArr := v.([]any)
	if !isArr {
		return nil, false, fmt.Errorf("%s must be an array, got %s", f.name(key), describe(v))
	}
	return a, true, nil
}

// strings reads an array of strings. Absent and [] both give nil, so a parsed run compares
// equal however the empty list was spelled.
func (f fields) strings(key string) ([]string, error) {
	arr, _, err := f.array(key)
	if err != nil || len(arr) == 0 {
		return nil, err
	}
	out := make([]string, 0, len(arr))
	for i, v := range arr {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s must be a string, got %s", f.elem(key, i), describe(v))
		}
		out = append(out, s)
	}
	return out, nil
}

func (f fields) elem(key string, i int) string {
	p := key
	if f.path != "" {
		p = f.path + "." + key
	}
	return strconv.Quote(fmt.Sprintf("%s[%d]", p, i))
}

// enum reads a string that must be one of allowed; absent gives def.
func (f fields) enum(key string, required bool, def string, allowed ...string) (string, error) {
	s, ok, err := f.str(key, required, false)
	if err != nil {
		return "", err
	}
	if !ok {
		return def, nil
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", fmt.Errorf("%s must be one of %s, got %q", f.name(key), strings.Join(allowed, "|"), s)
}

// checkSurrogates refuses \u escapes of unpaired UTF-16 surrogates, which
// encoding/json silently turns into U+FFFD and candle-graph rejects. It only
// looks at escapes inside strings; anything else malformed is left to the
// decoder.
func checkSurrogates(data []byte) error {
	hex4 := func(i int) (rune, bool) {
		if i+4 > len(data) {
			return 0, false
		}
		v, err := strconv.ParseUint(string(data[i:i+4]), 16, 16)
		return rune(v), err == nil
	}
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(data) && data[i+1] == 'u' {
				r, ok := hex4(i + 2)
				switch {
				case !ok:
				case r >= 0xD800 && r <= 0xDBFF:
					lo, ok := rune(0), false
					if i+7 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
						lo, ok = hex4(i + 8)
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return fmt.Errorf("invalid JSON: unpaired UTF-16 surrogate \\u%04X", r)
					}
					i += 11
					continue
				case r >= 0xDC00 && r <= 0xDFFF:
					return fmt.Errorf("invalid JSON: unpaired UTF-16 surrogate \\u%04X", r)
				}
				i += 5
				continue
			}
			i++ // skip the escaped character
		}
	}
	return nil
}
