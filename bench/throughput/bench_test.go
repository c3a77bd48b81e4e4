package throughput

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/broker"
)

// BenchmarkSharedFanInInProcess runs the set-B shared fan-in test against an
// in-process luffymq (adaptive) and vanilla Mochi (in process here, unlike
// luffy-bench throughput, which runs every broker as a process), so that
// `go test -bench SharedFanIn -cpuprofile cpu.out ./bench/` profiles the
// broker's hot path. b.N scales the messages per publisher (× 1000).
func BenchmarkSharedFanInInProcess(b *testing.B) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	brokers := map[string]func() (harness.RunningBroker, error){
		"luffymq-adaptive": func() (harness.RunningBroker, error) {
			br, err := broker.New(broker.Config{MQTTListen: "127.0.0.1:0", Strategy: "adaptive", Logger: logger})
			if err != nil {
				return nil, err
			}
			if err := br.Start(); err != nil {
				return nil, err
			}
			return inProcessLuffy{br}, nil
		},
		"mochi": func() (harness.RunningBroker, error) {
			return harness.StartVanillaMochi("127.0.0.1:0", logger)
		},
	}
	for _, qos := range []byte{0, 1} {
		for _, name := range []string{"luffymq-adaptive", "mochi"} {
			b.Run(name+"/qos"+string('0'+qos), func(b *testing.B) {
				br, err := brokers[name]()
				if err != nil {
					b.Fatal(err)
				}
				defer br.Close()
				cfg := ThroughputConfig{Publishers: 4, SharedMessages: 1000 * b.N, Members: 3, InFlight: 16, Repeat: 1, Timeout: time.Minute}
				b.ResetTimer()
				run := runThroughput(context.Background(), ThroughputTest{ID: "shared", Shared: true, QoS: qos}, name, 1, br, cfg, logger)
				b.StopTimer()
				if run.Error != "" {
					b.Fatal(run.Error)
				}
				if run.Stalled {
					b.Fatalf("%s stalled after %d of %d deliveries", name, run.Delivered, run.Expected)
				}
				b.ReportMetric(run.MsgsPerS, "msgs/s")
				b.ReportMetric(float64(run.Dropped), "dropped")
			})
		}
	}
}

type inProcessLuffy struct{ b *broker.Broker }

func (l inProcessLuffy) Addr() string { return l.b.MQTTAddr() }
func (l inProcessLuffy) Close() error { return l.b.Close() }
