package hooks_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkBroker compares vanilla Mochi MQTT with Mochi plus LuffyMQ's
// selection hook and PINGREQ-reading listener, in process over loopback
// TCP: 3 subscribers on one topic (fanout) or in one shared group
// (shared), b.N messages of 100 bytes at QoS 0 or 1. At QoS 0 one
// publisher sends from one goroutine; at QoS 1 4 publishers with 8
// goroutines each keep 32 publishes outstanding. The time is from the
// first publish until every delivery arrived (or was counted as dropped
// by Mochi); allocations are the whole process's (broker and clients).
// Set-up and tear-down are outside the timed part.
//
// Custom metrics: msgs/s is published messages per second; deliveries/s
// counts each fan-out copy; drops/op is the deliveries Mochi dropped
// (full outbound queue or in-flight store) per published message;
// cpu-ns/op is the process's CPU time (broker and clients) per published
// message, which compares the two systems more steadily than ns/op on a
// busy machine.
//
// Run briefly, e.g.:
//
//	go test -run '^$' -bench BenchmarkBroker -benchtime 2000x -benchmem -count 1 ./hooks/
func BenchmarkBroker(b *testing.B) {
	for _, system := range abSystems {
		b.Run(system, func(b *testing.B) {
			for _, pattern := range abPatterns {
				b.Run(pattern, func(b *testing.B) {
					for _, qos := range abQoS {
						b.Run(fmt.Sprintf("qos%d", qos), func(b *testing.B) {
							benchmarkAB(b, abConfig{System: system, Pattern: pattern, QoS: qos, Messages: b.N})
						})
					}
				})
			}
		})
	}
}

func benchmarkAB(b *testing.B, cfg abConfig) {
	b.ReportAllocs()
	r := newABRun(b, cfg)
	b.ResetTimer()
	cpuFrom := processCPU(b)
	r.publish()
	res, err := r.wait()
	cpu := processCPU(b) - cpuFrom
	b.StopTimer()
	if err != nil {
		hint := ""
		if cfg.QoS > 0 {
			hint = "; a QoS 1 run that stops like this is what Mochi 2.7.9's in-flight deadlock " +
				"(recursive RLock in Inflight.NextImmediate, reached through a client's send quota) looks like"
		}
		b.Fatalf("%v (delivered %d of %d, dropped %d, per subscriber %v)%s",
			err, res.Delivered, cfg.expected(), res.Drops, r.perSubscriber(), hint)
	}
	secs := res.Elapsed.Seconds()
	b.ReportMetric(float64(cfg.Messages)/secs, "msgs/s")
	b.ReportMetric(float64(res.Delivered)/secs, "deliveries/s")
	b.ReportMetric(float64(res.Drops)/float64(cfg.Messages), "drops/op")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(cfg.Messages), "cpu-ns/op")
}

// processCPU returns the CPU time (user and system) the test process used
// so far. Per message it is a steadier measure than elapsed time on a
// machine whose other cores are busy: it counts the work, not the waits.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
