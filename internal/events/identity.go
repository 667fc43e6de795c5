package events

import (
	"fmt"
	"strings"
)

// ComparisonIdentity says which runs may be compared: two runs are comparable when every
// field but ImplementationID and PairID matches.
type ComparisonIdentity struct {
	WorkloadID, ModelID, ConfigID, DataID string
	SeedPolicy, Precision, DeviceState    string
	PhysicalBatch, AccumulationSteps      uint64
	ImplementationID                      *string // nil = absent
	PairID                                *string // nil = absent
}

// Validate applies candle-graph's ComparisonIdentity::validate; a violation there is a
// run_provenance_invalid error in every trace that carries the identity.
func (c *ComparisonIdentity) Validate() error {
	const p = "comparison_identity"
	for _, f := range [...]struct{ name, v string }{
		{"workload_id", c.WorkloadID}, {"model_id", c.ModelID}, {"config_id", c.ConfigID},
		{"data_id", c.DataID}, {"seed_policy", c.SeedPolicy}, {"precision", c.Precision},
		{"device_state", c.DeviceState},
	} {
		if strings.TrimSpace(f.v) == "" {
			return fmt.Errorf("%q must not be empty", p+"."+f.name)
		}
	}
	for _, f := range [...]struct {
		name string
		v    *string
	}{{"implementation_id", c.ImplementationID}, {"pair_id", c.PairID}} {
		if f.v != nil && strings.TrimSpace(*f.v) == "" {
			return fmt.Errorf("%q must not be empty when present (omit it instead)", p+"."+f.name)
		}
	}
	if c.PhysicalBatch == 0 {
		return fmt.Errorf("%q must be > 0", p+".physical_batch")
	}
	if c.AccumulationSteps == 0 {
		return fmt.Errorf("%q must be > 0", p+".accumulation_steps")
	}
	return nil
}

func parseIdentity(f fields) (*ComparisonIdentity, error) {
	if err := f.checkKeys("workload_id", "model_id", "config_id", "data_id", "seed_policy",
		"precision", "device_state", "physical_batch", "accumulation_steps",
		"implementation_id", "pair_id"); err != nil {
		return nil, err
	}
	c := &ComparisonIdentity{}
	var err error
	for _, s := range [...]struct {
		key string
		dst *string
	}{
		{"workload_id", &c.WorkloadID}, {"model_id", &c.ModelID}, {"config_id", &c.ConfigID},
		{"data_id", &c.DataID}, {"seed_policy", &c.SeedPolicy}, {"precision", &c.Precision},
		{"device_state", &c.DeviceState},
	} {
		if *s.dst, _, err = f.str(s.key, true, false); err != nil {
			return nil, err
		}
	}
	if c.PhysicalBatch, _, err = f.uint("physical_batch", true); err != nil {
		return nil, err
	}
	if c.AccumulationSteps, _, err = f.uint("accumulation_steps", true); err != nil {
		return nil, err
	}
	for _, s := range [...]struct {
		key string
		dst **string
	}{{"implementation_id", &c.ImplementationID}, {"pair_id", &c.PairID}} {
		v, ok, err := f.str(s.key, false, true)
		if err != nil {
			return nil, err
		}
		if ok {
			*s.dst = &v
		}
	}
	return c, nil
}
