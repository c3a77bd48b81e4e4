// Command luffymq runs a LuffyMQ broker: MQTT v5 whose shared subscriptions
// give each message to the member that will start it soonest.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/luffymq/luffymq/broker"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := broker.ConfigFromArgs(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, broker.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "luffymq:", err)
		return 2
	}
	b, err := broker.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "luffymq:", err)
		return 2
	}
	if err := b.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "luffymq:", err)
		_ = b.Close()
		return 1
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "luffymq: stopping:", err)
		return 1
	}
	return 0
}
