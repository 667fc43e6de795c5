package chrome

import (
	"bufio"
	"io"
	"strconv"
	"unicode/utf8"
)

// ChromeWriter writes a Chrome Trace Event JSON document (the object form:
// {"traceEvents": [...], ...}), which ui.perfetto.dev and chrome://tracing
// open. Events are written as they come through a bounded buffer; nothing
// is kept but counts. Several traces may be exported into one writer
// (merge); flow ids stay unique across them.
type ChromeWriter struct {
	w      *bufio.Writer
	buf    []byte
	events int
	phases [len(phaseNames)]int // events per phase, by index in phaseNames
	others map[string]int       // events of any other phase
	flowID uint64
	err    error
}

// NewChromeWriter starts a document on w.
func NewChromeWriter(w io.Writer) *ChromeWriter {
	c := &ChromeWriter{w: bufio.NewWriterSize(w, 256<<10)}
	_, c.err = c.w.WriteString("{\"traceEvents\":[\n")
	return c
}

// Events is the number of trace events written so far.
func (c *ChromeWriter) Events() int { return c.events }

// Phases counts the events written per "ph" value.
func (c *ChromeWriter) Phases() map[string]int {
	out := map[string]int{}
	for ph, n := range c.others {
		out[ph] = n
	}
	for i, n := range c.phases {
		if n > 0 {
			out[phaseNames[i]] = n
		}
	}
	return out
}

// phaseNames are the "ph" values the exporter writes. Counting them in an
// array, not a map, saves a map update per event.
var phaseNames = [...]string{"X", "C", "M", "s", "f"}

func (c *ChromeWriter) countPhase(ph string) {
	for i, name := range phaseNames {
		if ph == name {
			c.phases[i]++
			return
		}
	}
	if c.others == nil {
		c.others = map[string]int{}
	}
	c.others[ph]++
}

// Close ends the document with otherData (string values) and flushes.
func (c *ChromeWriter) Close(otherData map[string]string) error {
	b := append(c.buf[:0], "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{"...)
	for i, k := range sortedKeys(otherData) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, otherData[k])
	}
	b = append(b, "}}\n"...)
	c.write(b)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}

// event starts one event in c.buf: the fields every phase has. The caller
// appends its own fields and calls done.
func (c *ChromeWriter) event(ph string, name []byte, cat string, tsNS uint64, pid int64, tid uint64) []byte {
	b := c.buf[:0]
	if c.events > 0 {
		b = append(b, ",\n"...)
	}
	b = append(b, `{"ph":"`...)
	b = append(b, ph...)
	b = append(b, `","name":`...)
	b = appendJSONString(b, name)
	if cat != "" {
		b = append(b, `,"cat":"`...)
		b = append(b, cat...)
		b = append(b, '"')
	}
	b = append(b, `,"ts":`...)
	b = appendMicros(b, tsNS)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, pid, 10)
	b = append(b, `,"tid":`...)
	b = strconv.AppendUint(b, tid, 10)
	c.countPhase(ph)
	return b
}

func (c *ChromeWriter) done(b []byte) {
	b = append(b, '}')
	c.buf = b
	c.events++
	c.write(b)
}

func (c *ChromeWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// metadata writes an "M" event (process_name, thread_name, *_sort_index).
func (c *ChromeWriter) metadata(name string, pid int64, tid uint64, key string, value []byte, number bool) {
	b := c.event("M", []byte(name), "", 0, pid, tid)
	b = append(b, `,"args":{"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	if number {
		b = append(b, value...)
	} else {
		b = appendJSONString(b, value)
	}
	c.done(append(b, '}'))
}

func (c *ChromeWriter) processName(pid int64, name string, sortIndex int) {
	c.metadata("process_name", pid, 0, "name", []byte(name), false)
	c.metadata("process_sort_index", pid, 0, "sort_index", strconv.AppendInt(nil, int64(sortIndex), 10), true)
}

func (c *ChromeWriter) threadName(pid int64, tid uint64, name string) {
	c.metadata("thread_name", pid, tid, "name", []byte(name), false)
}

// appendMicros writes nanoseconds as exact decimal microseconds: Chrome's
// unit is the µs, and a float would round large timestamps.
func appendMicros(b []byte, ns uint64) []byte {
	b = strconv.AppendUint(b, ns/1000, 10)
	frac := ns % 1000
	if frac == 0 {
		return b
	}
	digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
	n := 3
	for digits[n-1] == '0' {
		n--
	}
	b = append(b, '.')
	return append(b, digits[:n]...)
}

// appendJSONString quotes s as a JSON string. Trace text is valid UTF-8
// (the reader refuses anything else); invalid bytes would become U+FFFD.
func appendJSONString[T ~string | ~[]byte](b []byte, s T) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
			i++
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			i++
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
			if r == utf8.RuneError && size == 1 {
				b = append(b, "\ufffd"...)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
		}
	}
	return append(b, '"')
}
