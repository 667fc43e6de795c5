// Package chrome writes Chrome Trace Event JSON (for ui.perfetto.dev and
// chrome://tracing) as it reads a trace: ExportChrome keeps one record per
// span, the live storages and each tensor's producing op, never the events;
// Merge exports several ranks into one timeline, aligned by their wall
// clocks at open. It reads package trace's records directly and judges
// nothing (validate does), so a partial trace exports as far as it goes.
package chrome
