package otlp

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// What a collector answers, decoded by hand: the two small messages of the
// OTLP/HTTP protocol that a client reads, google.rpc.Status (the body of an
// error response) and Export*ServiceResponse (whose partial_success says
// what was rejected). pdata has no exported decoder for either without the
// gRPC packages of p*otlp, which would enter the shared library for four
// fields; the wire format needs only varints and length-delimited fields.

var errTruncated = errors.New("protobuf: truncated")

// pbReader walks the fields of one protobuf message.
type pbReader struct {
	b []byte
}

// next returns the next field's number and wire type, and its value: the
// varint for wire type 0, the bytes for wire type 2; fixed-width fields
// (1, 5) are skipped over and returned as bytes. Groups (3, 4) are refused:
// no OTLP message uses them.
func (r *pbReader) next() (num int, wire int, varint uint64, data []byte, err error) {
	key, err := r.varint()
	if err != nil {
		return 0, 0, 0, nil, err
	}
	num, wire = int(key>>3), int(key&7)
	if num <= 0 || key>>3 > 1<<29-1 {
		return 0, 0, 0, nil, fmt.Errorf("protobuf: invalid field number %d", key>>3)
	}
	switch wire {
	case 0:
		varint, err = r.varint()
	case 1:
		data, err = r.take(8)
	case 2:
		var n uint64
		if n, err = r.varint(); err == nil {
			if n > uint64(len(r.b)) {
				return 0, 0, 0, nil, errTruncated
			}
			data, err = r.take(int(n))
		}
	case 5:
		data, err = r.take(4)
	default:
		err = fmt.Errorf("protobuf: unsupported wire type %d", wire)
	}
	return num, wire, varint, data, err
}

func (r *pbReader) varint() (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		if i >= len(r.b) {
			return 0, errTruncated
		}
		c := r.b[i]
		if i == 9 && c > 1 {
			return 0, errors.New("protobuf: varint overflows 64 bits")
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.b = r.b[i+1:]
			return v, nil
		}
	}
	return 0, errors.New("protobuf: varint longer than 10 bytes")
}

func (r *pbReader) take(n int) ([]byte, error) {
	if n > len(r.b) {
		return nil, errTruncated
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out, nil
}

// rpcStatus is google.rpc.Status: code = 1, message = 2 (details, 3, are
// not read).
type rpcStatus struct {
	Code    int32
	Message string
}

func parseStatus(b []byte) (rpcStatus, error) {
	var st rpcStatus
	err := eachField(b, func(num, wire int, v uint64, data []byte) error {
		switch {
		case num == 1 && wire == 0:
			st.Code = int32(v)
		case num == 2 && wire == 2:
			st.Message = string(data)
		}
		return nil
	})
	if err != nil {
		return rpcStatus{}, err
	}
	return st, nil
}

// partialSuccess is the partial_success (field 1) of ExportTraceServiceResponse
// and ExportMetricsServiceResponse: rejected spans or data points (1) and
// the collector's message (2).
type partialSuccess struct {
	Rejected int64
	Message  string
}

func parsePartialSuccess(b []byte) (partialSuccess, error) {
	var ps partialSuccess
	err := eachField(b, func(num, wire int, _ uint64, data []byte) error {
		if num != 1 || wire != 2 {
			return nil
		}
		return eachField(data, func(num, wire int, v uint64, data []byte) error {
			switch {
			case num == 1 && wire == 0:
				ps.Rejected = int64(v)
			case num == 2 && wire == 2:
				ps.Message = string(data)
			}
			return nil
		})
	})
	if err != nil {
		return partialSuccess{}, err
	}
	return ps, nil
}

// eachField calls f with every field of the message in b.
func eachField(b []byte, f func(num, wire int, varint uint64, data []byte) error) error {
	r := pbReader{b}
	for len(r.b) > 0 {
		num, wire, v, data, err := r.next()
		if err != nil {
			return err
		}
		if err := f(num, wire, v, data); err != nil {
			return err
		}
	}
	return nil
}

// maxMessage bounds how much of a collector's error text goes into an
// error: enough for any real message, not a whole HTML page.
const maxMessage = 512

// errorMessage is the collector's explanation in an error response: the
// Status message of a protobuf body (what OTLP/HTTP prescribes), the
// "message" of a JSON one, else the body as text (a proxy's page).
func errorMessage(contentType string, body []byte) string {
	ct := strings.ToLower(contentType)
	switch {
	case strings.Contains(ct, "protobuf"):
		if st, err := parseStatus(body); err == nil && st.Message != "" {
			return clip(st.Message)
		}
	case strings.Contains(ct, "json"):
		var st struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &st) == nil && st.Message != "" {
			return clip(st.Message)
		}
	}
	return clip(strings.TrimSpace(string(body)))
}

// clip cuts s to maxMessage bytes at a rune boundary and makes it valid
// UTF-8 on one line.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
