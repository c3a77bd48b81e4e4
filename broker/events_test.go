package broker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// sseEvent is one Server-Sent Event as read off the wire.
type sseEvent struct {
	name string
	data string
}

// readEvents reads Server-Sent Events from body into a channel until it
// ends.
func readEvents(t *testing.T, body *bufio.Reader) <-chan sseEvent {
	t.Helper()
	out := make(chan sseEvent, 64)
	go func() {
		defer close(out)
		var ev sseEvent
		for {
			line, err := body.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				if ev.name != "" || ev.data != "" {
					out <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data += strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out
}

func nextEvent(t *testing.T, events <-chan sseEvent, within time.Duration) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		require.True(t, ok, "event stream ended")
		return ev
	case <-time.After(within):
		t.Fatalf("no event within %s", within)
		return sseEvent{}
	}
}

// openEvents opens GET /api/v1/events; the stream is closed when the test
// ends.
func openEvents(t *testing.T, b *Broker) (*http.Response, <-chan sseEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.HTTPAddr()+"/api/v1/events", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp, readEvents(t, bufio.NewReader(resp.Body))
}

// TestEventsStreamHistoryThenSnapshots: the stream opens with the history,
// then sends a snapshot at once and one a second, whose rates follow the
// traffic: a publisher at about 50 msgs/s to a shared group of two.
func TestEventsStreamHistoryThenSnapshots(t *testing.T) {
	b := startBroker(t, nil)
	for _, id := range []string{"m1", "m2"} {
		connectPaho(t, b.MQTTAddr(), id, nil).subscribe(t, "$share/g/jobs", 0)
	}
	pub := connectPaho(t, b.MQTTAddr(), "pub", nil)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = pub.Publish(ctx, &paho.Publish{Topic: "jobs", Payload: []byte("x")})
			}
		}
	}()
	time.Sleep(2500 * time.Millisecond) // two samples in the history

	resp, events := openEvents(t, b)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	ev := nextEvent(t, events, 2*time.Second)
	require.Equal(t, "history", ev.name)
	var hist HistoryEvent
	require.NoError(t, json.Unmarshal([]byte(ev.data), &hist))
	require.Equal(t, 1000.0, hist.IntervalMs)
	require.GreaterOrEqual(t, len(hist.Points), 2, "samples taken before the stream opened")
	for i := 1; i < len(hist.Points); i++ {
		require.Greater(t, hist.Points[i].TimeMs, hist.Points[i-1].TimeMs, "oldest first")
	}

	ev = nextEvent(t, events, 2*time.Second)
	require.Equal(t, "snapshot", ev.name, "a snapshot right after the history")
	var first SnapshotEvent
	require.NoError(t, json.Unmarshal([]byte(ev.data), &first))

	// Field names are part of the API.
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(ev.data), &raw))
	for _, k := range []string{"time_ms", "overview", "groups", "rates", "rejected_reports", "bridge"} {
		require.Contains(t, raw, k)
	}
	require.JSONEq(t, "null", string(raw["bridge"]), "no bridge configured")
	require.Contains(t, string(raw["rates"]), `"msgs_in_per_s"`)

	start := time.Now()
	ev = nextEvent(t, events, 2*time.Second)
	require.Equal(t, "snapshot", ev.name)
	var snap SnapshotEvent
	require.NoError(t, json.Unmarshal([]byte(ev.data), &snap))
	require.Less(t, time.Since(start), 1500*time.Millisecond, "one snapshot a second")
	require.Greater(t, snap.TimeMs, first.TimeMs)
	require.Len(t, snap.Groups, 1)
	require.Equal(t, "$share/g/jobs", snap.Groups[0].Filter)
	require.Len(t, snap.Groups[0].Members, 2)
	require.NotNil(t, snap.Rates)
	require.InDelta(t, 50, snap.Rates.MessagesInPerSec, 30, "publish rate seen: %+v", snap.Rates)
	require.InDelta(t, 50, snap.Rates.MessagesOutPerSec, 30, "each message to one member: %+v", snap.Rates)
	var sel float64
	for _, m := range snap.Rates.Members {
		require.Equal(t, "$share/g/jobs", m.Group)
		sel += m.SelectionsPerSec
	}
	require.Len(t, snap.Rates.Members, 2)
	require.InDelta(t, 50, sel, 30, "selections per second add up to the group's rate")
	require.GreaterOrEqual(t, snap.Overview.ClientsConnected, int64(3))
}

// TestEventsStreamsEndWhenBrokerCloses: Close ends every open stream (the
// HTTP server would otherwise wait for them).
func TestEventsStreamsEndWhenBrokerCloses(t *testing.T) {
	b := startBroker(t, nil)
	_, events := openEvents(t, b)
	require.Equal(t, "history", nextEvent(t, events, 2*time.Second).name)
	start := time.Now()
	require.NoError(t, b.Close())
	require.Less(t, time.Since(start), 3*time.Second)
	for range events { // drains until the stream ends
	}
}

// TestEventsStreamLimit: at most MaxEventStreams streams at once; the next
// is refused with 503 and may come back when one ends.
func TestEventsStreamLimit(t *testing.T) {
	b := startBroker(t, nil)
	cancels := make([]context.CancelFunc, 0, MaxEventStreams)
	for range MaxEventStreams {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		cancels = append(cancels, cancel)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.HTTPAddr()+"/api/v1/events", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/events")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	cancels[0]()
	eventually(t, 3*time.Second, func() bool { return b.live.streams.Load() < MaxEventStreams })
	_, events := openEvents(t, b)
	require.Equal(t, "history", nextEvent(t, events, 2*time.Second).name)
}

func TestHistoryRingKeepsNewestOldestFirst(t *testing.T) {
	r := newHistoryRing(3)
	require.Empty(t, r.points())
	require.Nil(t, r.latest())
	for i := int64(1); i <= 5; i++ {
		r.add(HistoryPoint{TimeMs: i})
	}
	var got []int64
	for _, p := range r.points() {
		got = append(got, p.TimeMs)
	}
	require.Equal(t, []int64{3, 4, 5}, got)
	require.Equal(t, int64(5), r.latest().TimeMs)
}

// TestHistoryIsBounded: the broker keeps HistoryLength samples and at most
// MaxMemberSeries members per sample, the busiest first.
func TestHistoryIsBounded(t *testing.T) {
	b := startBroker(t, nil)
	b.live.stop() // sample by hand below
	for i := range MaxMemberSeries + 4 {
		b.engine.Join("$share/g/t", fmt.Sprintf("m%02d", i))
	}
	now := time.Now()
	b.live.mu.Lock()
	b.live.prev.at = now
	b.live.prev.selections = map[memberKey]uint64{}
	b.live.mu.Unlock()
	for i := range HistoryLength + 10 {
		b.live.sample(now.Add(time.Duration(i+1) * time.Second))
	}
	h := b.History()
	require.Len(t, h.Points, HistoryLength)
	require.Equal(t, now.Add((HistoryLength+10)*time.Second).UnixMilli(), h.Points[len(h.Points)-1].TimeMs)
	for _, p := range h.Points {
		require.Len(t, p.Members, MaxMemberSeries)
	}
	require.Equal(t, "m00", h.Points[0].Members[0].ClientID, "equal rates: by group, then client ID")
	// The ring must not keep the points of the members it cut: a reslice
	// kept all of them, 48 B per member per sample, which made the soak's
	// heap grow by 57 MB over the first ten minutes with 2 000 members.
	// The sampler reuses one buffer for every member's point; the history
	// must hold copies (a reslice would keep all members' points alive and
	// be overwritten by the next sample).
	b.live.mu.Lock()
	defer b.live.mu.Unlock()
	scratch := b.live.rankScratch[:cap(b.live.rankScratch)]
	require.GreaterOrEqual(t, len(scratch), MaxMemberSeries+4)
	for _, p := range b.live.history.buf {
		for i := range p.Members {
			for j := range scratch {
				require.NotSame(t, &scratch[j], &p.Members[i])
			}
		}
	}
}

func TestRejectedReportsAreListed(t *testing.T) {
	b := startBroker(t, nil)
	c := connectPaho(t, b.MQTTAddr(), "bad-reporter", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Publish(ctx, &paho.Publish{Topic: "$luffy/load", QoS: 0, Payload: []byte(`{"msgsInQueue":"x"}`)})
	require.NoError(t, err)

	var got RejectedReportsResponse
	eventually(t, 5*time.Second, func() bool {
		resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/rejected-reports")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		return len(got.RejectedReports) == 1
	})
	r := got.RejectedReports[0]
	require.Equal(t, "bad-reporter", r.ClientID)
	require.Equal(t, "publish", r.Channel)
	require.NotEmpty(t, r.Reason)
	require.InDelta(t, time.Now().UnixMilli(), r.TimeMs, 10000)
}

func TestBridgeEndpointWithoutBridge(t *testing.T) {
	b := startBroker(t, nil)
	resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/bridge")
	require.NoError(t, err)
	defer resp.Body.Close()
	var raw map[string]json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	require.JSONEq(t, "null", string(raw["bridge"]))
}

// TestClientsPaged: /api/v1/clients lists clients sorted by ID, pages with
// offset and limit, and describes each.
func TestClientsPaged(t *testing.T) {
	b := startBroker(t, nil)
	for i := range 5 {
		pc := connectPaho(t, b.MQTTAddr(), fmt.Sprintf("c%d", i), nil)
		if i == 2 {
			pc.subscribe(t, "$share/g/jobs", 1)
			pc.subscribe(t, "plain/#", 0)
		}
	}
	get := func(query string) (int, ClientsResponse) {
		resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/clients" + query)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out ClientsResponse
		if resp.StatusCode == http.StatusOK {
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		}
		return resp.StatusCode, out
	}
	ids := func(r ClientsResponse) (out []string) {
		for _, c := range r.Clients {
			out = append(out, c.ClientID)
		}
		return out
	}

	code, all := get("")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 5, all.Total)
	require.Equal(t, DefaultClientsLimit, all.Limit)
	require.Equal(t, []string{"c0", "c1", "c2", "c3", "c4"}, ids(all))

	_, page := get("?offset=1&limit=2")
	require.Equal(t, []string{"c1", "c2"}, ids(page))
	require.Equal(t, 5, page.Total)
	c2 := page.Clients[1]
	require.True(t, c2.Connected)
	require.Equal(t, 5, c2.ProtocolVersion)
	require.Equal(t, 2, c2.Subscriptions)
	require.Equal(t, []string{"$share/g/jobs"}, c2.Groups)
	require.Equal(t, 0, c2.InFlight)
	require.Contains(t, c2.RemoteAddr, "127.0.0.1:")
	require.NotNil(t, c2.QoS0Dropped)
	require.Equal(t, uint64(0), *c2.QoS0Dropped)
	require.NotNil(t, c2.ConnectedSince)
	since, err := time.Parse(time.RFC3339, *c2.ConnectedSince)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), since, time.Minute)

	_, past := get("?offset=10")
	require.Empty(t, past.Clients)
	require.Equal(t, 5, past.Offset, "offset clamped to the total")
	for _, bad := range []string{"?limit=0", "?limit=1001", "?offset=-1", "?limit=x"} {
		code, _ := get(bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
	code, maxPage := get("?limit=1000")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 1000, maxPage.Limit)

	// Field names are part of the API.
	resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/clients?limit=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	var raw struct {
		Clients []map[string]json.RawMessage `json:"clients"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
	for _, k := range []string{"client_id", "connected", "remote_addr", "listener", "protocol_version", "subscriptions", "inflight", "groups", "qos0_dropped", "write_queue_dropped", "connected_since"} {
		require.Contains(t, raw.Clients[0], k)
	}
}

// closedLoopbackAddr returns a loopback address nothing listens on.
func closedLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestBridgeStatusWhileRabbitMQUnreachable: with the bridge on, the
// status names the site, its exports and exchanges and says it is not
// connected; federation links are unknown without a management URL.
func TestBridgeStatusWhileRabbitMQUnreachable(t *testing.T) {
	b := startBroker(t, func(c *Config) {
		c.AMQPURL = "amqp://guest:guest@" + closedLoopbackAddr(t) + "/"
		c.Site = "berlin"
		c.Exports = []string{"sensors/#"}
	})
	var got BridgeResponse
	eventually(t, 5*time.Second, func() bool {
		resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/bridge")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
		return got.Bridge != nil
	}, "a sample describes the bridge")
	br := got.Bridge
	require.Equal(t, "berlin", br.Site)
	require.False(t, br.Connected)
	require.Equal(t, []string{"sensors/#"}, br.Exports)
	require.Len(t, br.Exchanges, 1)
	require.Equal(t, "pubsub.sensors", br.Exchanges[0].Name)
	require.Zero(t, br.Exchanges[0].Exported)
	require.Equal(t, b.Bridge().ImportQueue(), br.ImportQueue)
	require.Nil(t, br.FederationLinks)
	require.Empty(t, br.FederationError)
	require.Empty(t, br.WorkQueues)

	snap := b.Snapshot()
	require.NotNil(t, snap.Bridge)
	require.Equal(t, "berlin", snap.Bridge.Site)
}

// TestRejectedReportsViaPingreq: an oversized extended PINGREQ and a
// malformed one are both listed, newest first, with the reason.
func TestRejectedReportsViaPingreq(t *testing.T) {
	b := startBroker(t, nil)
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc, _ := dialRaw(t, conn, "too-big")
	payload := bytes.Repeat([]byte("x"), report.MaxPayload+1)
	rc.writeBytes(append(append([]byte{0xC0}, varint(len(payload))...), payload...))
	eventually(t, 5*time.Second, func() bool { return len(b.RejectedReports().RejectedReports) == 1 })

	conn2, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	rc2, _ := dialRaw(t, conn2, "not-json")
	rc2.writeBytes(append([]byte{0xC0}, append(varint(3), "{x}"...)...))
	eventually(t, 5*time.Second, func() bool { return len(b.RejectedReports().RejectedReports) == 2 })

	got := b.RejectedReports().RejectedReports
	require.Equal(t, "not-json", got[0].ClientID)
	require.Equal(t, "pingreq", got[0].Channel)
	require.NotEmpty(t, got[0].Reason)
	require.Equal(t, "too-big", got[1].ClientID)
	require.Equal(t, "pingreq", got[1].Channel)
	require.Contains(t, got[1].Reason, fmt.Sprintf("larger than %d bytes", report.MaxPayload))
}
