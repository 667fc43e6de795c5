// Package cuda holds candle-trace's device collectors, started by
// ct_device_start: an NVML sampler of device memory (sampler.go) and, when
// built, the CUPTI activity reader.
//
// Every dependency on the machine sits behind a seam: NVML behind Library
// and Device (go-nvml's real interface, or its mock package in tests), the
// session behind Clock and MemorySink. Nothing here needs a GPU to build or
// test; the real NVML is reached through nvmlbind's forwarding stubs so the
// shared library keeps no undefined symbol.
package cuda

import (
	"fmt"
	"strings"
	"sync"
)

// Target is what collectors write into: the session.
type Target interface {
	Clock
	MemorySink
}

// Option configures Start.
type Option func(*startConfig)

type startConfig struct {
	openNVML func() (Library, error)
	sampler  []SamplerOption
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
	nvml *Sampler
	mu   sync.Mutex
	done bool
}

// Start starts what o asks for, all or nothing: when one requested collector
// cannot start, none runs and the error (CT_ERR_UNAVAILABLE naming what is
// missing, or CT_ERR_INVALID_ARGUMENT) says why.
func Start(t Target, o StartOptions, opts ...Option) (*Collectors, error) {
	cfg := startConfig{openNVML: DefaultOpenNVML}
	for _, f := range opts {
		f(&cfg)
	}
	if o.Wants(CollectCUPTI) {
		return nil, unavailable("ct_device_start: the CUPTI collector is not built into this version of candle-trace; start with {\"collect\":[\"nvml\"]} for device memory only")
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
		s.Start()
	}
	return c, nil
}

// prefixed names ct_device_start in a message that does not already.
func prefixed(err error) error {
	if e, ok := err.(interface{ Error() string }); ok && !strings.HasPrefix(e.Error(), "ct_device_start") {
		if se := asSessionError(err); se != nil {
			se.Msg = "ct_device_start: " + se.Msg
			return se
		}
		return fmt.Errorf("ct_device_start: %w", err)
	}
	return err
}

// Sampler is the NVML sampler, nil when not collecting NVML.
func (c *Collectors) Sampler() *Sampler { return c.nvml }

// Flush writes what the collectors hold now (a fresh NVML sample), leaving
// them running.
func (c *Collectors) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || c.nvml == nil {
		return nil
	}
	return c.nvml.SampleOnce()
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
	if c.nvml != nil {
		return c.nvml.Stop()
	}
	return nil
}
