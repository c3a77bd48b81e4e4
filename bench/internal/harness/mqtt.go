package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// PayloadSize is the size of every benchmark message.
const PayloadSize = 100

// EncodePayload writes the sequence number and send time into a 100 B
// payload.
func EncodePayload(seq int, sent time.Time) []byte {
	b := make([]byte, PayloadSize)
	binary.BigEndian.PutUint64(b[0:8], uint64(seq))
	binary.BigEndian.PutUint64(b[8:16], uint64(sent.UnixNano()))
	for i := 16; i < len(b); i++ {
		b[i] = 'x'
	}
	return b
}

// DecodePayload reads what EncodePayload wrote.
func DecodePayload(b []byte) (seq int, sent time.Time, ok bool) {
	if len(b) < 16 {
		return 0, time.Time{}, false
	}
	return int(binary.BigEndian.Uint64(b[0:8])), time.Unix(0, int64(binary.BigEndian.Uint64(b[8:16]))), true
}

// PahoQueueCapacity bounds a paho member's FIFO; a full FIFO blocks paho's
// reader (back-pressure), as the SDK's full queue does.
const PahoQueueCapacity = 10000

// DialPaho connects a plain paho.golang MQTT v5 client with cc (ClientID
// and Conn are set here): clean start, session expiry 0, Receive Maximum
// 65535 (no limit in practice, as MQTT's default). It returns the client,
// its TCP connection, which the caller may close to cut the client off
// without a DISCONNECT, and the CONNACK.
func DialPaho(ctx context.Context, addr, id string, keepAlive uint16, cc paho.ClientConfig) (*paho.Client, net.Conn, *paho.Connack, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	cc.ClientID, cc.Conn = id, conn
	c := paho.NewClient(cc)
	rm := uint16(65535)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ca, err := c.Connect(cctx, &paho.Connect{ClientID: id, KeepAlive: keepAlive, CleanStart: true,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm, RequestProblemInfo: true}})
	if err != nil {
		_ = conn.Close()
		return nil, nil, nil, fmt.Errorf("connect %s to %s: %w", id, addr, err)
	}
	if ca.ReasonCode != 0 {
		_ = conn.Close()
		return nil, nil, nil, fmt.Errorf("connect %s to %s: reason code 0x%02x", id, addr, ca.ReasonCode)
	}
	return c, conn, ca, nil
}

// Subscribe subscribes c to filter at qos and checks the SUBACK.
func Subscribe(ctx context.Context, c *paho.Client, filter string, qos byte) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sa, err := c.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", filter, err)
	}
	if len(sa.Reasons) > 0 && sa.Reasons[0] >= 0x80 {
		return fmt.Errorf("subscribe %s: reason code 0x%02x", filter, sa.Reasons[0])
	}
	return nil
}
