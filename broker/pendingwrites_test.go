package broker

import (
	"io"
	"testing"

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
	for _, bad := range []string{"-1", "1048577"} {
		_, err := ConfigFromArgs([]string{"--max-pending-writes", bad}, io.Discard, io.Discard)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "max-pending-writes")
		require.NotContains(t, err.Error(), "\n")
	}
}
