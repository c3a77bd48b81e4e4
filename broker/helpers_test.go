package broker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// startBroker starts a broker on free loopback ports and stops it when the
// test ends.
func startBroker(t *testing.T, mutate func(*Config)) *Broker {
	t.Helper()
	cfg := Config{
		MQTTListen:     "127.0.0.1:0",
		HTTPListen:     "127.0.0.1:0",
		ReportInterval: 100 * time.Millisecond,
		Logger:         discardLogger(),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// eventually polls cond every 10 ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, within, 10*time.Millisecond, msgAndArgs...)
}

// getGroups fetches and decodes GET /api/v1/groups.
func getGroups(t *testing.T, b *Broker) GroupsResponse {
	t.Helper()
	resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/groups")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var groups GroupsResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&groups))
	return groups
}

// member returns the status of clientID in the group with filter, if any.
func member(groups GroupsResponse, filter, clientID string) (MemberStatus, bool) {
	for _, g := range groups.Groups {
		if g.Filter != filter {
			continue
		}
		for _, m := range g.Members {
			if m.ClientID == clientID {
				return m, true
			}
		}
	}
	return MemberStatus{}, false
}

// rawConn is an MQTT v5 connection driven packet by packet, for checking
// exactly what the broker sends back.
type rawConn struct {
	t    *testing.T
	conn net.Conn
}

func dialRaw(t *testing.T, conn net.Conn, clientID string) (*rawConn, *packets.Connack) {
	t.Helper()
	rc := &rawConn{t: t, conn: conn}
	t.Cleanup(func() { _ = conn.Close() })
	rc.write(connectPacket(clientID, "", ""))
	ack := rc.read()
	require.Equal(t, packets.CONNACK, ack.Type)
	connack := ack.Content.(*packets.Connack)
	require.Equal(t, byte(0), connack.ReasonCode)
	return rc, connack
}

// connectPacket builds an MQTT v5 CONNECT, with credentials if user is
// not empty.
func connectPacket(clientID, user, password string) *packets.ControlPacket {
	cp := packets.NewControlPacket(packets.CONNECT)
	connect := cp.Content.(*packets.Connect)
	connect.ProtocolName = "MQTT"
	connect.ProtocolVersion = 5
	connect.ClientID = clientID
	connect.KeepAlive = 30
	connect.CleanStart = true
	if user != "" {
		connect.UsernameFlag, connect.Username = true, user
		connect.PasswordFlag, connect.Password = true, []byte(password)
	}
	return cp
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (rc *rawConn) write(cp *packets.ControlPacket) {
	rc.t.Helper()
	_, err := cp.WriteTo(rc.conn)
	require.NoError(rc.t, err)
}

func (rc *rawConn) writeBytes(b []byte) {
	rc.t.Helper()
	_, err := rc.conn.Write(b)
	require.NoError(rc.t, err)
}

func (rc *rawConn) read() *packets.ControlPacket {
	rc.t.Helper()
	require.NoError(rc.t, rc.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	cp, err := packets.ReadPacket(rc.conn)
	require.NoError(rc.t, err)
	return cp
}

func (rc *rawConn) subscribe(filter string, qos byte) {
	rc.t.Helper()
	cp := packets.NewControlPacket(packets.SUBSCRIBE)
	sub := cp.Content.(*packets.Subscribe)
	sub.PacketID = 1
	sub.Subscriptions = []packets.SubOptions{{Topic: filter, QoS: qos}}
	rc.write(cp)
	ack := rc.read()
	require.Equal(rc.t, packets.SUBACK, ack.Type)
	require.Less(rc.t, ack.Content.(*packets.Suback).Reasons[0], byte(0x80))
}

// pahoClient connects a paho.golang client over conn and records what it
// receives.
type pahoClient struct {
	*paho.Client
	conn net.Conn

	mu       sync.Mutex
	received []*paho.Publish
}

func connectPaho(t *testing.T, addr, clientID string, onMessage func(*paho.Publish)) *pahoClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	pc := &pahoClient{conn: conn}
	pc.Client = paho.NewClient(paho.ClientConfig{
		ClientID: clientID,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				pc.mu.Lock()
				pc.received = append(pc.received, pr.Packet)
				pc.mu.Unlock()
				if onMessage != nil {
					onMessage(pr.Packet)
				}
				return true, nil
			},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pc.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = pc.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return pc
}

func (pc *pahoClient) count() int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return len(pc.received)
}

func (pc *pahoClient) subscribe(t *testing.T, filter string, qos byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pc.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	require.NoError(t, err)
}
