package htmlview

import (
	"io"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/report/aggsummary"
)

// AggregatePage is the page of an aggregate summary (candle-trace/aggregate/1):
// the report of `candle-trace report SUMMARY` (per-name distributions,
// categories and the compute hypothesis, scalars), drawn.
type AggregatePage struct {
	Name      string                      `json:"name"`
	Aggregate *aggsummary.AggregateReport `json:"aggregate"`
}

// Aggregate builds the page of a read summary with the default categories
// and threshold, as `report SUMMARY` without flags does.
func Aggregate(name string, s *aggregate.Summary) *AggregatePage {
	r := aggsummary.AnalyzeAggregate(name, s, aggsummary.NewCategorizer(nil), aggsummary.DefaultComputeThreshold)
	return &AggregatePage{Name: name, Aggregate: r}
}

// WriteHTML writes the summary's page as one self-contained HTML file.
func (p *AggregatePage) WriteHTML(w io.Writer) error {
	return writePage(w, "candle-trace view: "+p.Name, p)
}
