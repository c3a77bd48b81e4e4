package broker

import (
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"
)

// TestMaxPendingWritesReachesMochi checks that --max-pending-writes sizes
// Mochi's per-client outbound packet queue, that 0 sizes it from
// --max-queued-bytes (within 64 and Mochi's default) and that values out of
// range are refused in one line.
func TestMaxPendingWritesReachesMochi(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int32
	}{
		{nil, 512},
		{[]string{"--max-pending-writes", "0"}, 512},
		{[]string{"--max-queued-bytes", "1048576"}, 64},
		{[]string{"--max-queued-bytes", "1073741824"}, mqtt.NewDefaultServerCapabilities().MaximumClientWritesPending},
		{[]string{"--max-pending-writes", "65536"}, 65536},
		{[]string{"--max-pending-writes", "100", "--max-queued-bytes", "1073741824"}, 100},
	} {
		cfg, err := ConfigFromArgs(append([]string{"--listen", "127.0.0.1:0", "--http", ""}, tt.args...), io.Discard, io.Discard)
		require.NoError(t, err, tt.args)
		b, err := New(cfg)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.want, b.server.Options.Capabilities.MaximumClientWritesPending, tt.args)
		require.NoError(t, b.Close())
	}
	requireFlagRefused(t, "max-pending-writes", "-1", "1048577")
}

// TestReadBufferBytesReachesMochi checks that --read-buffer-bytes sizes
// the buffer Mochi reads each client through, that the default is
// DefaultReadBufferBytes, that values out of range are refused in one line,
// and that a publish larger than a small buffer still arrives whole.
func TestReadBufferBytesReachesMochi(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, DefaultReadBufferBytes},
		{[]string{"--read-buffer-bytes", "0"}, DefaultReadBufferBytes},
		{[]string{"--read-buffer-bytes", "64"}, 64},
		{[]string{"--read-buffer-bytes", "1048576"}, 1 << 20},
	} {
		cfg, err := ConfigFromArgs(append([]string{"--listen", "127.0.0.1:0", "--http", ""}, tt.args...), io.Discard, io.Discard)
		require.NoError(t, err, tt.args)
		b, err := New(cfg)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.want, b.server.Options.ClientNetReadBufferSize, tt.args)
		require.NoError(t, b.Close())
	}
	requireFlagRefused(t, "read-buffer-bytes", "-1", "63", "1048577")

	b := startBroker(t, func(c *Config) { c.ReadBufferBytes = MinReadBufferBytes })
	sub, _ := connectSession(t, b.MQTTAddr(), "small-buffer-sub")
	sub.subscribe(t, "small-buffer/jobs")
	pub := connectPaho(t, b.MQTTAddr(), "small-buffer-pub", nil)
	large := strings.Repeat("x", 64*1024)
	payloads := append(numberedPayloads("small-buffer", 20), large)
	publishAcked(t, pub.Client, "small-buffer/jobs", payloads, 1)
	eventually(t, 5*time.Second, func() bool { distinct, _ := sub.counts(); return distinct == len(payloads) }, "every publish through a 64-byte read buffer")
	for _, p := range payloads {
		require.True(t, sub.got(p), p[:min(len(p), 20)])
	}
}

// TestMaxSessionMessagesBoundsASession: --max-session-messages sizes
// Mochi's bound on a session's QoS≥1 messages; an offline session given
// more keeps the first ones, the rest are counted as dropped, and values
// out of range are refused in one line.
func TestMaxSessionMessagesBoundsASession(t *testing.T) {
	cfg, err := ConfigFromArgs([]string{"--listen", "127.0.0.1:0", "--http", ""}, io.Discard, io.Discard)
	require.NoError(t, err)
	b, err := New(cfg)
	require.NoError(t, err)
	require.Equal(t, uint16(DefaultMaxSessionMessages), b.server.Options.Capabilities.MaximumInflight, "Mochi's own default")
	require.NoError(t, b.Close())

	b = startBroker(t, func(c *Config) { c.MaxSessionMessages = 10 })
	sub, _ := connectSession(t, b.MQTTAddr(), "bounded-sub")
	sub.subscribe(t, "bounded/jobs")
	sub.leave()
	// Offline first: a publish that races the disconnect is written to
	// the closing connection, and the session can then end up with one
	// more than its bound (seen under load: the last message kept, four
	// dropped).
	eventually(t, 5*time.Second, func() bool {
		cl, ok := b.Server().Clients.Get("bounded-sub")
		return ok && cl.Closed()
	}, "the broker sees bounded-sub gone")
	pub := connectPaho(t, b.MQTTAddr(), "bounded-pub", nil)
	payloads := numberedPayloads("bounded", 15)
	publishAcked(t, pub.Client, "bounded/jobs", payloads, 1)
	sub2, present := connectSession(t, b.MQTTAddr(), "bounded-sub")
	require.True(t, present)
	eventually(t, 5*time.Second, func() bool { distinct, _ := sub2.counts(); return distinct == 10 }, "the first 10 messages")
	time.Sleep(100 * time.Millisecond)
	distinct, _ := sub2.counts()
	require.Equal(t, 10, distinct, "no more than the session holds")
	for _, p := range payloads[:10] {
		require.True(t, sub2.got(p), p)
	}
	require.Equal(t, int64(5), atomic.LoadInt64(&b.server.Info.InflightDropped))

	requireFlagRefused(t, "max-session-messages", "-1", "65536")
}

// requireFlagRefused checks that each value of --flag is refused with an
// error that names the flag, in one line.
func requireFlagRefused(t *testing.T, flag string, values ...string) {
	t.Helper()
	for _, bad := range values {
		_, err := ConfigFromArgs([]string{"--" + flag, bad}, io.Discard, io.Discard)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), flag, bad)
		require.NotContains(t, err.Error(), "\n", bad)
	}
}
