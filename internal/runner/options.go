// Package runner is `candle-trace run [options] -- COMMAND ARGS...`: it runs
// a program with the capture set up — the LD_PRELOAD drop-in for any
// program, the PyTorch integration (an injected sitecustomize) for a Python
// one — forwards signals to it, returns its exit status, and says at the end
// where the traces are and whether candle-graph would accept them.
package runner

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// DefaultCaptureStep is the update captured unless --capture-step says
// otherwise. Update 1 pays every one-time cost (lazy module and kernel
// initialisation, the optimizer creating its state: AdamW's moment buffers
// are allocated inside the first step, the caching allocator growing);
// update 2 is the first with the optimizer's state in place but can still
// grow the allocator's pool for the freed first-update blocks; update 3 is
// the first steady one. It is also candle_trace.torch.profile's default.
const DefaultCaptureStep = 3

// DefaultMaxTraces is how many traces a watched run writes at most unless
// --max-traces says otherwise (candle_trace.torch.watch's default).
const DefaultMaxTraces = 3

// DefaultOutput is the trace path pattern: %p is the pid of the process
// that writes it, %r its $RANK (0 when unset).
const DefaultOutput = "candle-trace-%p.jsonl"

// Options are the flags of `candle-trace run`.
type Options struct {
	CaptureStep int
	Output      string
	// Match: the drop-in's process patterns (CANDLE_TRACE_MATCH); empty
	// means the command's own name.
	Match string
	// DeviceCollect: "auto" (CUPTI when the model is on CUDA; nothing in
	// the drop-in), "none", or a comma-separated list of nvml, cupti.
	DeviceCollect string
	// Aggregate: a path pattern for the whole-run summary (PyTorch only).
	Aggregate string
	// Watch: the folder a watched run (PyTorch only) writes the traces of
	// the updates its triggers pick into; "" captures CaptureStep instead.
	Watch string
	// MaxTraces: the most traces a watched run writes.
	MaxTraces int
	// NoFlightRecorder: a watched run records no update, only captures the
	// one after a trigger in full.
	NoFlightRecorder bool
	// Command and its arguments.
	Command []string
}

// Usage is the help text of `candle-trace run`.
const Usage = `usage: candle-trace run [options] -- COMMAND ARGS...

Runs COMMAND with the capture set up, returns its exit status, and prints at
the end where each trace is with a one-line verdict.

A Python command (python, python3, a virtualenv's python, python -m ..., or a
script whose #! line names python, such as torchrun) gets the PyTorch
integration with no change to the script: once it imports torch, each
optimizer.step() of the process ends an update, and update N (--capture-step)
is captured with module spans, aten ops, memory, tensor statistics and one
gradient per parameter of the models the first optimizer trains. With no
optimizer, each call of the outermost module is a step (phase infer). Only
the main process writes a trace: DataLoader workers and other child processes
write nothing; under torchrun each rank writes its own, named with its rank.

Any other command runs under the LD_PRELOAD drop-in: each process whose name
matches --match writes one trace whose measured region is its whole run.

options:
  --capture-step N    the update to capture (default 3: update 1 pays the
                      one-time costs, update 2 may still grow the allocator,
                      3 is the first steady one)
  --output PATTERN    trace path; %p is the writer's pid, %r its $RANK
                      (default candle-trace-%p.jsonl; under torchrun -rank%r
                      is added before .jsonl when PATTERN has no %r)
  --match PATTERNS    drop-in only: comma-separated shell patterns of the
                      program names to trace (default: COMMAND's name)
  --device-collect C  auto (default: CUPTI kernels when the model is on
                      CUDA), none, or a list of nvml,cupti
  --aggregate PATH    PyTorch only: also write a whole-run summary
                      (candle-trace/aggregate/1) to PATH (%p, %r as above)
  --watch FOLDER      PyTorch only: no capture step; every update runs under
                      a flight recorder, and the update that is slow, whose
                      loss is not finite or that raises is written to FOLDER
                      as update-N-TRIGGER.jsonl, with the update after it
                      captured in full (candle_trace.torch.watch's defaults);
                      under torchrun each rank's names carry -rankN
  --max-traces N      with --watch: the most traces the run writes (default 3)
  --no-flight-recorder  with --watch: record no update, only capture the one
                      after a trigger in full (what the recorder costs a loop
                      whose updates are short: the run warns from 5%)

The libraries are found at $CANDLE_TRACE_LIB, else next to this executable,
else in the installed candle_trace Python package, else in a source
checkout's build/.
`

// ErrHelp is returned by Parse for -h/--help: the caller prints Usage.
var ErrHelp = errors.New("help requested")

// Parse reads the flags; the command starts at "--" or at the first
// argument that is no flag.
func Parse(args []string) (*Options, error) {
	o := &Options{}
	fs := flag.NewFlagSet("candle-trace run", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; the caller prints them with Usage
	fs.IntVar(&o.CaptureStep, "capture-step", DefaultCaptureStep, "")
	fs.StringVar(&o.Output, "output", DefaultOutput, "")
	fs.StringVar(&o.Match, "match", "", "")
	fs.StringVar(&o.DeviceCollect, "device-collect", "auto", "")
	fs.StringVar(&o.Aggregate, "aggregate", "", "")
	fs.StringVar(&o.Watch, "watch", "", "")
	fs.IntVar(&o.MaxTraces, "max-traces", DefaultMaxTraces, "")
	fs.BoolVar(&o.NoFlightRecorder, "no-flight-recorder", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, ErrHelp
		}
		return nil, err
	}
	o.Command = fs.Args()
	if len(o.Command) > 0 && o.Command[0] == "--" {
		o.Command = o.Command[1:]
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := o.checkWatch(given); err != nil {
		return nil, err
	}
	return o, o.check()
}

// checkWatch refuses the flags a watched run would ignore: its traces are
// the updates its triggers pick, named by update and trigger in the folder.
func (o *Options) checkWatch(given map[string]bool) error {
	if given["watch"] && strings.TrimSpace(o.Watch) == "" {
		return errors.New("--watch must name a folder")
	}
	if o.Watch == "" {
		for _, f := range []string{"max-traces", "no-flight-recorder"} {
			if given[f] {
				return fmt.Errorf("--%s is for --watch (a run without it writes one trace)", f)
			}
		}
		return nil
	}
	for _, f := range []string{"capture-step", "output"} {
		if given[f] {
			return fmt.Errorf("--%s and --watch: a watched run captures the updates its triggers pick "+
				"and writes them into the --watch folder as update-N-TRIGGER.jsonl", f)
		}
	}
	if o.MaxTraces < 0 {
		return fmt.Errorf("--max-traces must be >= 0, got %d", o.MaxTraces)
	}
	return nil
}

func (o *Options) check() error {
	if len(o.Command) == 0 {
		return errors.New("no command given (candle-trace run [options] -- COMMAND ARGS...)")
	}
	if o.CaptureStep < 1 {
		return fmt.Errorf("--capture-step must be >= 1, got %d", o.CaptureStep)
	}
	if strings.TrimSpace(o.Output) == "" {
		return errors.New("--output must not be empty")
	}
	if _, err := o.Collectors(); err != nil {
		return err
	}
	return nil
}

// Absolute makes the output and aggregate patterns absolute, so that the
// child writes where the runner looks whatever directory it changes to.
func (o *Options) Absolute() error {
	for _, p := range []*string{&o.Output, &o.Aggregate, &o.Watch} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	return nil
}

// Collectors is --device-collect as a list: nil for auto, empty for none.
func (o *Options) Collectors() ([]string, error) {
	switch strings.TrimSpace(o.DeviceCollect) {
	case "auto":
		return nil, nil
	case "none", "":
		return []string{}, nil
	}
	out := []string{}
	for _, c := range strings.Split(o.DeviceCollect, ",") {
		c = strings.TrimSpace(c)
		if c != "nvml" && c != "cupti" {
			return nil, fmt.Errorf("--device-collect: unknown collector %q (auto, none, nvml, cupti)", c)
		}
		out = append(out, c)
	}
	return out, nil
}
