// Command luffy-bench runs LuffyMQ's benchmarks (docs/scenarios.md) against
// Mosquitto, vanilla Mochi MQTT and a perfect-information greedy oracle,
// and writes JSON, markdown and PNG plots.
//
//	luffy-bench shared --scenario thesis-2 --repeat 3 --subscriber sdk,thesis-reporter --out bench/results
//	luffy-bench throughput --repeat 3 --out bench/results
//	luffy-bench mochi-server --listen 127.0.0.1:1883
//
// Every broker runs as a process of its own; vanilla Mochi runs as this
// command's mochi-server subcommand.
package main

import (
	"os"

	"github.com/luffymq/luffymq/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
