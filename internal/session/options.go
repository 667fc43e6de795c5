package session

import (
	"io"
	"time"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/outfile"
)

// DefaultFlushInterval bounds how old an event can be before it is on disk:
// a killed process loses at most this much of its trace.
const DefaultFlushInterval = 50 * time.Millisecond

// DefaultWriteChunk is how much encoded output is buffered before a write
// happens between flush ticks.
const DefaultWriteChunk = 256 << 10

// Sink receives the encoded trace. It is the seam tests use to fake disks.
type Sink interface {
	io.Writer
	io.Closer
}

// Opener creates the sink for a trace path.
type Opener func(path string) (Sink, error)

// DefaultOpener creates the trace file (outfile.Create): it never follows
// a final symbolic link, and truncates an existing file only when it is
// empty or candle-trace's own (a trace or a summary, by its first bytes).
// Its disk blocks are reserved ahead of the writes (reservingFile).
func DefaultOpener(path string) (Sink, error) {
	f, err := outfile.Create(path, aggregate.OwnFile)
	if err != nil {
		return nil, err
	}
	return reserving(f), nil
}

// Producer names the program that wrote the trace (meta.producer).
type Producer struct {
	Name, Version, Binding string
}

// DefaultProducer is the library itself, reached through the C ABI.
var DefaultProducer = Producer{Name: "candle-trace", Version: Version, Binding: "c"}

// Version of the library, reported by ct_version and meta.producer.
const Version = "0.1.0"

type options struct {
	flushInterval time.Duration
	writeChunk    int
	opener        Opener
	producer      Producer
}

// Option configures Open.
type Option func(*options)

// WithFlushInterval sets the background flush period (> 0).
func WithFlushInterval(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.flushInterval = d
		}
	}
}

// WithWriteChunk sets how many encoded bytes are buffered before writing.
func WithWriteChunk(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.writeChunk = n
		}
	}
}

// WithOpener replaces how the trace file is created.
func WithOpener(f Opener) Option {
	return func(o *options) {
		if f != nil {
			o.opener = f
		}
	}
}

// WithProducer names the binding that wrote the trace.
func WithProducer(p Producer) Option { return func(o *options) { o.producer = p } }

func newOptions(opts []Option) options {
	o := options{
		flushInterval: DefaultFlushInterval,
		writeChunk:    DefaultWriteChunk,
		opener:        DefaultOpener,
		producer:      DefaultProducer,
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}
