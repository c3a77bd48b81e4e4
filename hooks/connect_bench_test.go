package hooks_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/connections"
)

// connectHeapProfile is where BenchmarkConnect writes, once every device
// is connected and after a garbage collection, a heap profile of what the
// process holds (scripts/own-share.py runs it with -test.memprofilerate=1,
// so that every allocation is in it).
var connectHeapProfile = flag.String("connect-heap-profile", "", "BenchmarkConnect: write the heap in use, once every device is connected, to this file")

// connectDialers is how many devices connect at once, as in
// `luffy-bench connections` (its --dialers default).
const connectDialers = 32

// BenchmarkConnect compares the connect path of vanilla Mochi MQTT with
// Mochi plus LuffyMQ's hooks and PINGREQ-reading listener (luffymq) and
// with the broker itself (luffymq-broker), in process over loopback TCP:
// b.N devices, connectDialers at a time, each connects (MQTT v5, clean
// start), subscribes at QoS 1 to its own dev/<id>/cmd and stays connected
// until the end, as `luffy-bench connections` does with the brokers as
// processes of their own. Set-up and tear-down are outside the timed part.
//
// Custom metrics: connects/s is devices subscribed per second; cpu-ns/op
// is the process's CPU time (broker and devices) per device. Both ends of
// every connection are in this process: run it with at most half the
// open-file limit, e.g.
//
//	go test -run '^$' -bench BenchmarkConnect -benchtime 5000x -benchmem -count 1 ./hooks/
func BenchmarkConnect(b *testing.B) {
	for _, system := range abSystems {
		b.Run(system, func(b *testing.B) {
			benchmarkConnect(b, system)
		})
	}
}

func benchmarkConnect(b *testing.B, system string) {
	b.ReportAllocs()
	r := newConnectRun(b, system)
	b.ResetTimer()
	cpuFrom := processCPU(b)
	err := r.connectDevices(b.N)
	cpu := processCPU(b) - cpuFrom
	elapsed := b.Elapsed()
	b.StopTimer()
	require.NoError(b, err)
	if *connectHeapProfile != "" {
		writeHeapProfile(b, *connectHeapProfile)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "connects/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// connectRun is a broker of one A/B system with devices connected to it.
type connectRun struct {
	*abRun
	devices []net.Conn
}

// newConnectRun starts the broker for system, with no clients. It and the
// devices are stopped by a cleanup registered on tb.
func newConnectRun(tb testing.TB, system string) *connectRun {
	tb.Helper()
	r := &connectRun{abRun: &abRun{tb: tb, cfg: abConfig{System: system, Pattern: "connect"},
		progress: make(chan struct{}, 1), pubDone: make(chan struct{})}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	tb.Cleanup(r.close)
	tb.Cleanup(func() {
		for _, c := range r.devices {
			if c != nil {
				connections.CloseNow(c)
			}
		}
	})
	r.startServer()
	return r
}

// connectDevices connects and subscribes devices 0 to n-1, connectDialers
// at a time, and keeps their connections; it returns the first error.
func (r *connectRun) connectDevices(n int) error {
	r.devices = make([]net.Conn, n)
	_, err := connections.ForEach(n, connectDialers, func(i int) error {
		conn, err := connections.DialDevice(r.addr, i)
		if err == nil {
			r.devices[i] = conn
			err = connections.SubscribeDevice(conn, i)
		}
		if err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		return nil
	})
	return err
}

// TestConnectRunSetsUpEveryDevice: what BenchmarkConnect times leaves, on
// every system, each device connected under its own client ID with its
// own subscription.
func TestConnectRunSetsUpEveryDevice(t *testing.T) {
	const n = 50
	for _, system := range abSystems {
		t.Run(system, func(t *testing.T) {
			r := newConnectRun(t, system)
			require.NoError(t, r.connectDevices(n))
			for i := range n {
				cl, ok := r.server.Clients.Get(fmt.Sprintf("d%d", i))
				require.True(t, ok, "device %d is not connected", i)
				require.Contains(t, cl.State.Subscriptions.GetAll(), fmt.Sprintf("dev/%d/cmd", i))
			}
		})
	}
}

// writeHeapProfile collects garbage and writes the heap in use to path.
func writeHeapProfile(tb testing.TB, path string) {
	tb.Helper()
	runtime.GC()
	f, err := os.Create(path)
	require.NoError(tb, err)
	defer f.Close()
	require.NoError(tb, pprof.WriteHeapProfile(f))
}
