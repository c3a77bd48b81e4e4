package hooks_test

import (
	"errors"
	"log/slog"
	"net"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// liftedConn is a connection that has lifted the given report payloads
// off extended PINGREQs, as broker/pingreq's Conn does. It is in memory:
// the hook only type-asserts a client's connection and Mochi's NewClient
// asks it for its remote address, so the embedded net.Conn is nil and any
// other call on it fails the run.
type liftedConn struct {
	net.Conn
	payloads  [][]byte
	oversized bool
}

// liftedRemote is the remote address of every liftedConn.
var liftedRemote = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}

func (c *liftedConn) RemoteAddr() net.Addr { return liftedRemote }

func (c *liftedConn) TakeLiftedReports() ([][]byte, bool) {
	p := c.payloads
	c.payloads = nil
	return p, c.oversized
}

var _ hooks.LiftedReportSource = (*liftedConn)(nil)

// newFuzzFixture is newHookFixture for the fuzz target, made cheap enough
// to build for every input: a discarding slog handler (nothing is
// formatted) and a Mochi server whose clients get a 1-packet outbound
// queue and a 16-byte read buffer instead of 8192 packets and 2 KiB, which
// the hook never touches since nothing is sent or read.
func newFuzzFixture(t *testing.T) *hookFixture {
	t.Helper()
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = 1
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler), Capabilities: caps, ClientNetReadBufferSize: 16})
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: srv})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}
	return &hookFixture{server: srv, engine: eng, hook: h}
}

// connectLifted makes a client on a liftedConn and establishes its
// session, subscribed to filter if it is not empty.
func (f *hookFixture) connectLifted(t *testing.T, id, filter string, version byte) (*mqtt.Client, *liftedConn) {
	t.Helper()
	conn := &liftedConn{}
	cl := f.server.NewClient(conn, "test", id, false)
	cl.Properties.ProtocolVersion = version
	f.hook.OnSessionEstablished(cl, packets.Packet{})
	if filter != "" {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe},
			Filters: []packets.Subscription{{Filter: filter, Qos: 1}}}
		f.hook.OnSubscribed(cl, pk, []byte{1})
	}
	return cl, conn
}

// memberState returns the engine's view of clientID in its group.
func memberState(t *testing.T, e *scoring.Engine, clientID string) scoring.MemberSnapshot {
	t.Helper()
	for _, g := range e.Snapshot() {
		for _, m := range g.Members {
			if m.ClientID == clientID {
				return m
			}
		}
	}
	t.Fatalf("%s is in no group", clientID)
	return scoring.MemberSnapshot{}
}

// reportCounts returns the hook's accepted and malformed counters for via.
func reportCounts(h *hooks.SelectionHook, via hooks.ReportChannel) (accepted, malformed uint64) {
	return h.Reports.Accepted[via].Load(), h.Reports.Malformed[via].Load()
}

// FuzzLoadReport sends an arbitrary payload as a load report, published
// to $luffy/load or lifted off a PINGREQ, from a shared-group member or a
// client in no group, over MQTT 5 or 3.1.1, and checks what the hook makes
// of it:
//   - a publish to $luffy/load is never routed: OnPublish answers
//     CodeSuccessIgnore, or ErrPayloadFormatInvalid for a malformed QoS≥1
//     report over MQTT 5 (the PUBACK tells the client); a publish to any
//     other topic passes untouched;
//   - exactly one counter of the report's channel moves: Malformed when
//     report.Decode rejects the payload, Accepted otherwise;
//   - a client in no group never creates engine state (Counts unchanged),
//     and no report changes another client's state;
//   - a member's accepted report is applied to it (one more report, its
//     pending count within [0, reported]); a malformed one is not.
func FuzzLoadReport(f *testing.F) {
	f.Add([]byte(`{"msgsInQueue": 3, "processingTimePerMsg": 25.5}`), true, false, byte(1), true, report.LoadTopic)
	f.Add([]byte(`{"msgsInQueue": 3, "processingTimePerMsg": 25.5}`), false, false, byte(0), true, report.LoadTopic)
	f.Add([]byte(`{"msgsInQueue": 1e7, "workers": 99999, "backlogMs": 1, "received": 5}`), true, true, byte(0), true, "")
	f.Add([]byte(`{"msgsInQueue": "3"}`), true, false, byte(1), true, report.LoadTopic)
	f.Add([]byte(`{"msgsInQueue": -1}`), false, false, byte(2), false, report.LoadTopic)
	f.Add([]byte("\x05\x26\x00\x01a\x00{\"msgsInQueue\": 6}"), true, true, byte(0), true, "")
	f.Add([]byte("not json"), false, true, byte(0), true, "")
	f.Add([]byte(`{"msgsInQueue": 2}`), true, false, byte(1), true, "$luffy/load/x")

	f.Fuzz(func(t *testing.T, payload []byte, fromMember, viaPingreq bool, qos byte, v5 bool, topic string) {
		fx := newFuzzFixture(t)
		version := byte(4)
		if v5 {
			version = 5
		}
		member, memberConn := fx.connectLifted(t, "member", "$share/g/jobs", version)
		device, deviceConn := fx.connectLifted(t, "device", "plain/t", version)
		sender, senderConn := device, deviceConn
		if fromMember {
			sender, senderConn = member, memberConn
		}
		members, groups := fx.engine.Counts()
		if members != 1 || groups != 1 {
			t.Fatalf("fixture: engine holds %d members and %d groups, want 1 and 1", members, groups)
		}
		before := memberState(t, fx.engine, "member")
		decoded, decodeErr := report.Decode(payload)

		via := hooks.ViaPublish
		if viaPingreq {
			via = hooks.ViaPingreq
		}
		accepted0, malformed0 := reportCounts(fx.hook, via)
		otherAccepted0, otherMalformed0 := reportCounts(fx.hook, 1-via)
		applied := true
		if viaPingreq {
			senderConn.payloads = [][]byte{payload}
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}
			got, err := fx.hook.OnPacketRead(sender, pk)
			if err != nil || got.FixedHeader.Type != packets.Pingreq {
				t.Fatalf("OnPacketRead: %v, packet type %d; the PINGREQ must go on", err, got.FixedHeader.Type)
			}
		} else {
			pk := packets.Packet{
				FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos % 3},
				TopicName:   topic,
				Payload:     payload,
			}
			got, err := fx.hook.OnPublish(sender, pk)
			switch {
			case topic != report.LoadTopic:
				if err != nil || got.TopicName != topic || string(got.Payload) != string(payload) {
					t.Fatalf("publish to %q: %v; it must pass untouched", topic, err)
				}
				applied = false
			case decodeErr != nil && qos%3 > 0 && v5:
				if !errors.Is(err, packets.ErrPayloadFormatInvalid) {
					t.Fatalf("malformed QoS %d report over MQTT 5: error %v, want ErrPayloadFormatInvalid", qos%3, err)
				}
			default:
				if !errors.Is(err, packets.CodeSuccessIgnore) {
					t.Fatalf("report publish: error %v, want CodeSuccessIgnore (acknowledged, never routed)", err)
				}
			}
		}

		accepted, malformed := reportCounts(fx.hook, via)
		wantAccepted, wantMalformed := accepted0, malformed0
		if applied && decodeErr == nil {
			wantAccepted++
		} else if applied {
			wantMalformed++
		}
		if accepted != wantAccepted || malformed != wantMalformed {
			t.Fatalf("%s counters: accepted %d malformed %d, want %d and %d (decode error: %v)",
				via, accepted, malformed, wantAccepted, wantMalformed, decodeErr)
		}
		if a, m := reportCounts(fx.hook, 1-via); a != otherAccepted0 || m != otherMalformed0 {
			t.Fatalf("the other channel's counters moved")
		}

		if m, g := fx.engine.Counts(); m != members || g != groups {
			t.Fatalf("engine holds %d members and %d groups after the report, want %d and %d", m, g, members, groups)
		}
		after := memberState(t, fx.engine, "member")
		if !fromMember || !applied || decodeErr != nil {
			if after.Reports != before.Reports || after.ReportedPending != before.ReportedPending {
				t.Fatalf("member state changed by a report that is not its own valid one: %+v -> %+v", before, after)
			}
			return
		}
		if after.Reports != before.Reports+1 {
			t.Fatalf("member reports %d -> %d, want one more", before.Reports, after.Reports)
		}
		if after.ReportedPending < 0 || after.ReportedPending > decoded.Pending {
			t.Fatalf("member reported pending %d for a report of %d", after.ReportedPending, decoded.Pending)
		}
	})
}
