// Package sensors simulates a fleet of IoT devices that publish readings.
package sensors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/luffymq/luffymq/clientsdk"
)

// Config describes a simulated fleet.
type Config struct {
	// Broker is the broker URL.
	Broker string
	// Devices is the number of devices, each with its own connection.
	Devices int
	// Rate is the number of readings each device publishes per second.
	Rate float64
	// PayloadSize pads each JSON reading with spaces up to this many bytes.
	PayloadSize int
	// TopicPattern is the topic of a device's readings; {id} stands for
	// the device number (1 to Devices).
	TopicPattern string
	// QoS is the publish QoS.
	QoS byte
	// Duration stops publishing after this long (0: no limit).
	Duration time.Duration
	// Count stops each device after this many readings (0: no limit).
	Count int
	// ClientIDPrefix prefixes each device's client ID.
	ClientIDPrefix string
	// Out receives one progress line per second and a summary.
	Out io.Writer
	// Logger receives the clients' logs.
	Logger *slog.Logger
}

// Summary is what a run published.
type Summary struct {
	Sent   uint64
	Failed uint64
}

func (c Config) validate() error {
	switch {
	case c.Broker == "":
		return errors.New("broker URL is empty")
	case c.Devices < 1:
		return fmt.Errorf("devices %d: want at least 1", c.Devices)
	case c.Rate <= 0 || math.IsInf(c.Rate, 0) || math.IsNaN(c.Rate):
		return fmt.Errorf("rate %v: want a positive number of readings per second", c.Rate)
	case c.PayloadSize < 0:
		return fmt.Errorf("payload size %d is negative", c.PayloadSize)
	case c.TopicPattern == "" || strings.ContainsAny(c.TopicPattern, "+#"):
		return fmt.Errorf("topic pattern %q: want a topic without wildcards, such as sensors/{id}/temp", c.TopicPattern)
	case c.QoS > 2:
		return fmt.Errorf("qos %d: want 0, 1 or 2", c.QoS)
	case c.Duration < 0 || c.Count < 0:
		return fmt.Errorf("duration %s and count %d must not be negative", c.Duration, c.Count)
	}
	return nil
}

// Topic returns the topic of device id.
func Topic(pattern string, id int) string {
	return strings.ReplaceAll(pattern, "{id}", strconv.Itoa(id))
}

// Reading returns the payload of reading seq of device id: a JSON object
// padded with spaces to size bytes (longer if the object itself is).
func Reading(id, seq int, value float64, size int) []byte {
	b := fmt.Appendf(nil, `{"device":%d,"seq":%d,"value":%.2f}`, id, seq, value)
	for len(b) < size {
		b = append(b, ' ')
	}
	return b
}

// Run connects the devices and publishes until ctx ends, Duration passes or
// every device has sent Count readings.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if err := cfg.validate(); err != nil {
		return Summary{}, fmt.Errorf("sensors: %w", err)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	pubs := make([]*clientsdk.Publisher, cfg.Devices)
	defer func() {
		for _, p := range pubs {
			if p != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = p.Close(cctx)
				cancel()
			}
		}
	}()
	for i := range pubs {
		p, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{
			ConnectionConfig: clientsdk.ConnectionConfig{
				Brokers:  []string{cfg.Broker},
				ClientID: fmt.Sprintf("%s%d", cfg.ClientIDPrefix, i+1),
				Logger:   cfg.Logger,
			},
			StampSentAt:    true,
			StampMessageID: cfg.QoS > 0,
		})
		if err != nil {
			return Summary{}, fmt.Errorf("sensors: %w", err)
		}
		if err := p.Start(ctx); err != nil {
			return Summary{}, fmt.Errorf("sensors: device %d: %w", i+1, err)
		}
		pubs[i] = p
	}
	fmt.Fprintf(cfg.Out, "%d devices connected to %s; each publishes %.4g readings/s to %s at QoS %d\n",
		cfg.Devices, cfg.Broker, cfg.Rate, Topic(cfg.TopicPattern, 1), cfg.QoS)

	var sent, failed atomic.Uint64
	var wg sync.WaitGroup
	gap := time.Duration(float64(time.Second) / cfg.Rate)
	for i, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := i + 1
			// Spread the devices over one gap so they do not publish in bursts.
			next := time.Now().Add(gap * time.Duration(i) / time.Duration(cfg.Devices))
			topic := Topic(cfg.TopicPattern, id)
			for seq := 1; cfg.Count == 0 || seq <= cfg.Count; seq++ {
				t := time.NewTimer(time.Until(next))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				value := 20 + 5*math.Sin(float64(seq)/10+float64(id))
				if err := p.Publish(ctx, topic, Reading(id, seq, value, cfg.PayloadSize), clientsdk.PublishOptions{QoS: cfg.QoS}); err != nil {
					if ctx.Err() != nil {
						return
					}
					failed.Add(1)
					cfg.Logger.Warn("publish failed", "device", id, "error", err)
				} else {
					sent.Add(1)
				}
				next = next.Add(gap) // a fixed schedule: no drift from slow publishes
			}
		}()
	}

	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last uint64
	for {
		select {
		case <-done:
			s := Summary{Sent: sent.Load(), Failed: failed.Load()}
			fmt.Fprintf(cfg.Out, "done: sent=%d failed=%d\n", s.Sent, s.Failed)
			return s, nil
		case <-tick.C:
			n := sent.Load()
			fmt.Fprintf(cfg.Out, "sent=%d (+%d/s) failed=%d\n", n, n-last, failed.Load())
			last = n
		}
	}
}
