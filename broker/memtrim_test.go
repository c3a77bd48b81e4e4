package broker

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMemTrimmerWaitsForAStormToSettle drives memTrimmer with a clock: it
// trims once Step connections came (or the connected count moved by Step)
// and then nothing moved for the quiet time, once per storm.
func TestMemTrimmerWaitsForAStormToSettle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := memTrimmer{step: 100, quiet: time.Second}
	steps := []struct {
		ms   int
		c    counts
		want bool
		why  string
	}{
		{0, counts{}, false, "first look"},
		{2000, counts{}, false, "nothing happened"},
		{2100, counts{accepted: 150, connected: 150}, false, "a storm arrives"},
		{2600, counts{accepted: 150, connected: 150, subscriptions: 150}, false, "it subscribes: not quiet"},
		{3500, counts{accepted: 150, connected: 150, subscriptions: 150}, false, "quiet for 0.9 s only"},
		{3700, counts{accepted: 150, connected: 150, subscriptions: 150}, true, "quiet for 1.1 s after 150 connections"},
		{5000, counts{accepted: 150, connected: 150, subscriptions: 150}, false, "trimmed already"},
		{5100, counts{accepted: 200, connected: 200, subscriptions: 200}, false, "50 more arrive"},
		{7000, counts{accepted: 200, connected: 200, subscriptions: 200}, false, "50 since the trim are below the step"},
		{7100, counts{accepted: 200, connected: 40, subscriptions: 40}, false, "160 leave"},
		{9000, counts{accepted: 200, connected: 40, subscriptions: 40}, true, "the connected count moved by 160"},
		{9100, counts{accepted: 2000, connected: 40, subscriptions: 40}, false, "churn: 1800 short sessions"},
		{10200, counts{accepted: 2000, connected: 40, subscriptions: 40}, true, "churn settled"},
	}
	for _, s := range steps {
		require.Equal(t, s.want, tr.due(at(s.ms), s.c), "at %d ms: %s", s.ms, s.why)
	}
}

// TestBrokerTrimsAfterAConnectionStorm connects more clients than the
// trim step and checks that the broker returns its free memory once they
// settle, and that a negative step turns it off.
func TestBrokerTrimsAfterAConnectionStorm(t *testing.T) {
	for _, step := range []int{20, -1} {
		b := startBroker(t, func(c *Config) { c.MemoryTrimStep = step })
		for i := range 25 {
			conn, err := net.Dial("tcp", b.MQTTAddr())
			require.NoError(t, err)
			rc, _ := dialRaw(t, conn, "storm-"+strconv.Itoa(i))
			rc.subscribe("dev/"+strconv.Itoa(i)+"/cmd", 1)
		}
		if step < 0 {
			require.Nil(t, b.trim, "no trim loop with a negative step")
			continue
		}
		eventually(t, 10*time.Second, func() bool { return b.trim.Trims.Load() == 1 }, "one trim after 25 connections settle")
	}
}
