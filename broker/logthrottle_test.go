package broker

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// TestMochiLogDoesNotRepeatALinePerConnection: Mochi logs a WARN line for
// every connection that ends without DISCONNECT; 30 devices dropping their
// connections give one line (the broker passes each kind of Mochi line at
// most every mochiLogEvery, with the count held back).
func TestMochiLogDoesNotRepeatALinePerConnection(t *testing.T) {
	var logs testenv.LockedBuffer
	b := startBroker(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	for i := range 30 {
		conn, err := net.Dial("tcp", b.MQTTAddr())
		require.NoError(t, err)
		connect := packets.NewControlPacket(packets.CONNECT)
		cp := connect.Content.(*packets.Connect)
		cp.ProtocolName, cp.ProtocolVersion, cp.ClientID, cp.CleanStart = "MQTT", 5, "dropper-"+string(rune('a'+i)), true
		_, err = connect.WriteTo(conn)
		require.NoError(t, err)
		ack, err := packets.ReadPacket(conn)
		require.NoError(t, err)
		require.Equal(t, byte(packets.CONNACK), ack.Type)
		require.NoError(t, conn.Close()) // no DISCONNECT
	}
	eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "error=EOF") },
		"Mochi logged no dropped connection: %s", logs.String())
	time.Sleep(200 * time.Millisecond) // the other 29 teardowns
	require.Equal(t, 1, strings.Count(logs.String(), "error=EOF"), "logs:\n%s", logs.String())
}
