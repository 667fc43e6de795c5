package aggregate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/candle-trace/candle-trace/internal/outfile"
)

// DefaultInterval is how often a started Writer rewrites the summary. A
// rewrite costs a snapshot (a lock held for a copy of the statistics) and
// a small file; ten seconds bounds what a killed run loses.
const DefaultInterval = 10 * time.Second

// FS is the filesystem seam of the Writer: the real one is OSFS, tests
// substitute one that fails or records.
type FS interface {
	// CreateTemp creates a new file in dir, like os.CreateTemp.
	CreateTemp(dir, pattern string) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	// SyncDir makes a rename in dir durable.
	SyncDir(dir string) error
}

// File is what the Writer needs of an open file.
type File interface {
	io.Writer
	Name() string
	Sync() error
	Close() error
}

// OSFS is the operating system's filesystem.
type OSFS struct{}

func (OSFS) CreateTemp(dir, pattern string) (File, error) { return os.CreateTemp(dir, pattern) }
func (OSFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }
func (OSFS) Remove(name string) error                     { return os.Remove(name) }

func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Ticker is the seam for the Writer's interval: the real one wraps
// time.Ticker, tests drive the channel by hand.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// TickerFunc makes a Ticker for an interval.
type TickerFunc func(d time.Duration) Ticker

type timeTicker struct{ t *time.Ticker }

func (t timeTicker) C() <-chan time.Time { return t.t.C }
func (t timeTicker) Stop()               { t.t.Stop() }

// SystemTicker is time.NewTicker.
func SystemTicker(d time.Duration) Ticker { return timeTicker{time.NewTicker(d)} }

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithInterval sets the rewrite interval (DefaultInterval); 0 or less
// means no periodic rewrite, only WriteNow and Finish.
func WithInterval(d time.Duration) WriterOption { return func(w *Writer) { w.interval = d } }

// WithFS replaces the filesystem.
func WithFS(fs FS) WriterOption { return func(w *Writer) { w.fs = fs } }

// WithTicker replaces time.NewTicker.
func WithTicker(f TickerFunc) WriterOption { return func(w *Writer) { w.newTicker = f } }

// WithProducer sets the producer block (default: name "candle-trace", this
// process's pid and hostname).
func WithProducer(p Producer) WriterOption { return func(w *Writer) { w.producer = p } }

// Pusher sends each summary somewhere besides the file (internal/otlp's
// push to a collector). Offer is called from the Writer's goroutine (or
// WriteNow's and Finish's caller) after each write and must return at once;
// Stats says how the pushes went so far, written into the summary as its
// "otlp" block.
type Pusher interface {
	Offer(*Summary)
	Stats() OTLPPush
}

// WithPush pushes every summary written to p as well.
func WithPush(p Pusher) WriterOption { return func(w *Writer) { w.push = p } }

// ErrFinished is returned by writes after Finish.
var ErrFinished = errors.New("aggregate: writer already finished")

// Writer rewrites the summary file of an Aggregator atomically: each write
// goes to a temporary file in the same folder, is fsynced, and is renamed
// over the summary (then the folder is fsynced), so a reader — or a run
// killed mid-write — only ever sees a complete summary, the previous one
// until the rename. A failed write leaves the previous summary in place,
// removes its temporary file, and is reported by Err; later writes try
// again, because a full disk may clear while training goes on. What stands
// at the path must be a regular file (or nothing): a device, a FIFO, a
// socket, a directory or a symbolic link there is never renamed over, nor a
// file that is not empty, a summary or a trace (OwnFile); each write fails
// instead (outfile.CheckReplace).
type Writer struct {
	path, dir, pattern string
	agg                *Aggregator
	run                Run
	producer           Producer
	interval           time.Duration
	fs                 FS
	newTicker          TickerFunc
	push               Pusher

	mu       sync.Mutex // serializes writes
	seq      uint64
	started  bool
	finished bool
	lastErr  error

	stop chan struct{}
	done chan struct{}
}

// NewWriter returns a Writer of agg's summary to path. Nothing is written
// until Start, WriteNow or Finish.
func NewWriter(path string, agg *Aggregator, run Run, opts ...WriterOption) (*Writer, error) {
	if err := run.Validate(); err != nil {
		return nil, err
	}
	if run.Tags == nil {
		run.Tags = map[string]string{}
	}
	host, _ := os.Hostname()
	w := &Writer{
		path:      path,
		dir:       filepath.Dir(path),
		pattern:   "." + filepath.Base(path) + ".tmp-*",
		agg:       agg,
		run:       run,
		producer:  Producer{Name: "candle-trace", PID: os.Getpid(), Hostname: host},
		interval:  DefaultInterval,
		fs:        OSFS{},
		newTicker: SystemTicker,
	}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// Start writes the first summary — so that a path that cannot be written
// fails now, not minutes into the run — and then rewrites it every
// interval until Finish.
func (w *Writer) Start() error {
	w.mu.Lock()
	started := w.started
	w.started = true
	w.mu.Unlock()
	if started {
		return errors.New("aggregate: writer already started")
	}
	if err := w.WriteNow(); err != nil {
		return err
	}
	if w.interval <= 0 {
		return nil
	}
	stop, done := make(chan struct{}), make(chan struct{})
	w.mu.Lock()
	w.stop, w.done = stop, done
	w.mu.Unlock()
	t := w.newTicker(w.interval)
	go func() {
		defer close(done)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C():
				_ = w.WriteNow() // kept for Err
			}
		}
	}()
	return nil
}

// WriteNow writes the summary as it is now.
func (w *Writer) WriteNow() error { return w.write(false) }

// Finish stops the periodic rewrite and writes the final summary (final:
// true). It does not disable the aggregator.
func (w *Writer) Finish() error {
	w.mu.Lock()
	stop, done := w.stop, w.done
	w.stop = nil
	w.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	return w.write(true)
}

// Err returns the error of the latest write, nil once a write succeeds
// again.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Sequence returns how many summaries have been written.
func (w *Writer) Sequence() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

func (w *Writer) write(final bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return ErrFinished
	}
	s := w.agg.Snapshot()
	s.Run, s.Producer, s.Sequence, s.Final = w.run, w.producer, w.seq+1, final
	if w.push != nil {
		st := w.push.Stats()
		s.OTLP = &st
		// Pushed whether or not the file could be written: a full disk
		// must not also blind the collector.
		defer w.push.Offer(s)
	}
	var buf bytes.Buffer
	renamed := false
	err := s.Encode(&buf)
	if err == nil {
		renamed, err = w.replace(buf.Bytes())
	}
	w.lastErr = err
	if renamed {
		// On disk now, even if the folder sync failed: the next summary
		// must carry the next number.
		w.seq++
		w.finished = final
	}
	return err
}

// replace writes data to a temporary file and renames it over the summary;
// renamed reports whether the rename happened.
func (w *Writer) replace(data []byte) (renamed bool, err error) {
	f, err := w.fs.CreateTemp(w.dir, w.pattern)
	if err != nil {
		return false, fmt.Errorf("aggregate: summary %s: %w", w.path, err)
	}
	tmp := f.Name()
	fail := func(err error) (bool, error) {
		_ = w.fs.Remove(tmp)
		return false, fmt.Errorf("aggregate: summary %s: %w", w.path, err)
	}
	n, err := f.Write(data)
	if err == nil && n != len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		f.Close()
		return fail(err)
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return fail(err)
	}
	if err = f.Close(); err != nil {
		return fail(err)
	}
	// Only a regular file (or nothing) is ever replaced: never a device, a
	// FIFO or a symbolic link that stands at the path, nor anyone else's file.
	if err = outfile.CheckReplace(w.path, OwnFile); err != nil {
		return fail(err)
	}
	if err = w.fs.Rename(tmp, w.path); err != nil {
		return fail(err)
	}
	// The summary is complete either way; a failed folder sync only means
	// the rename might not survive a power cut, so it is not undone.
	if err := w.fs.SyncDir(w.dir); err != nil {
		return true, fmt.Errorf("aggregate: summary %s: syncing the folder: %w", w.path, err)
	}
	return true, nil
}
