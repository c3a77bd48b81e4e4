package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/scoring"
)

// maxAMQPName is the longest exchange, queue or policy name RabbitMQ
// accepts (an AMQP short string).
const maxAMQPName = 255

// FuzzConfigMessage decodes an arbitrary configuration-queue message as
// configLoop does and checks what federationFor makes of it: an error
// wrapping ErrInvalidConfig (or the JSON decoder's) that never shows an
// upstream URI's password, or one federation per entry whose names
// RabbitMQ can take: a pubsub* exchange federated as itself, or wq.<g>'s
// intake exchange fed from the upstreams' dead-letter exchange, every
// upstream amqp:// or amqps://.
func FuzzConfigMessage(f *testing.F) {
	f.Add([]byte(`{"pubsub.weather":[{"uri":"amqp://b:5672"}],"wq.jobs":[{"uri":"amqp://b:5672"},{"uri":"amqps://c:5671"}]}`))
	f.Add([]byte(`{"pubsub.x":[]}`))
	f.Add([]byte(`{"wq.bad name":[{"uri":"amqp://b"}]}`))
	f.Add([]byte(`{"amq.topic":[{"uri":"amqp://b"}]}`))
	f.Add([]byte(`{"pubsub.x":[{"uri":"http://user:s3cretpw@b:15672"}]}`))
	f.Add([]byte(`{"pubsub.x":[{"uri":"amqp://u:p@[::1"}]}`))
	f.Add([]byte(`{"pubsub.x":null,"wq.":[{}]}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var m configMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return // configLoop drops it; encoding/json's own errors
		}
		xs, err := federationFor(m)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			for _, ups := range m {
				for _, u := range ups {
					if p, ok := passwordOf(u.URI); ok && strings.Contains(err.Error(), u.URI) {
						t.Fatalf("error shows the URI with password %q: %v", p, err)
					}
				}
			}
			return
		}
		want := len(m)
		for name := range m {
			if strings.HasPrefix(name, WorkQueuePrefix) {
				want++ // wq.<g>.in and wq.<g>.to
			}
		}
		if len(xs) != want {
			t.Fatalf("%d federations for %d entries, want %d", len(xs), len(m), want)
		}
		for _, x := range xs {
			if g, ok := strings.CutSuffix(x.Exchange, ".in"); ok && strings.HasPrefix(g, WorkQueuePrefix) && x.UpstreamExchange != "" {
				g = strings.TrimPrefix(g, WorkQueuePrefix)
				if !validName(g) || x.Exchange != IntakeExchangeName(g) || x.UpstreamExchange != DeadLetterExchangeName(g) {
					t.Fatalf("work-queue federation %+v", x)
				}
				if _, ok := m[WorkQueueName(g)]; !ok {
					t.Fatalf("federation %+v for no entry", x)
				}
			} else if g, ok := strings.CutSuffix(x.Exchange, ".to"); ok && strings.HasPrefix(g, WorkQueuePrefix) {
				if _, ok := m[g]; !ok || x.UpstreamExchange != "" || x.MaxHops != 1 {
					t.Fatalf("route federation %+v for no entry", x)
				}
			} else if !strings.HasPrefix(x.Exchange, "pubsub") || x.UpstreamExchange != "" {
				t.Fatalf("federation %+v is neither pubsub* nor a work queue's", x)
			} else if _, ok := m[x.Exchange]; !ok {
				t.Fatalf("federation %+v for no entry", x)
			}
			for _, name := range []string{x.Exchange, x.UpstreamExchange, ExchangeUpstreamPrefix + x.Exchange} {
				if len(name) > maxAMQPName {
					t.Fatalf("name of %d bytes (RabbitMQ takes %d): %.60q...", len(name), maxAMQPName, name)
				}
			}
			sites := map[string]bool{}
			for _, u := range x.Upstreams {
				if !strings.HasPrefix(u.URI, "amqp://") && !strings.HasPrefix(u.URI, "amqps://") {
					t.Fatalf("upstream %q accepted", u.URI)
				}
				if sites[u.Site] {
					t.Fatalf("upstream name %q twice in %+v", u.Site, x)
				}
				sites[u.Site] = true
			}
		}
	})
}

// passwordOf returns the password of a URI that has one other than what
// url.Redacted writes in its place.
func passwordOf(uri string) (string, bool) {
	u, err := url.Parse(uri)
	if err != nil || u.User == nil {
		return "", false
	}
	p, ok := u.User.Password()
	return p, ok && p != "" && p != "xxxxx"
}

// FuzzBridgeConfig: Validate never panics, refuses with errors wrapping
// ErrInvalidConfig that never show the AMQP URL's password, and accepts
// only configurations whose exports are valid filters outside '$' topics,
// whose export groups parse, and whose RabbitMQ names fit.
func FuzzBridgeConfig(f *testing.F) {
	f.Add("berlin", "amqp://guest:guest@127.0.0.1:5672/", "sensors/#,a/+/b", "", "")
	f.Add("tunis", "amqps://u:p4ssw0rd@h/", "", "$share/g/jobs/#", "http://127.0.0.1:15672")
	f.Add("s", "amqp://h/", "$SYS/#", "", "")
	f.Add("s", "amqp://h/", "", "$share/g/a,$share/g/b", "http://h")
	f.Add("bad site", "amqp://h/", "", "", "")
	f.Add("s", "http://user:hunter22@h/", "", "", "")
	f.Add("s", "amqp://h/", "", "$share/g/jobs", "")
	f.Add("s", "amqp://h/", "", "$share/g/jobs", "ftp://h")
	f.Fuzz(func(t *testing.T, site, amqpURL, exports, groups, mgmt string) {
		cfg := Config{Site: site, AMQPURL: amqpURL, Exports: splitNonEmpty(exports), ExportGroups: splitNonEmpty(groups),
			WorkQueue: WorkQueueConfig{ManagementURL: mgmt, Load: emptyLoad{}}}
		err := cfg.Validate()
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if p, ok := passwordOf(amqpURL); ok && strings.Contains(err.Error(), amqpURL) {
				t.Fatalf("error shows the AMQP URL with password %q: %v", p, err)
			}
			return
		}
		if !validName(site) {
			t.Fatalf("site %q accepted", site)
		}
		for _, e := range cfg.Exports {
			if strings.HasPrefix(e, "$") || !validFilter(e) {
				t.Fatalf("export %q accepted", e)
			}
			if name := ExchangeName(e); !strings.HasPrefix(name, ExchangePrefix) || len(name) > maxAMQPName {
				t.Fatalf("export %q gives exchange name of %d bytes: %.60q", e, len(name), name)
			}
		}
		seen := map[string]bool{}
		for _, g := range cfg.ExportGroups {
			wg, err := parseExportGroup(g)
			if err != nil || seen[wg.name] {
				t.Fatalf("export group %q accepted: %v", g, err)
			}
			seen[wg.name] = true
			for _, name := range []string{wg.queue(), IntakeQueueName(wg.name), WorkQueuePolicyPrefix + wg.queue(), ringExchange(wg.name, 1)} {
				if len(name) > maxAMQPName {
					t.Fatalf("group %q gives a name of %d bytes", g, len(name))
				}
			}
		}
	})
}

// emptyLoad is a LoadSource with no groups.
type emptyLoad struct{}

func (emptyLoad) Snapshot() []scoring.GroupSnapshot { return nil }

func splitNonEmpty(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// FuzzWorkPacket builds the MQTT publish of a work-queue message from
// arbitrary AMQP headers and checks that it is one a subscriber can take:
// it exists exactly when the topic header is a valid topic name, its QoS
// is 0 to 2 with a packet ID exactly when above 0, it carries the origin
// and message ID once each, its payload format indicator is 0 or 1, and
// Mochi encodes it as an MQTT 5 PUBLISH that decodes to the same packet
// (which fails for strings that are not UTF-8 or hold U+0000).
func FuzzWorkPacket(f *testing.F) {
	f.Add("jobs/a", int64(1), "tunis", "k", "v", "reply/to", []byte("corr"), int64(1), "text/plain", []byte("body"))
	f.Add("jobs/+", int64(0), "", "", "", "", []byte(nil), int64(-1), "", []byte(nil))
	f.Add("a", int64(7), "x", "luffymq-origin", "forged", "", []byte(nil), int64(0), "", []byte("x"))
	f.Add("a", int64(2), "", "luffymq-message-id", "forged", "r", []byte{0}, int64(1), "", []byte("x"))
	f.Fuzz(func(t *testing.T, topic string, qos int64, origin, upKey, upVal, responseTopic string, corr []byte, payloadFormat int64, contentType string, body []byte) {
		headers := amqp.Table{HeaderTopic: topic, HeaderQoS: qos, HeaderOrigin: origin,
			HeaderUserProperties: []interface{}{[]interface{}{upKey, upVal}}}
		if responseTopic != "" {
			headers[HeaderResponseTopic] = responseTopic
		}
		if corr != nil {
			headers[HeaderCorrelationData] = corr
		}
		if payloadFormat >= 0 {
			headers[HeaderPayloadFormat] = int32(payloadFormat)
		}
		b := &Bridge{cfg: Config{Site: "here"}}
		pk, ok := b.workPacket(amqp.Delivery{Headers: headers, ContentType: contentType, Body: body}, "msg-1")
		if ok != validTopic(topic) {
			t.Fatalf("topic %q: built %v", topic, ok)
		}
		if !ok {
			return
		}
		if q := pk.FixedHeader.Qos; q > 2 || (q > 0) != (pk.PacketID != 0) {
			t.Fatalf("QoS %d with packet ID %d", q, pk.PacketID)
		}
		counts := map[string]int{}
		for _, u := range pk.Properties.User {
			counts[u.Key]++
		}
		if counts[OriginUserProperty] != 1 || counts[MessageIDUserProperty] != 1 {
			t.Fatalf("user properties %+v: want origin and message ID once each", pk.Properties.User)
		}
		if pk.Properties.PayloadFormatFlag && pk.Properties.PayloadFormat > 1 {
			t.Fatalf("payload format indicator %d (MQTT allows 0 and 1)", pk.Properties.PayloadFormat)
		}
		pk.ProtocolVersion = 5
		pk.Mods.AllowResponseInfo = true // as for a client that asked for response information
		wantResponseTopic := pk.Properties.ResponseTopic
		if strings.ContainsAny(wantResponseTopic, "+#") {
			wantResponseTopic = "" // Mochi leaves out a response topic with wildcards
		}
		var buf bytes.Buffer
		if err := pk.PublishEncode(&buf); err != nil {
			t.Fatalf("encoding: %v", err)
		}
		got := decodePublish(t, buf.Bytes())
		if got.TopicName != pk.TopicName || !bytes.Equal(got.Payload, pk.Payload) ||
			got.Properties.ResponseTopic != wantResponseTopic ||
			got.Properties.ContentType != pk.Properties.ContentType ||
			!bytes.Equal(got.Properties.CorrelationData, pk.Properties.CorrelationData) ||
			len(got.Properties.User) != len(pk.Properties.User) {
			t.Fatalf("round trip through MQTT 5:\n got %+v\nwant %+v", got, pk)
		}
	})
}

// decodePublish decodes an encoded MQTT 5 PUBLISH with Mochi's decoder,
// as a subscriber's library would read it.
func decodePublish(t *testing.T, b []byte) packets.Packet {
	t.Helper()
	var fh packets.FixedHeader
	if err := fh.Decode(b[0]); err != nil {
		t.Fatalf("fixed header: %v", err)
	}
	rem, n, err := packets.DecodeLength(bytes.NewReader(b[1:]))
	if err != nil || 1+n+rem != len(b) {
		t.Fatalf("remaining length %d (%d bytes) for %d bytes: %v", rem, n, len(b), err)
	}
	fh.Remaining = rem
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: 5}
	if err := pk.PublishDecode(b[1+n:]); err != nil {
		t.Fatalf("a subscriber cannot decode the PUBLISH: %v", err)
	}
	return pk
}
