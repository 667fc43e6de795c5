package cuda

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Collector names of the "collect" option.
const (
	CollectNVML  = "nvml"
	CollectCUPTI = "cupti"
)

// DefaultCollect is what ct_device_start starts when "collect" is absent.
// CUPTI is asked for explicitly: it costs more and holds the process's one
// CUPTI subscriber.
var DefaultCollect = []string{CollectNVML}

// StartOptions is the parsed options_json of ct_device_start.
type StartOptions struct {
	Collect  []string      // CollectNVML, CollectCUPTI; never empty
	Interval time.Duration // NVML sampling period
	Devices  []int         // CUDA ordinals; nil = every visible device
	CUPTILib string        // "cupti_lib": a libcupti file or folder to try first
	// UnspannedLaunches is "unspanned_launches": where device work launched
	// from a thread with no open span goes: UnspannedRoot (s1, the default)
	// or UnspannedMainThread.
	UnspannedLaunches string
}

// Values of "unspanned_launches".
const (
	// UnspannedRoot attributes work launched from a thread with no open span
	// to the root s1: the span innermost on the launching thread.
	UnspannedRoot = "root"
	// UnspannedMainThread attributes it to the span innermost, at launch, on
	// the session's main thread (the one that began the measured region,
	// else the first to open a span): PyTorch's autograd launches backward
	// kernels from its own thread while the main thread waits in backward.
	UnspannedMainThread = "main_thread"
)

// Wants reports whether collector name was requested.
func (o StartOptions) Wants(name string) bool {
	for _, c := range o.Collect {
		if c == name {
			return true
		}
	}
	return false
}

// ParseStartOptions reads ct_device_start's options_json strictly:
//
//	{"collect":["nvml","cupti"], "interval_ms":10, "devices":[0],
//	 "cupti_lib":"/path/to/libcupti.so.12", "unspanned_launches":"main_thread"}
//
// Every key is optional; nil or empty data means all defaults. Unknown and
// duplicate keys, unknown or repeated collectors, an empty "collect", an
// interval_ms that is not an integer in [1, 60000], and device ordinals
// that are not distinct non-negative integers are CT_ERR_INVALID_ARGUMENT.
func ParseStartOptions(data []byte) (StartOptions, error) {
	o := StartOptions{Collect: append([]string(nil), DefaultCollect...), Interval: DefaultInterval,
		UnspannedLaunches: UnspannedRoot}
	if len(bytes.TrimSpace(data)) == 0 {
		return o, nil
	}
	fields, err := topLevel(data)
	if err != nil {
		return o, optErr("%v", err)
	}
	for _, f := range fields {
		switch f.key {
		case "collect":
			var names []string
			if err := json.Unmarshal(f.val, &names); err != nil || names == nil {
				return o, optErr(`"collect" must be an array of strings ("nvml", "cupti")`)
			}
			if len(names) == 0 {
				return o, optErr(`"collect" is empty: name at least one of "nvml", "cupti" (or leave it out for the default)`)
			}
			seen := map[string]bool{}
			for _, n := range names {
				if n != CollectNVML && n != CollectCUPTI {
					return o, optErr(`"collect": unknown collector %q (known: "nvml", "cupti")`, n)
				}
				if seen[n] {
					return o, optErr(`"collect": %q is listed twice`, n)
				}
				seen[n] = true
			}
			o.Collect = names
		case "interval_ms":
			ms, err := integer(f.val)
			if err != nil || ms < 1 || ms > int64(MaxInterval/time.Millisecond) {
				return o, optErr(`"interval_ms" must be an integer from 1 to %d, got %s`, MaxInterval/time.Millisecond, f.val)
			}
			o.Interval = time.Duration(ms) * time.Millisecond
		case "devices":
			var raw []json.RawMessage
			if err := json.Unmarshal(f.val, &raw); err != nil || raw == nil {
				return o, optErr(`"devices" must be an array of CUDA device ordinals, e.g. [0, 1]`)
			}
			if len(raw) == 0 {
				return o, optErr(`"devices" is empty: list CUDA ordinals, or leave it out for every visible device`)
			}
			seen := map[int64]bool{}
			o.Devices = make([]int, 0, len(raw))
			for _, r := range raw {
				d, err := integer(r)
				if err != nil || d < 0 || d > math.MaxInt32 {
					return o, optErr(`"devices": %s is not a CUDA device ordinal (a non-negative integer)`, r)
				}
				if seen[d] {
					return o, optErr(`"devices": %d is listed twice`, d)
				}
				seen[d] = true
				o.Devices = append(o.Devices, int(d))
			}
		case "cupti_lib":
			var p string
			if err := json.Unmarshal(f.val, &p); err != nil || strings.TrimSpace(p) == "" {
				return o, optErr(`"cupti_lib" must be a non-empty string: a libcupti file or the folder holding it`)
			}
			o.CUPTILib = p
		case "unspanned_launches":
			var v string
			if err := json.Unmarshal(f.val, &v); err != nil || (v != UnspannedRoot && v != UnspannedMainThread) {
				return o, optErr(`"unspanned_launches" must be %q or %q, got %s`, UnspannedRoot, UnspannedMainThread, f.val)
			}
			o.UnspannedLaunches = v
		default:
			return o, optErr(`unknown key %q (known: "collect", "interval_ms", "devices", "cupti_lib", "unspanned_launches")`, f.key)
		}
	}
	return o, nil
}

func optErr(format string, args ...any) error {
	return invalidArg("ct_device_start: options_json: "+format, args...)
}

type field struct {
	key string
	val json.RawMessage
}

// topLevel splits a JSON object into its fields, refusing duplicate keys
// and trailing data.
func topLevel(data []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("must be a JSON object")
	}
	var out []field
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON: %v", err)
		}
		key := tok.(string) // object keys are always strings
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("invalid JSON: %v", err)
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		out = append(out, field{key, val})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: unexpected data after the object")
	}
	return out, nil
}

// integer accepts a JSON integer literal only (10, not 10.0 or "10").
func integer(raw json.RawMessage) (int64, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || (t[0] != '-' && (t[0] < '0' || t[0] > '9')) {
		return 0, errors.New("not a number")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var n json.Number
	if err := dec.Decode(&n); err != nil {
		return 0, err
	}
	return n.Int64()
}
