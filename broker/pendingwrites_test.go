package broker

import (
	"io"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"
)

// TestMaxPendingWritesReachesMochi checks that --max-pending-writes sizes
// Mochi's per-client outbound packet queue, that 0 keeps Mochi's default
// and that values out of range are refused in one line.
func TestMaxPendingWritesReachesMochi(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int32
	}{
		{nil, mqtt.NewDefaultServerCapabilities().MaximumClientWritesPending},
		{[]string{"--max-pending-writes", "0"}, mqtt.NewDefaultServerCapabilities().MaximumClientWritesPending},
		{[]string{"--max-pending-writes", "65536"}, 65536},
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
