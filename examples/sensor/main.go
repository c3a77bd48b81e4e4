// Command sensor simulates IoT devices publishing readings to an MQTT
// broker.
//
//	go run ./examples/sensor --devices 10 --rate 10 --duration 30s
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/examples/internal/sensors"
)

func main() {
	var cfg sensors.Config
	var qos uint
	flag.StringVar(&cfg.Broker, "broker", "mqtt://localhost:1883", "broker URL (mqtt://, mqtts:// or ws://)")
	flag.IntVar(&cfg.Devices, "devices", 3, "number of simulated devices, one connection each")
	flag.Float64Var(&cfg.Rate, "rate", 10, "readings per second per device")
	flag.IntVar(&cfg.PayloadSize, "payload-size", 100, "pad each JSON reading to this many bytes")
	flag.StringVar(&cfg.TopicPattern, "topic", "sensors/{id}/temp", "topic pattern; {id} is the device number")
	flag.UintVar(&qos, "qos", 0, "publish QoS: 0, 1 or 2")
	flag.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (0: until --count or Ctrl-C)")
	flag.IntVar(&cfg.Count, "count", 0, "readings per device before stopping (0: no limit)")
	flag.StringVar(&cfg.ClientIDPrefix, "client-id-prefix", "sensor-", "client ID prefix; the device number follows")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: sensor [flags]\n\nSimulates IoT devices publishing readings, with their send time stamped for latency measurements.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if qos > 2 {
		fmt.Fprintf(os.Stderr, "sensor: --qos %d: want 0, 1 or 2\n", qos)
		os.Exit(2)
	}
	cfg.QoS = byte(qos)
	cfg.Out = os.Stdout
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := sensors.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
