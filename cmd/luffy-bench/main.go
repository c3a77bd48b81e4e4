// Command luffy-bench runs LuffyMQ's benchmarks (docs/scenarios.md) against
// Mosquitto, vanilla Mochi MQTT and a perfect-information oracle, and writes
// JSON, markdown and PNG plots.
//
//	luffy-bench shared --scenario thesis-2 --repeat 3 --out bench/results
//	luffy-bench throughput --out bench/results
package main

import (
	"os"

	"github.com/luffymq/luffymq/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
