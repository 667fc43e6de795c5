// Package otlp sends what candle-trace measured to an OpenTelemetry
// Collector over OTLP/HTTP with protobuf bodies (POST /v1/traces and
// /v1/metrics), the protocol every collector and most tracing backends
// receive:
//
//   - package traces streams a candle-graph/trace/10 trace as spans (spans
//     with their parent links, ops and host-clock device intervals as child
//     spans), in batches, holding only the open spans; it is a package of
//     its own because it reads traces (internal/report), which the library's
//     push has no use for;
//   - SummaryMetrics and ExportSummary turn an aggregate summary into
//     metrics (metrics.go: a histogram per span name with the summary's own
//     buckets, gauges and sums for the scalars and the summary's counters);
//   - Pusher (push.go) pushes an aggregate session's summaries on its
//     interval from a goroutine of its own, dropping and counting what the
//     collector does not take;
//   - Client (client.go) posts, retries where that can help, and turns a
//     refusal into an error that names the URL, the status and the
//     collector's message (status.go decodes it).
//
// The payloads are built with the collector's own pdata (ptrace, pmetric)
// and its protobuf marshalers, whose output is the Export*ServiceRequest
// message itself. Every attribute and metric name is listed in
// docs/otlp.md.
package otlp
