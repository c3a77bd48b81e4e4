package broker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

func TestConnackAnnouncesReportInterval(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.ReportInterval = 250 * time.Millisecond })
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	_, connack := dialRaw(t, conn, "c1")
	var announced []string
	for _, u := range connack.Properties.User {
		if u.Key == report.ReportIntervalProperty {
			announced = append(announced, u.Value)
		}
	}
	require.Equal(t, []string{"250"}, announced)
}

// TestUserPropertiesSurviveRequestProblemInfoZero: MQTT-3.1.2-29 lets
// PUBLISH and CONNACK carry User Properties even when the client asked for
// no problem information (paho asks so whenever CONNECT has properties).
func TestUserPropertiesSurviveRequestProblemInfoZero(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.ReportInterval = 250 * time.Millisecond })
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc := &rawConn{t: t, conn: conn}
	cp := connectPacket("c1", "", "")
	zero := byte(0)
	cp.Content.(*packets.Connect).Properties = &packets.Properties{RequestProblemInfo: &zero}
	rc.write(cp)
	ack := rc.read()
	require.Equal(t, packets.CONNACK, ack.Type)
	var announced string
	for _, u := range ack.Content.(*packets.Connack).Properties.User {
		if u.Key == report.ReportIntervalProperty {
			announced = u.Value
		}
	}
	require.Equal(t, "250", announced)

	rc.subscribe("stamped", 0)
	pub := packets.NewControlPacket(packets.PUBLISH)
	p := pub.Content.(*packets.Publish)
	p.Topic, p.Payload = "stamped", []byte("x")
	p.Properties = &packets.Properties{User: []packets.User{{Key: "luffy-sent-at", Value: "123"}}}
	rc.write(pub)
	got := rc.read()
	require.Equal(t, packets.PUBLISH, got.Type)
	require.Equal(t, []packets.User{{Key: "luffy-sent-at", Value: "123"}}, got.Content.(*packets.Publish).Properties.User)
}

func TestExtendedPingreqReportIsApplied(t *testing.T) {
	b := startBroker(t, nil)
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "w1")
	rc.subscribe("$share/g/jobs", 0)

	rc.writeBytes(report.EncodePingreq(report.Report{Pending: 7, ProcessingTime: 25 * time.Millisecond}))
	require.Equal(t, packets.PINGRESP, rc.read().Type, "an extended PINGREQ is still answered")

	m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
	require.True(t, ok)
	require.Equal(t, 7, m.ReportedPending)
	require.InDelta(t, 25.0, m.ProcessingTimeMs, 0.001)
	require.Equal(t, uint64(1), m.Reports)
	require.NotNil(t, m.LastReportAgeMs)
	require.Equal(t, uint64(1), b.Selection().Reports.Accepted[0].Load())
}

func TestThesisKeySpellingAndPropertiesAreaAccepted(t *testing.T) {
	b := startBroker(t, nil)
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "w1")
	rc.subscribe("$share/g/jobs", 0)

	// Properties area (one User Property "k"="v") then the thesis's JSON.
	payload := append([]byte{0x07, 0x26, 0x00, 0x01, 'k', 0x00, 0x01, 'v'},
		[]byte(`{"numberOfMsgsInQueue": 4, "processingTimerPerMsg": 12.5}`)...)
	rc.writeBytes(append([]byte{0xC0, byte(len(payload))}, payload...))
	require.Equal(t, packets.PINGRESP, rc.read().Type)

	m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
	require.True(t, ok)
	require.Equal(t, 4, m.ReportedPending)
	require.InDelta(t, 12.5, m.ProcessingTimeMs, 0.001)
}

func TestMalformedReportIsCountedAndPingStillAnswered(t *testing.T) {
	b := startBroker(t, nil)
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "w1")
	rc.subscribe("$share/g/jobs", 0)

	for _, bad := range []string{"abc", `{"msgsInQueue": -4}`, `{"processingTimePerMsg": 3}`, "{"} {
		rc.writeBytes(append([]byte{0xC0, byte(len(bad))}, bad...))
		require.Equal(t, packets.PINGRESP, rc.read().Type, "payload %q", bad)
	}
	require.Equal(t, uint64(4), b.Selection().Reports.Malformed[0].Load())
	m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
	require.True(t, ok)
	require.Equal(t, uint64(0), m.Reports, "malformed reports change no state")

	// The connection is intact: a good report still works.
	rc.writeBytes(report.EncodePingreq(report.Report{Pending: 2}))
	require.Equal(t, packets.PINGRESP, rc.read().Type)

	metrics := httpGet(t, "http://"+b.HTTPAddr()+"/metrics")
	require.Contains(t, metrics, `luffymq_load_reports_total{channel="pingreq",outcome="malformed"} 4`)
	require.Contains(t, metrics, `luffymq_load_reports_total{channel="pingreq",outcome="accepted"} 1`)
}

func TestOversizedReportEndsConnectionWithPacketTooLarge(t *testing.T) {
	b := startBroker(t, nil)
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "w1")

	payload := bytes.Repeat([]byte("x"), report.MaxPayload+1)
	pk := append([]byte{0xC0}, varint(len(payload))...)
	rc.writeBytes(append(pk, payload...))

	cp := rc.read()
	require.Equal(t, packets.DISCONNECT, cp.Type)
	require.Equal(t, byte(0x95), cp.Content.(*packets.Disconnect).ReasonCode, "reason: packet too large")
	_, err = packets.ReadPacket(conn)
	require.Error(t, err, "the broker closes the connection")
	require.Equal(t, uint64(1), b.Selection().Reports.Oversized.Load())

	// A payload of exactly the limit is accepted (and, not being JSON,
	// counted as malformed).
	conn2, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc2, _ := dialRaw(t, conn2, "w2")
	payload = bytes.Repeat([]byte("x"), report.MaxPayload)
	pk = append([]byte{0xC0}, varint(len(payload))...)
	rc2.writeBytes(append(pk, payload...))
	require.Equal(t, packets.PINGRESP, rc2.read().Type)
}

func TestOversizedPacketEndsConnectionBeforeItIsRead(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.MaxPacketSize = 1024 })
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "big")
	// A PUBLISH header announcing 100 MiB: the broker must not wait for
	// (or allocate) the body.
	rc.writeBytes(append([]byte{0x30}, varint(100<<20)...))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	for {
		if _, err := packets.ReadPacket(conn); err != nil {
			var netErr net.Error
			require.False(t, errors.As(err, &netErr) && netErr.Timeout(), "connection closed, not left waiting: %v", err)
			break
		}
	}
}

func TestLoadTopicPublishIsConsumedNotRouted(t *testing.T) {
	b := startBroker(t, nil)
	// A subscriber to everything must never see reports, and nobody may
	// subscribe to the load topic itself.
	spy := connectPaho(t, b.MQTTAddr(), "spy", nil)
	spy.subscribe(t, "#", 1)
	subCtx, subCancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, subErr := spy.Subscribe(subCtx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: report.LoadTopic, QoS: 1}}})
	subCancel()
	require.ErrorContains(t, subErr, "failed to subscribe", "SUBACK 0x87 for the load topic")

	w := connectPaho(t, b.MQTTAddr(), "w1", nil)
	w.subscribe(t, "$share/g/jobs", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := w.Publish(ctx, &paho.Publish{Topic: report.LoadTopic, QoS: 1,
		Payload: report.Encode(report.Report{Pending: 9, ProcessingTime: 40 * time.Millisecond})})
	require.NoError(t, err, "QoS 1 report acknowledged")
	_, err = w.Publish(ctx, &paho.Publish{Topic: report.LoadTopic, QoS: 0, Payload: []byte(`{"msgsInQueue": 3}`)})
	require.NoError(t, err)

	eventually(t, 5*time.Second, func() bool {
		m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
		return ok && m.Reports == 2 && m.ReportedPending == 3
	}, "both reports applied to the publisher's own state")

	// A malformed QoS 1 report is refused with "payload format invalid".
	resp, err := w.Publish(ctx, &paho.Publish{Topic: report.LoadTopic, QoS: 1, Payload: []byte("not json")})
	if err == nil {
		require.Equal(t, byte(0x99), resp.ReasonCode)
	} else {
		require.Contains(t, strings.ToLower(err.Error()), "payload format", "reason 0x99")
	}
	require.Equal(t, uint64(1), b.Selection().Reports.Malformed[1].Load())

	// A marker published after the reports reaches the spy; the reports
	// never did.
	_, err = w.Publish(ctx, &paho.Publish{Topic: "marker", QoS: 1, Payload: []byte("m")})
	require.NoError(t, err)
	eventually(t, 5*time.Second, func() bool { return spy.count() >= 1 })
	spy.mu.Lock()
	defer spy.mu.Unlock()
	for _, p := range spy.received {
		require.NotEqual(t, report.LoadTopic, p.Topic)
	}
}

func TestHTTPEndpoints(t *testing.T) {
	b := startBroker(t, nil)
	require.Equal(t, "ok\n", httpGet(t, "http://"+b.HTTPAddr()+"/healthz"))
	w := connectPaho(t, b.MQTTAddr(), "w1", nil)
	w.subscribe(t, "$share/g/t/#", 0)
	groups := getGroups(t, b)
	require.Len(t, groups.Groups, 1)
	require.Equal(t, "$share/g/t/#", groups.Groups[0].Filter)
	require.Equal(t, "adaptive", groups.Groups[0].Strategy)
	require.Len(t, groups.Groups[0].Members, 1)
	require.Nil(t, groups.Groups[0].Members[0].LastReportAgeMs, "no report yet")

	metrics := httpGet(t, "http://"+b.HTTPAddr()+"/metrics")
	for _, name := range []string{"luffymq_shared_selections_total", "luffymq_member_reported_pending",
		"luffymq_member_service_time_seconds", "luffymq_load_reports_total", "luffymq_clients_connected"} {
		require.Contains(t, metrics, name)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func varint(n int) []byte {
	var out []byte
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		out = append(out, b)
		if n == 0 {
			return out
		}
	}
}
