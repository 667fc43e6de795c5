// Command otelcol is the smallest OpenTelemetry Collector that the OTLP tests
// need: an OTLP receiver (HTTP and gRPC), the batch processor, the contrib
// file exporter, which writes what it received as OTLP JSON lines that a
// test can read back, and the nop exporter. It lives in its own Go module so that the
// collector's dependency tree (grpc, the otel SDK, zap, ...) never enters
// the library's go.mod; `make otelcol` builds it into
// build/tools/otelcol/otelcol once per machine.
//
// Every collector module is pinned to one release (collector v0.161.0 with
// its v1.67.0 stable modules, contrib v0.161.0): the contrib file exporter is
// served at v0.161.0 and mixing releases fails to build.
package main

import (
	"fmt"
	"os"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/nopexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// version names the collector release the distribution is assembled from.
const version = "0.161.0"

func components() (otelcol.Factories, error) {
	var f otelcol.Factories
	var err error
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return f, err
	}
	// nop drops what it gets: the benchmark measures the export and the
	// receiver, not the file exporter's JSON encoding.
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory(), nopexporter.NewFactory()); err != nil {
		return f, err
	}
	// The collector refuses to start without a telemetry factory (its own
	// logs and metrics); the config's service.telemetry section sets it.
	f.Telemetry = otelconftelemetry.NewFactory()
	return f, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "candle-trace's test collector: otlp receiver, batch processor, file and nop exporters",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// file: for the config each test writes; env: because
				// otelcol makes it the scheme of a bare ${VAR} and refuses
				// to start without it.
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "otelcol:", err)
		os.Exit(1)
	}
}
