package trace

import (
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Stream yields the decoded events of a trace one line at a time, with
// the reader's rules for the end of a file: it stops at the first line
// candle-graph could not parse (stop says why) and treats a cut last line
// before any terminal record as the end of a partial trace (cutLine). The
// decoded event lives in d until the next call.
type Stream struct {
	lr      *LineReader
	Decoded Decoder
	Line    int // line of the event last returned

	sawTerminal bool
	CutLine     int
	Stop        *Issue // a parse problem that ended the stream
	Err         error  // an I/O error that ended it

	// Skip, when set, is asked about every line whose kind SkimKind reads
	// from its first bytes; a line it skips is neither decoded nor checked
	// (not even its UTF-8): for a reader that wants a few kinds of records
	// out of a large trace, never for one that judges the trace.
	Skip func(k Kind, line []byte) bool
}

func NewStream(r io.Reader, maxLine int) *Stream {
	return &Stream{lr: NewLineReader(r, maxLine)}
}

// next decodes the next event. It returns false at the end of the stream:
// end of file, a cut last line, a parse problem or an I/O error.
func (s *Stream) Next() (Kind, bool) {
	for {
		raw, terminated, err := s.lr.Next()
		switch {
		case errors.Is(err, io.EOF):
			return 0, false
		case errors.Is(err, errLineTooLong):
			s.fail(CodeLineTooLong, fmt.Sprintf("line is longer than %d bytes", s.lr.max))
			return 0, false
		case err != nil:
			s.Err = err
			return 0, false
		}
		if s.Skip != nil {
			if k, ok := SkimKind(raw); ok && s.Skip(k, raw) {
				continue
			}
		}
		cuttable := !terminated && !s.sawTerminal
		if !utf8.Valid(raw) {
			if cuttable && cutUTF8(raw) {
				s.CutLine = s.lr.N
				return 0, false
			}
			s.fail(CodeInvalidUTF8, "line is not valid UTF-8")
			return 0, false
		}
		line := TrimSpace(raw)
		if len(line) == 0 {
			continue
		}
		k, err := s.Decoded.Decode(line)
		if err != nil {
			if cuttable && errors.Is(err, errJSONEnd) {
				s.CutLine = s.lr.N
				return 0, false
			}
			s.fail(codeOf(err), err.Error())
			return 0, false
		}
		if k == KindTerminal {
			s.sawTerminal = true
		}
		s.Line = s.lr.N
		return k, true
	}
}

// lines is the number of physical lines read so far.
func (s *Stream) Lines() int { return s.lr.N }

// bytesRead is the number of bytes read so far.
func (s *Stream) BytesRead() int64 { return s.lr.read }

func (s *Stream) fail(code, msg string) {
	s.Stop = &Issue{Severity: SeverityError, Code: code, Message: msg, Line: s.lr.N, Parse: true}
}

func codeOf(err error) string {
	var de *decodeError
	if errors.As(err, &de) {
		return de.code
	}
	return CodeInvalidJSON
}
