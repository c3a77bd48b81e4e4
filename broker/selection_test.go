package broker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// testWorker is a shared-group member that queues what it receives, works
// through the queue one message at a time, and reports its load either in
// extended PINGREQs written raw on its connection (one Write each) or by
// publishing to $luffy/load.
type testWorker struct {
	client  *pahoClient
	service time.Duration
	via     string // "pingreq" or "publish"

	mu        sync.Mutex
	queue     []int
	processed int
	busyTotal time.Duration // processing time since the last report
	busyCount int
	reported  bool

	wake chan struct{}
}

func startTestWorker(t *testing.T, ctx context.Context, addr, id, filter string, service time.Duration, via string) *testWorker {
	w := &testWorker{service: service, via: via, wake: make(chan struct{}, 1)}
	w.client = connectPaho(t, addr, id, func(p *paho.Publish) {
		n, _ := strconv.Atoi(string(p.Payload))
		w.mu.Lock()
		w.queue = append(w.queue, n)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	})
	w.client.subscribe(t, filter, 0)
	go w.work(ctx)
	go w.reportEvery(ctx, 100*time.Millisecond)
	return w
}

func (w *testWorker) work(ctx context.Context) {
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
				continue
			}
		}
		w.queue = w.queue[1:]
		w.mu.Unlock()
		start := time.Now()
		time.Sleep(w.service)
		w.mu.Lock()
		w.processed++
		w.busyTotal += time.Since(start)
		w.busyCount++
		first := !w.reported
		w.mu.Unlock()
		if first {
			w.sendReport(ctx) // report as soon as a measurement exists
		}
	}
}

func (w *testWorker) reportEvery(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			w.sendReport(ctx)
		}
	}
}

func (w *testWorker) sendReport(ctx context.Context) {
	w.mu.Lock()
	r := report.Report{Pending: len(w.queue)}
	if w.busyCount > 0 {
		r.ProcessingTime = w.busyTotal / time.Duration(w.busyCount)
	}
	w.busyTotal, w.busyCount, w.reported = 0, 0, true
	w.mu.Unlock()
	if w.via == "pingreq" {
		_, _ = w.client.conn.Write(report.EncodePingreq(r))
		return
	}
	_, _ = w.client.Publish(ctx, &paho.Publish{Topic: report.LoadTopic, Payload: report.Encode(r)})
}

func (w *testWorker) count() int { return w.client.count() }

// TestSlowMemberGetsFewerMessages runs three members (8, 8 and 32 ms per
// message) at about 70 % of the group's capacity: load-aware strategies
// must hand the slow member clearly fewer messages than the fast ones, with
// reports through either channel; round robin, the control, does not.
func TestSlowMemberGetsFewerMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("timing-driven integration test")
	}
	cases := []struct {
		strategy, via string
		loadAware     bool
		holdLead      time.Duration // late binding
	}{
		{"adaptive", "pingreq", true, 0},
		{"adaptive", "pingreq", true, time.Millisecond},
		{"thesis", "pingreq", true, 0},
		{"adaptive", "publish", true, 0},
		{"thesis", "publish", true, 0},
		{"round-robin", "pingreq", false, 0},
	}
	for _, tc := range cases {
		name := tc.strategy + "/" + tc.via
		if tc.holdLead > 0 {
			name += "/late-binding"
		}
		t.Run(name, func(t *testing.T) {
			b := startBroker(t, func(c *Config) { c.Strategy, c.HoldLead = tc.strategy, tc.holdLead })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			filter := "$share/g/jobs"
			fast1 := startTestWorker(t, ctx, b.MQTTAddr(), "fast1", filter, 8*time.Millisecond, tc.via)
			fast2 := startTestWorker(t, ctx, b.MQTTAddr(), "fast2", filter, 8*time.Millisecond, tc.via)
			slow := startTestWorker(t, ctx, b.MQTTAddr(), "slow", filter, 32*time.Millisecond, tc.via)

			pub := connectPaho(t, b.MQTTAddr(), "publisher", nil)
			const total = 300
			// Capacity 125 + 125 + 31 msg/s; publish 200 msg/s.
			tick := time.NewTicker(5 * time.Millisecond)
			for i := 0; i < total; i++ {
				<-tick.C
				_, err := pub.Publish(ctx, &paho.Publish{Topic: "jobs", Payload: []byte(strconv.Itoa(i))})
				require.NoError(t, err)
			}
			tick.Stop()
			eventually(t, 10*time.Second, func() bool {
				return fast1.count()+fast2.count()+slow.count() == total
			}, "every message delivered exactly once")

			f1, f2, s := fast1.count(), fast2.count(), slow.count()
			t.Logf("%s via %s: fast1=%d fast2=%d slow=%d", tc.strategy, tc.via, f1, f2, s)
			if tc.loadAware {
				require.Less(t, s*2, f1, "slow member must get under half of a fast member's share")
				require.Less(t, s*2, f2, "slow member must get under half of a fast member's share")
				require.Greater(t, s, 0, "the slow member still takes part")
			} else {
				require.InDelta(t, total/3, s, 2, "round robin ignores load")
			}
			if tc.holdLead > 0 {
				lb := &b.Selection().LateBinding
				t.Logf("late binding: held %d, released %d", lb.Held.Load(), lb.Released.Load())
				require.Greater(t, lb.Held.Load(), uint64(0), "with every member busy, messages wait at the broker")
				require.Equal(t, lb.Held.Load(), lb.Released.Load(), "and every held message was handed over")
				require.Zero(t, b.Selection().HeldMessages())
			}
			m, ok := member(getGroups(t, b), filter, "slow")
			require.True(t, ok)
			require.Greater(t, m.Reports, uint64(0), fmt.Sprintf("reports arrived via %s", tc.via))
		})
	}
}
