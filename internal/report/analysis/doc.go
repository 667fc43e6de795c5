// Package analysis is what `candle-trace report` computes from one trace:
// where the captured step spent its time (spans and ops by name, with self
// time and percentiles), whether the device sat idle, the memory peak,
// gradients, tensor statistics and an overhead analysis. Analyze runs
// health's check and, when Options.Report asks for it, folds the records the
// checker accepted into bounded summaries; the Report is built from those and
// from the checker's model once the whole trace is read.
//
// It imports health and trace; the outputs (text, compare, ...) import it.
package analysis
