// Package worker runs a shared-subscription worker that emulates processing
// and prints its load once a second.
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/luffymq/luffymq/clientsdk"
)

// Config describes a worker.
type Config struct {
	// Broker is the broker URL.
	Broker string
	// ClientID is the MQTT client ID ("" for a random one).
	ClientID string
	// Group and Filters name the shared subscription.
	Group   string
	Filters []string
	// QoS is the subscription QoS.
	QoS byte
	// ProcessTime is the emulated processing time per message.
	ProcessTime clientsdk.ServiceTime
	// Workers is the number of messages processed at once.
	Workers int
	// QueueCapacity bounds the pending queue (0: the SDK default).
	QueueCapacity int
	// ReportInterval overrides the broker's report interval (0: follow it).
	ReportInterval time.Duration
	// ReportVia is the report channel.
	ReportVia clientsdk.ReportChannel
	// Out receives one line per second.
	Out io.Writer
	// Logger receives the client's logs.
	Logger *slog.Logger
}

// Run processes messages until ctx ends, then closes gracefully.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	emulator := &clientsdk.ServiceEmulator{ServiceTime: cfg.ProcessTime, Lanes: max(cfg.Workers, 1), Seed: uint64(time.Now().UnixNano())}
	sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{
			Brokers:  []string{cfg.Broker},
			ClientID: cfg.ClientID,
			Logger:   cfg.Logger,
		},
		Group:          cfg.Group,
		Filters:        cfg.Filters,
		QoS:            cfg.QoS,
		Handler:        emulator.Handle,
		Workers:        cfg.Workers,
		QueueCapacity:  cfg.QueueCapacity,
		ReportInterval: cfg.ReportInterval,
		ReportVia:      cfg.ReportVia,
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := sub.Start(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return fmt.Errorf("worker: %w", err)
	}
	st := sub.Stats()
	fmt.Fprintf(cfg.Out, "worker in group %q on %v at QoS %d; processing emulation: drift-free virtual schedule, %s per message, %d at a time; reports via %s every %s\n",
		cfg.Group, cfg.Filters, cfg.QoS, cfg.ProcessTime, max(cfg.Workers, 1), st.ReportVia, st.ReportInterval)

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := sub.Close(cctx)
			st := sub.Stats()
			fmt.Fprintf(cfg.Out, "closed: received=%d processed=%d failed=%d dropped=%d\n", st.Received, st.Processed, st.Failed, st.Dropped)
			if err != nil {
				return fmt.Errorf("worker: %w", err)
			}
			return nil
		case <-tick.C:
			st := sub.Stats()
			fmt.Fprintln(cfg.Out, StatsLine(st, st.Received-last))
			last = st.Received
		}
	}
}

// StatsLine formats the once-a-second line: messages received in the last
// second and in total, pending, in flight and the mean processing time.
func StatsLine(st clientsdk.Stats, receivedLastSecond uint64) string {
	return fmt.Sprintf("received=%d/s (total %d) pending=%d inflight=%d processed=%d mean_processing=%.1fms reports=%d via=%s",
		receivedLastSecond, st.Received, st.Pending, st.InFlight, st.Processed,
		float64(st.MeanProcessingTime)/float64(time.Millisecond), st.ReportsSent, st.ReportVia)
}
