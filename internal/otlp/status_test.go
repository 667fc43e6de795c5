package otlp

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pbField appends one field: a varint for wire type 0, bytes for 2.
func pbField(b []byte, num, wire int, v uint64, data []byte) []byte {
	b = binary.AppendUvarint(b, uint64(num)<<3|uint64(wire))
	if wire == 0 {
		return binary.AppendUvarint(b, v)
	}
	b = binary.AppendUvarint(b, uint64(len(data)))
	return append(b, data...)
}

func encodeStatus(code int32, msg string) []byte {
	return pbField(pbField(nil, 1, 0, uint64(uint32(code)), nil), 2, 2, 0, []byte(msg))
}

func encodePartialSuccess(rejected int64, msg string) []byte {
	inner := pbField(pbField(nil, 1, 0, uint64(rejected), nil), 2, 2, 0, []byte(msg))
	return pbField(nil, 1, 2, 0, inner)
}

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want rpcStatus
		err  string
	}{
		// What the collector answered to a body that is not protobuf.
		{"collector", []byte("\x08\x03\x12\x19proto: illegal wireType 7"), rpcStatus{3, "proto: illegal wireType 7"}, ""},
		{"empty", nil, rpcStatus{}, ""},
		{"details skipped", append(encodeStatus(14, "unavailable"), pbField(nil, 3, 2, 0, []byte("\x0a\x01x"))...), rpcStatus{14, "unavailable"}, ""},
		{"fixed64 and fixed32 skipped", append(append(encodeStatus(8, "m"), 0x21, 1, 2, 3, 4, 5, 6, 7, 8), 0x2d, 1, 2, 3, 4), rpcStatus{8, "m"}, ""},
		{"truncated length", []byte("\x12\x05ab"), rpcStatus{}, "truncated"},
		{"truncated varint", []byte("\x08\x80"), rpcStatus{}, "truncated"},
		{"varint too long", []byte("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f"), rpcStatus{}, "overflows 64 bits"},
		{"group", []byte("\x0b"), rpcStatus{}, "unsupported wire type 3"},
		{"field zero", []byte("\x00\x01"), rpcStatus{}, "invalid field number 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatus(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestParsePartialSuccess(t *testing.T) {
	got, err := parsePartialSuccess(encodePartialSuccess(12, "12 spans had no trace id"))
	require.NoError(t, err)
	assert.Equal(t, partialSuccess{12, "12 spans had no trace id"}, got)
	got, err = parsePartialSuccess(nil) // what a collector that kept everything sends
	require.NoError(t, err)
	assert.Equal(t, partialSuccess{}, got)
	_, err = parsePartialSuccess(pbField(nil, 1, 2, 0, []byte("\x08")))
	assert.ErrorContains(t, err, "truncated")
}

func TestErrorMessage(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes
	for _, tc := range []struct {
		name, contentType string
		body              []byte
		want              string
	}{
		{"protobuf status", "application/x-protobuf", encodeStatus(3, "bad span"), "bad span"},
		{"json status", "application/json", []byte(`{"code":3,"message":"bad json span"}`), "bad json span"},
		{"text", "text/plain; charset=utf-8", []byte("404 page not found\n"), "404 page not found"},
		{"html on one line", "text/html", []byte("<html>\n  <body>bad gateway</body>\n</html>"), "<html> <body>bad gateway</body> </html>"},
		{"protobuf that is not", "application/x-protobuf", []byte("oops"), "oops"},
		{"invalid utf-8", "text/plain", []byte("a\xffb"), "a\uFFFDb"},
		{"clipped at a rune", "text/plain", []byte(long), strings.Repeat("é", 256) + "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, errorMessage(tc.contentType, tc.body))
		})
	}
}

// The hand-written decoders must never panic, whatever a collector (or
// anything at its address) sends, and must read back what they are given.
func FuzzParseStatus(f *testing.F) {
	f.Add([]byte("\x08\x03\x12\x19proto: illegal wireType 7"))
	f.Add(encodeStatus(-1, "negative code"))
	f.Add(encodePartialSuccess(3, "rejected"))
	f.Add([]byte("\x12\x05ab"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseStatus(b)
		if err == nil {
			again, err := parseStatus(encodeStatus(st.Code, st.Message))
			require.NoError(t, err)
			require.Equal(t, st, again)
		}
		ps, err := parsePartialSuccess(b)
		if err == nil && ps.Rejected >= 0 {
			again, err := parsePartialSuccess(encodePartialSuccess(ps.Rejected, ps.Message))
			require.NoError(t, err)
			require.Equal(t, ps, again)
		}
		msg := errorMessage("application/x-protobuf", b)
		require.LessOrEqual(t, len(msg), maxMessage+len("…"))
		require.NotContains(t, msg, "\n")
	})
}
