package broker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mpackets "github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/internal/testenv"
)

// Reason codes the topic rules answer with.
const (
	reasonNotAuthorized  = 0x87 // MQTT v5 SUBACK, PUBACK, PUBREC
	reasonV311SubFailure = 0x80 // MQTT 3.1.1 SUBACK
)

// syncTopicPrefix names the topics tests use to flush a client's deliveries.
const syncTopicPrefix = "topicrules/sync/"

// topicsOf returns the topics pc received, in order, without the sync
// topics.
func topicsOf(pc *pahoClient) []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []string
	for _, p := range pc.received {
		if !strings.HasPrefix(p.Topic, syncTopicPrefix) {
			out = append(out, p.Topic)
		}
	}
	return out
}

// flushDeliveries returns once everything the broker queued for pc before
// the call has arrived. pc subscribes to a sync topic and publishes to it
// on its own connection: Mochi handles a client's packets one after the
// other (an earlier SUBSCRIBE with all its retained messages first), and
// writes what it queued for the client in order, so the sync message
// arrives last.
func flushDeliveries(t *testing.T, pc *pahoClient, tag string) {
	t.Helper()
	topic := syncTopicPrefix + tag
	pc.subscribe(t, topic, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pc.Publish(ctx, &paho.Publish{Topic: topic, QoS: 0, Payload: []byte("sync")})
	require.NoError(t, err)
	eventually(t, 5*time.Second, func() bool {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return slices.ContainsFunc(pc.received, func(p *paho.Publish) bool { return p.Topic == topic })
	}, "sync message for %s", tag)
}

// publishV5 publishes from pc and returns the reason code of the PUBACK
// (QoS 1) or PUBREC (QoS 2).
func publishV5(t *testing.T, pc *pahoClient, p *paho.Publish) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := pc.Publish(ctx, p)
	require.NotNil(t, resp, "publish to %s: %v", p.Topic, err)
	if resp.ReasonCode < 0x80 {
		require.NoError(t, err)
	}
	return resp.ReasonCode
}

// retainDollarAndPlain publishes two retained messages as a v5 client:
// "$app/status" (payload "d") and "plain/status" (payload "p").
func retainDollarAndPlain(t *testing.T, b *Broker) {
	t.Helper()
	pub := connectPaho(t, b.MQTTAddr(), "retainer", nil)
	// Mochi acknowledges a publish before it delivers it: the retainer
	// waits for its own copies, so the delivery is over before anyone else
	// subscribes (who would otherwise get the message live and retained).
	pub.subscribe(t, "$app/status", 0)
	pub.subscribe(t, "plain/status", 0)
	for _, m := range []struct{ topic, payload string }{{"$app/status", "d"}, {"plain/status", "p"}} {
		require.Equal(t, byte(0), publishV5(t, pub, &paho.Publish{Topic: m.topic, QoS: 1, Retain: true, Payload: []byte(m.payload)}))
	}
	eventually(t, 5*time.Second, func() bool { return len(topicsOf(pub)) == 2 }, "the retainer got its own two publishes")
	_, ok := b.Server().Topics.Retained.Get("$app/status")
	require.True(t, ok, "an ordinary $ topic may be retained")
}

// TestRetainedDollarTopicsSkipLeadingWildcards (MQTT-4.7.2-1): a retained
// message on a topic starting with '$' reaches, on SUBSCRIBE, filters that
// name its first level, never a filter starting with '#' or '+'. MQTT v5.
func TestRetainedDollarTopicsSkipLeadingWildcards(t *testing.T) {
	b := startBroker(t, nil)
	retainDollarAndPlain(t, b)
	for i, c := range []struct {
		filter string
		want   []string
	}{
		{"#", []string{"plain/status"}},
		{"+/status", []string{"plain/status"}},
		{"+/#", []string{"plain/status"}},
		{"+/+", []string{"plain/status"}},
		{"$app/#", []string{"$app/status"}},
		{"$app/+", []string{"$app/status"}},
		{"$app/status", []string{"$app/status"}},
	} {
		t.Run(c.filter, func(t *testing.T) {
			id := "sub" + string(rune('a'+i))
			sub := connectPaho(t, b.MQTTAddr(), id, nil)
			sub.subscribe(t, c.filter, 0)
			flushDeliveries(t, sub, id)
			require.Equal(t, c.want, topicsOf(sub))
		})
	}
	require.Positive(t, b.TopicRules().Counters.RetainedWithheld.Load(), "withheld retained deliveries are counted")
}

// TestLiveDollarTopicsSkipSharedLeadingWildcards (MQTT-4.7.2-1): a live
// publish on a '$' topic reaches neither plain nor shared subscriptions
// whose filter starts with a wildcard; shared subscriptions that name the
// first level get it.
func TestLiveDollarTopicsSkipSharedLeadingWildcards(t *testing.T) {
	b := startBroker(t, nil)
	subs := map[string]*pahoClient{}
	for id, filter := range map[string]string{
		"shared-hash":  "$share/g/#",
		"shared-plus":  "$share/h/+/status",
		"shared-named": "$share/k/$app/#",
		"plain-hash":   "#",
		"plain-plus":   "+/status",
	} {
		subs[id] = connectPaho(t, b.MQTTAddr(), id, nil)
		subs[id].subscribe(t, filter, 0)
	}
	pub := connectPaho(t, b.MQTTAddr(), "pub", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// One publisher, in order: whoever receives the second message has
	// been sent everything of the first meant for it.
	for _, topic := range []string{"$app/status", "plain/status", "$app/done"} {
		_, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 0, Payload: []byte("x")})
		require.NoError(t, err)
	}
	eventually(t, 5*time.Second, func() bool {
		return slices.Contains(topicsOf(subs["shared-named"]), "$app/done") &&
			slices.Contains(topicsOf(subs["shared-hash"]), "plain/status") &&
			slices.Contains(topicsOf(subs["shared-plus"]), "plain/status") &&
			slices.Contains(topicsOf(subs["plain-hash"]), "plain/status") &&
			slices.Contains(topicsOf(subs["plain-plus"]), "plain/status")
	}, "every subscriber got its last message")
	require.Equal(t, []string{"$app/status", "$app/done"}, topicsOf(subs["shared-named"]))
	for _, id := range []string{"shared-hash", "shared-plus", "plain-hash", "plain-plus"} {
		require.Equal(t, []string{"plain/status"}, topicsOf(subs[id]), id)
	}
	require.Positive(t, b.TopicRules().Counters.SharedWithheld.Load())
}

// TestLuffyTopicsAreReservedV5: nobody may subscribe to a filter that can
// match a $luffy/ topic (0x87), publish to one other than the load topic
// (PUBACK or PUBREC 0x87; QoS 0 dropped and counted), and nothing on them
// is retained. A report on the load topic, even flagged retain, is
// acknowledged, applied to its publisher only, and neither stored nor
// routed.
func TestLuffyTopicsAreReservedV5(t *testing.T) {
	b := startBroker(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	spy := connectPaho(t, b.MQTTAddr(), "spy", nil)
	filters := []string{"$luffy/#", "$luffy/load", "$luffy/+", "$luffy", "$luffy/load/#", "$share/g/$luffy/#", "$SHARE/g/$luffy/load", "#", "+/load", "+/+"}
	opts := make([]paho.SubscribeOptions, len(filters))
	for i, f := range filters {
		opts[i] = paho.SubscribeOptions{Topic: f, QoS: 0}
	}
	sa, err := spy.Subscribe(ctx, &paho.Subscribe{Subscriptions: opts})
	require.Error(t, err, "paho reports the refused filters")
	require.NotNil(t, sa)
	require.Equal(t, []byte{0x87, 0x87, 0x87, 0x87, 0x87, 0x87, 0x87, 0, 0, 0}, sa.Reasons)
	require.Equal(t, uint64(7), b.TopicRules().Counters.ReadsRefused.Load())

	w1 := connectPaho(t, b.MQTTAddr(), "w1", nil)
	w1.subscribe(t, "$share/g/jobs", 1)
	w2 := connectPaho(t, b.MQTTAddr(), "w2", nil)
	w2.subscribe(t, "$share/g/jobs", 1)

	// Publishes to reserved topics other than the load topic.
	require.Equal(t, byte(reasonNotAuthorized), publishV5(t, w1, &paho.Publish{Topic: "$luffy/load/w2", QoS: 1, Retain: true, Payload: []byte(`{"msgsInQueue": 50}`)}))
	require.Equal(t, byte(reasonNotAuthorized), publishV5(t, w1, &paho.Publish{Topic: "$luffy/other", QoS: 2, Retain: true, Payload: []byte("x")}))
	_, err = w1.Publish(ctx, &paho.Publish{Topic: "$luffy/qos0", QoS: 0, Retain: true, Payload: []byte("x")})
	require.NoError(t, err)
	eventually(t, 5*time.Second, func() bool { return b.TopicRules().Counters.PublishesRefused.Load() == 3 },
		"the QoS 0 publish was dropped and counted")

	// The client's own report, flagged retain.
	require.Equal(t, byte(0), publishV5(t, w1, &paho.Publish{Topic: report.LoadTopic, QoS: 1, Retain: true,
		Payload: report.Encode(report.Report{Pending: 7, ProcessingTime: 20 * time.Millisecond})}))
	eventually(t, 5*time.Second, func() bool {
		m, ok := member(getGroups(t, b), "$share/g/jobs", "w1")
		return ok && m.Reports == 1 && m.ReportedPending == 7
	}, "the report applied to its publisher")
	m, ok := member(getGroups(t, b), "$share/g/jobs", "w2")
	require.True(t, ok)
	require.Zero(t, m.Reports, "and to nobody else")

	for topic := range b.Server().Topics.Retained.GetAll() {
		require.False(t, strings.HasPrefix(topic, "$luffy"), "retained %s", topic)
	}
	flushDeliveries(t, spy, "spy")
	require.Empty(t, topicsOf(spy), "the spy on # + /load and +/+ saw nothing")
}

// TestLuffyTopicsAreReservedV311: the same rules for an MQTT 3.1.1 client,
// whose SUBACK says 0x80 and which Mochi disconnects for a refused QoS≥1
// publish (3.1.1 has no negative PUBACK).
func TestLuffyTopicsAreReservedV311(t *testing.T) {
	b := startBroker(t, nil)
	retainDollarAndPlain(t, b)

	c := dialV311(t, b.MQTTAddr(), "v3")
	require.Equal(t, []byte{reasonV311SubFailure, reasonV311SubFailure, reasonV311SubFailure, 1, 1, 1},
		c.subscribe("$luffy/#", "$luffy/load", "$share/g/$luffy/#", "#", "+/status", "$share/g/jobs"))
	require.Equal(t, uint64(3), b.TopicRules().Counters.ReadsRefused.Load())

	c.publish("$luffy/load/x", 0, true, []byte("x")) // dropped
	c.publish(report.LoadTopic, 1, true, report.Encode(report.Report{Pending: 4}))
	require.Equal(t, mpackets.Puback, c.next().FixedHeader.Type)
	c.subscribe("topicrules/sync/v3")
	c.publish("topicrules/sync/v3", 0, false, []byte("sync"))
	c.waitFor("topicrules/sync/v3")
	var got []string
	for _, pk := range c.published {
		if pk.TopicName != "topicrules/sync/v3" {
			got = append(got, pk.TopicName)
		}
	}
	require.Equal(t, []string{"plain/status", "plain/status"}, got, "retained for # and +/status; no $ topic")
	require.Equal(t, uint64(1), b.TopicRules().Counters.PublishesRefused.Load())
	m, ok := member(getGroups(t, b), "$share/g/jobs", "v3")
	require.True(t, ok)
	require.Equal(t, 4, m.ReportedPending, "a 3.1.1 worker reports on the load topic")
	_, ok = b.Server().Topics.Retained.Get(report.LoadTopic)
	require.False(t, ok)

	// A refused QoS 1 publish ends a 3.1.1 connection.
	c.publish("$luffy/x", 1, false, []byte("x"))
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	for {
		if _, err := c.readPacket(); err != nil {
			var netErr net.Error
			require.False(t, errors.As(err, &netErr) && netErr.Timeout(), "connection closed: %v", err)
			break
		}
	}
	require.Equal(t, uint64(2), b.TopicRules().Counters.PublishesRefused.Load())
}

// TestAuthFileCanRestrictTheLoadTopic: an auth-file ACL rule that does not
// let a client write $luffy/load refuses its reports (0x87); clients the
// ACL does not restrict there still report.
func TestAuthFileCanRestrictTheLoadTopic(t *testing.T) {
	file := filepath.Join(t.TempDir(), "auth.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`auth:
  - username: worker
    password: secret
    allow: true
  - username: muted
    password: secret
    allow: true
acl:
  - username: muted
    filters:
      "$luffy/load": 1
`), 0o600))
	b := startBroker(t, func(c *Config) { c.AuthFile = file })
	for _, u := range []struct {
		user string
		want byte
	}{{"worker", 0}, {"muted", reasonNotAuthorized}} {
		pc := connectPahoAs(t, b.MQTTAddr(), u.user, u.user, "secret")
		pc.subscribe(t, "$share/g/jobs", 1)
		require.Equal(t, u.want, publishV5(t, pc, &paho.Publish{Topic: report.LoadTopic, QoS: 1,
			Payload: report.Encode(report.Report{Pending: 3})}), u.user)
	}
	eventually(t, 5*time.Second, func() bool {
		m, ok := member(getGroups(t, b), "$share/g/jobs", "worker")
		return ok && m.Reports == 1
	})
	m, ok := member(getGroups(t, b), "$share/g/jobs", "muted")
	require.True(t, ok)
	require.Zero(t, m.Reports)
	require.Zero(t, b.TopicRules().Counters.PublishesRefused.Load(), "refused by the operator's ACL, not by the topic rules")
}

// TestMosquittoSubWildcardSkipsDollarTopics: mosquitto_sub -t '#' (MQTT
// 3.1.1 and 5) gets the retained ordinary message and no '$' topic, as it
// would from Mosquitto.
func TestMosquittoSubWildcardSkipsDollarTopics(t *testing.T) {
	subBin := testenv.RequireBinary(t, "mosquitto_sub", "mosquitto-clients")
	b := startBroker(t, nil)
	retainDollarAndPlain(t, b)
	host, port, err := net.SplitHostPort(b.MQTTAddr())
	require.NoError(t, err)
	for _, version := range []string{"mqttv311", "mqttv5"} {
		t.Run(version, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// -W: disconnect after 2 s; retained messages come at once.
			cmd := exec.CommandContext(ctx, subBin, "-V", version, "-h", host, "-p", port,
				"-i", "mosq-"+version, "-t", "#", "-v", "-W", "2")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var exit *exec.ExitError
			if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 27) { // 27: -W timeout
				t.Fatalf("mosquitto_sub: %v: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			require.Equal(t, []string{"plain/status p"}, lines)
		})
	}
}

// connectPahoAs is connectPaho with a user name and password.
func connectPahoAs(t *testing.T, addr, clientID, user, password string) *pahoClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	pc := &pahoClient{conn: conn}
	pc.Client = paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pc.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: user, PasswordFlag: true, Password: []byte(password)})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = pc.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return pc
}

// v311Conn is an MQTT 3.1.1 connection driven packet by packet, encoded
// and decoded with Mochi's packet codec. It keeps the PUBLISHes it reads
// while waiting for other packets.
type v311Conn struct {
	t         *testing.T
	conn      net.Conn
	r         *bufio.Reader
	nextID    uint16
	published []mpackets.Packet
}

func dialV311(t *testing.T, addr, clientID string) *v311Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := &v311Conn{t: t, conn: conn, r: bufio.NewReader(conn)}
	pk := mpackets.Packet{FixedHeader: mpackets.FixedHeader{Type: mpackets.Connect}, ProtocolVersion: 4,
		Connect: mpackets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: clientID, Keepalive: 30, Clean: true}}
	var buf bytes.Buffer
	require.NoError(t, pk.ConnectEncode(&buf))
	c.write(buf.Bytes())
	ack := c.next()
	require.Equal(t, mpackets.Connack, ack.FixedHeader.Type)
	require.Equal(t, byte(0), ack.ReasonCode)
	return c
}

func (c *v311Conn) write(b []byte) {
	c.t.Helper()
	_, err := c.conn.Write(b)
	require.NoError(c.t, err)
}

// subscribe sends one SUBSCRIBE (QoS 1 each) and returns the SUBACK's
// return codes.
func (c *v311Conn) subscribe(filters ...string) []byte {
	c.t.Helper()
	c.nextID++
	pk := mpackets.Packet{FixedHeader: mpackets.FixedHeader{Type: mpackets.Subscribe, Qos: 1}, ProtocolVersion: 4, PacketID: c.nextID}
	for _, f := range filters {
		pk.Filters = append(pk.Filters, mpackets.Subscription{Filter: f, Qos: 1})
	}
	var buf bytes.Buffer
	require.NoError(c.t, pk.SubscribeEncode(&buf))
	c.write(buf.Bytes())
	ack := c.next()
	require.Equal(c.t, mpackets.Suback, ack.FixedHeader.Type)
	require.Equal(c.t, pk.PacketID, ack.PacketID)
	return ack.ReasonCodes
}

func (c *v311Conn) publish(topic string, qos byte, retain bool, payload []byte) {
	c.t.Helper()
	pk := mpackets.Packet{FixedHeader: mpackets.FixedHeader{Type: mpackets.Publish, Qos: qos, Retain: retain},
		ProtocolVersion: 4, TopicName: topic, Payload: payload}
	if qos > 0 {
		c.nextID++
		pk.PacketID = c.nextID
	}
	var buf bytes.Buffer
	require.NoError(c.t, pk.PublishEncode(&buf))
	c.write(buf.Bytes())
}

// next returns the next packet other than a PUBLISH, keeping the
// PUBLISHes read on the way.
func (c *v311Conn) next() mpackets.Packet {
	c.t.Helper()
	for {
		pk := c.read()
		if pk.FixedHeader.Type != mpackets.Publish {
			return pk
		}
		c.published = append(c.published, pk)
	}
}

// waitFor reads until a PUBLISH to topic has arrived.
func (c *v311Conn) waitFor(topic string) {
	c.t.Helper()
	for !slices.ContainsFunc(c.published, func(pk mpackets.Packet) bool { return pk.TopicName == topic }) {
		pk := c.read()
		require.Equal(c.t, mpackets.Publish, pk.FixedHeader.Type)
		c.published = append(c.published, pk)
	}
}

// read reads the next packet, failing the test on error or after 5 s.
func (c *v311Conn) read() mpackets.Packet {
	c.t.Helper()
	require.NoError(c.t, c.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	pk, err := c.readPacket()
	require.NoError(c.t, err)
	return pk
}

// readPacket reads and decodes the next packet.
func (c *v311Conn) readPacket() (mpackets.Packet, error) {
	pk := mpackets.Packet{ProtocolVersion: 4}
	hb, err := c.r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, _, err := mpackets.DecodeLength(c.r)
	if err != nil {
		return pk, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	switch pk.FixedHeader.Type {
	case mpackets.Connack:
		err = pk.ConnackDecode(body)
	case mpackets.Suback:
		err = pk.SubackDecode(body)
	case mpackets.Publish:
		err = pk.PublishDecode(body)
	case mpackets.Puback:
		err = pk.PubackDecode(body)
	}
	return pk, err
}
