package trace

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxLineBytes caps one line. candle-graph has no cap; ours keeps a
// corrupt file without newlines from taking all memory.
const DefaultMaxLineBytes = 64 << 20

var errLineTooLong = errors.New("line too long")

// LineReader yields the lines of a trace one at a time, reusing its buffer.
type LineReader struct {
	r    *bufio.Reader
	max  int
	buf  []byte
	N    int   // number of the line last returned (1-based)
	read int64 // bytes consumed so far
}

func NewLineReader(r io.Reader, max int) *LineReader {
	if max <= 0 {
		max = DefaultMaxLineBytes
	}
	return &LineReader{r: bufio.NewReaderSize(r, 256<<10), max: max}
}

// next returns the next line without "\n" or "\r\n", and whether a newline
// ended it (false only for a last line without one). It returns io.EOF
// after the last line. The slice is valid until the next call.
func (lr *LineReader) Next() (line []byte, terminated bool, err error) {
	lr.buf = lr.buf[:0]
	for {
		chunk, err := lr.r.ReadSlice('\n')
		lr.read += int64(len(chunk))
		if len(lr.buf)+len(chunk) > lr.max+2 { // room for "\r\n"
			lr.N++
			return nil, false, errLineTooLong
		}
		switch {
		case err == nil:
			if len(lr.buf) == 0 {
				line = chunk
			} else {
				lr.buf = append(lr.buf, chunk...)
				line = lr.buf
			}
			lr.N++
			return dropEOL(line), true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			lr.buf = append(lr.buf, chunk...)
		case errors.Is(err, io.EOF):
			lr.buf = append(lr.buf, chunk...)
			if len(lr.buf) == 0 {
				return nil, false, io.EOF
			}
			lr.N++
			return lr.buf, false, nil
		default:
			return nil, false, err
		}
	}
}

func dropEOL(b []byte) []byte {
	b = b[:len(b)-1]
	if len(b) > 0 && b[len(b)-1] == '\r' {
		b = b[:len(b)-1]
	}
	return b
}

// trimSpace trims Unicode White_Space, as Rust's str::trim does.
func TrimSpace(b []byte) []byte {
	if len(b) > 0 && b[0] < utf8.RuneSelf && b[len(b)-1] < utf8.RuneSelf && !asciiSpace(b[0]) && !asciiSpace(b[len(b)-1]) {
		return b
	}
	return bytes.TrimFunc(b, unicode.IsSpace)
}

func asciiSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\v', '\f', '\r':
		return true
	}
	return false
}

// cutUTF8 reports whether b is valid UTF-8 except for an incomplete
// multi-byte sequence at its very end, as left by a write cut mid-character.
func cutUTF8(b []byte) bool {
	for k := 1; k <= 3 && k <= len(b); k++ {
		head, tail := b[:len(b)-k], b[len(b)-k:]
		if utf8.Valid(head) && !utf8.FullRune(tail) {
			return true
		}
	}
	return false
}

// Rewindable is r as a reader that can be read again from where it stands
// now, with that offset: a file is re-read in a second pass (memory records
// out of timestamp order) rather than having its records kept. It is nil
// for a pipe, or for a seeker that cannot say where it stands.
func Rewindable(r io.Reader) (io.ReadSeeker, int64) {
	seeker, ok := r.(io.ReadSeeker)
	if !ok {
		return nil, 0
	}
	origin, err := seeker.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, 0
	}
	return seeker, origin
}
