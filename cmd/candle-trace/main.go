// Command candle-trace reads candle-graph/trace/10 traces: validate them
// against candle-graph's rules, report where a captured step spent its
// time, compare two runs, and export or merge them into a Chrome trace for
// Perfetto. See internal/report/cli for the commands and docs/cli.md.
package main

import (
	"os"

	"github.com/candle-trace/candle-trace/internal/report/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
