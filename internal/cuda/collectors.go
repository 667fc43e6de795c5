// Package cuda holds candle-trace's device collectors, started by
// ct_device_start: an NVML sampler of device memory (sampler.go) and the
// CUPTI activity reader (package cupti: kernel, memcpy and memset intervals).
//
// Every dependency on the machine sits behind a seam: NVML behind Library
// and Device (go-nvml's real interface, or its mock package in tests),
// libcupti behind dlopen (a fake one in tests), the session behind Target.
// Nothing here needs a GPU or CUDA to build or test; the real NVML is reached
// through nvmlbind's forwarding stubs so the shared library keeps no
// undefined symbol.
package cuda

import (
	"fmt"
	"strings"
	"sync"

	"github.com/candle-trace/candle-trace/internal/cuda/cupti"
)

// Target is what collectors write into: the session.
type Target interface {
	Clock
	MemorySink
	cupti.Sink
}

// Option configures Start.
type Option func(*startConfig)

type startConfig struct {
	openNVML func() (Library, error)
	sampler  []SamplerOption
	cupti    cupti.Options
}

// WithCUPTIOptions sets the CUPTI collector's options ("cupti_lib" of the
// StartOptions still goes into Library when set).
func WithCUPTIOptions(o cupti.Options) Option {
	return func(c *startConfig) { c.cupti = o }
}

// WithNVMLOpener replaces how NVML is loaded (default DefaultOpenNVML).
func WithNVMLOpener(f func() (Library, error)) Option {
	return func(c *startConfig) {
		if f != nil {
			c.openNVML = f
		}
	}
}

// WithSamplerOptions passes options to the NVML sampler (after those Start
// derives from StartOptions).
func WithSamplerOptions(opts ...SamplerOption) Option {
	return func(c *startConfig) { c.sampler = append(c.sampler, opts...) }
}

// Collectors are the running collectors of one session.
type Collectors struct {
	nvml  *Sampler
	cupti *cupti.Collector
	mu    sync.Mutex
	done  bool
}

// Start starts what o asks for, all or nothing: when one requested collector
// cannot start, none runs and the error (CT_ERR_UNAVAILABLE naming what is
// missing, or CT_ERR_INVALID_ARGUMENT) says why.
func Start(t Target, o StartOptions, opts ...Option) (*Collectors, error) {
	cfg := startConfig{openNVML: DefaultOpenNVML}
	for _, f := range opts {
		f(&cfg)
	}
	c := &Collectors{}
	if o.Wants(CollectNVML) {
		lib, err := cfg.openNVML()
		if err != nil {
			return nil, prefixed(err)
		}
		sopts := append([]SamplerOption{WithInterval(o.Interval), WithDevices(o.Devices)}, cfg.sampler...)
		if o.Devices == nil {
			sopts[1] = WithDevices(nil)
		}
		s, err := NewSampler(lib, t, t, sopts...)
		if err != nil {
			return nil, prefixed(err)
		}
		c.nvml = s
	}
	if o.Wants(CollectCUPTI) {
		co := cfg.cupti
		if o.CUPTILib != "" {
			co.Library = o.CUPTILib
		}
		co.MainThreadFallback = o.UnspannedLaunches == UnspannedMainThread
		cc, err := cupti.Start(t, co)
		if err != nil {
			if c.nvml != nil {
				c.nvml.lib.Shutdown() // never started: nothing was sampled
			}
			return nil, prefixed(err)
		}
		c.cupti = cc
	}
	if c.nvml != nil {
		c.nvml.Start()
	}
	return c, nil
}

// prefixed names ct_device_start in a message that does not already.
func prefixed(err error) error {
	if e, ok := err.(interface{ Error() string }); ok && !strings.HasPrefix(e.Error(), "ct_device_start") {
		if se := asCTError(err); se != nil {
			se.Msg = "ct_device_start: " + se.Msg
			return se
		}
		return fmt.Errorf("ct_device_start: %w", err)
	}
	return err
}

// Sampler is the NVML sampler, nil when not collecting NVML.
func (c *Collectors) Sampler() *Sampler { return c.nvml }

// CUPTI is the CUPTI collector, nil when not collecting CUPTI.
func (c *Collectors) CUPTI() *cupti.Collector { return c.cupti }

// Flush writes what the collectors hold now (a fresh NVML sample; every
// device interval CUPTI has, and the dropped-record count so far), leaving
// them running: what a finish needs before its terminal line.
func (c *Collectors) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	var err error
	if c.cupti != nil {
		err = c.cupti.Flush()
	}
	if c.nvml != nil {
		if nerr := c.nvml.SampleOnce(); err == nil {
			err = nerr
		}
	}
	return err
}

// Stop stops every collector and writes what it still holds. Safe to call
// more than once; later calls do nothing.
func (c *Collectors) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	c.done = true
	var err error
	if c.cupti != nil {
		err = c.cupti.Stop()
	}
	if c.nvml != nil {
		if nerr := c.nvml.Stop(); err == nil {
			err = nerr
		}
	}
	return err
}
