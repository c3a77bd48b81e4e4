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

// TestMochiLogDoesNotRepeatALinePerConnection: a connection that ends
// without DISCONNECT is logged by LuffyMQ's listener at DEBUG, with the
// client's address (Mochi's own line for it is an empty message at WARN);
// 30 devices dropping their connections give one such line (the broker
// passes each kind of line on Mochi's logger at most every mochiLogEvery,
// with the count held back), and nothing at WARN.
func TestMochiLogDoesNotRepeatALinePerConnection(t *testing.T) {
	var logs testenv.LockedBuffer
	b := startBroker(t, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
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
	const dropped = `level=DEBUG msg="client connection lost without DISCONNECT" listener=tcp remote=127.0.0.1:`
	eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), dropped) },
		"no dropped connection logged: %s", logs.String())
	time.Sleep(200 * time.Millisecond) // the other 29 teardowns
	require.Equal(t, 1, strings.Count(logs.String(), "client connection lost without DISCONNECT"), "logs:\n%s", logs.String())
	require.NotContains(t, logs.String(), `msg=""`)
	require.NotContains(t, logs.String(), `level=WARN msg="client connection`)
}
