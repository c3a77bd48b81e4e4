package shared

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

func newTestPahoMember(t *testing.T, kind string) *pahoMember {
	t.Helper()
	m, err := newPahoMember(pahoMemberConfig{Kind: kind, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return m
}

func TestPahoMemberThesisReport(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name     string
		queued   int
		finished []time.Duration
		want     report.Report
	}{
		{"nothing finished yet", 3, nil, report.Report{Pending: 3}},
		{"mean of the messages finished since the last report", 1, []time.Duration{20 * ms, 30 * ms}, report.Report{Pending: 1, ProcessingTime: 25 * ms}},
		{"idle", 0, []time.Duration{50 * ms}, report.Report{ProcessingTime: 50 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestPahoMember(t, KindTimerReporter)
			for range tt.queued {
				m.queue <- queuedMsg{pub: &paho.Publish{}}
			}
			for _, d := range tt.finished {
				m.finished(d)
			}
			r := m.takeReport()
			require.Equal(t, tt.want, r)
			// The wire payload holds the two thesis keys and nothing else.
			var keys map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(report.Encode(r), &keys))
			names := make([]string, 0, len(keys))
			for k := range keys {
				names = append(names, k)
			}
			sort.Strings(names)
			require.Equal(t, []string{"msgsInQueue", "processingTimePerMsg"}, names)
			// A new report period starts: processing time 0 until
			// another message finishes.
			again := m.takeReport()
			require.Equal(t, report.Report{Pending: tt.queued}, again)
		})
	}
}

func TestPahoMemberProcessingTimeByKind(t *testing.T) {
	received := time.Now()
	end := received.Add(40 * time.Millisecond) // 15 ms queued, 25 ms of work
	require.Equal(t, 25*time.Millisecond, newTestPahoMember(t, KindThesisReporter).processingTime(25*time.Millisecond, received, end))
	require.Equal(t, 40*time.Millisecond, newTestPahoMember(t, KindReceiptReporter).processingTime(25*time.Millisecond, received, end), "from receipt")
}

func TestNewPahoMemberPingerByKind(t *testing.T) {
	tests := []struct {
		kind        string
		wantReports bool
		wantEarly   bool
	}{
		{KindThesisReporter, true, true},
		{KindTimerReporter, true, false},
		{KindReceiptReporter, true, true},
		{KindPahoQoS1AckAfter, false, false},
	}
	for _, tt := range tests {
		m := newTestPahoMember(t, tt.kind)
		require.Equal(t, tt.wantReports, m.pinger != nil, tt.kind)
		if m.pinger != nil {
			require.Equal(t, tt.wantEarly, m.pinger.early, tt.kind)
		}
		want := "none"
		if tt.wantReports {
			want = "pingreq"
		}
		require.Equal(t, want, m.Stats().ReportVia)
	}
	_, err := newPahoMember(pahoMemberConfig{Kind: KindSDK})
	require.Error(t, err)
}

// pingerHarness runs a thesisPinger on one end of a pipe and collects
// what it writes, one packet per Write.
type pingerHarness struct {
	p       *thesisPinger
	packets chan []byte
	errs    chan error
	cancel  context.CancelFunc
}

func startPinger(t *testing.T, early bool, take func() report.Report, keepAlive uint16) *pingerHarness {
	t.Helper()
	client, server := net.Pipe()
	h := &pingerHarness{p: newThesisPinger(take, early), packets: make(chan []byte, 16), errs: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.errs <- h.p.Run(ctx, client, keepAlive) }()
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			h.packets <- append([]byte(nil), buf[:n]...)
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = client.Close()
		_ = server.Close()
	})
	return h
}

// next returns the next packet, failing after within.
func (h *pingerHarness) next(t *testing.T, within time.Duration) []byte {
	t.Helper()
	select {
	case pk := <-h.packets:
		return pk
	case <-time.After(within):
		t.Fatalf("no PINGREQ within %s", within)
		return nil
	}
}

// none checks that nothing is written for d.
func (h *pingerHarness) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case pk := <-h.packets:
		t.Fatalf("unexpected packet % x", pk)
	case <-time.After(d):
	}
}

func TestThesisPingerReportsAfterFirstProcessedMessageOnlyWhenEarly(t *testing.T) {
	r := report.Report{Pending: 2, ProcessingTime: 25 * time.Millisecond}
	tests := []struct {
		name  string
		early bool
	}{
		{"thesis-reporter", true},
		{"timer-reporter", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startPinger(t, tt.early, func() report.Report { return r }, 30)
			h.p.start(time.Hour) // no periodic report during the test
			h.p.firstProcessed()
			if !tt.early {
				h.none(t, 200*time.Millisecond)
				return
			}
			pk := h.next(t, 5*time.Second)
			require.Equal(t, report.EncodePingreq(r), pk, "one extended PINGREQ in a single Write")
			h.p.firstProcessed() // only the first processed message triggers a report
			h.none(t, 200*time.Millisecond)
			require.Equal(t, uint64(1), h.p.sent.Load())
		})
	}
}

func TestThesisPingerReportsEveryInterval(t *testing.T) {
	n := 0
	take := func() report.Report { n++; return report.Report{Pending: n} }
	h := startPinger(t, false, take, 30)
	h.none(t, 100*time.Millisecond) // nothing before the broker's interval is known
	h.p.start(50 * time.Millisecond)
	for i := 1; i <= 3; i++ {
		pk := h.next(t, 5*time.Second)
		require.Equal(t, report.EncodePingreq(report.Report{Pending: i}), pk)
		h.p.PingResp()
	}
	h.cancel()
	select {
	case err := <-h.errs:
		require.NoError(t, err, "a cancelled Run ends without error")
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end")
	}
}

func TestThesisPingerFailsWhenPingrespIsOverdue(t *testing.T) {
	h := startPinger(t, false, func() report.Report { return report.Report{} }, 1)
	h.p.start(100 * time.Millisecond)
	h.next(t, 5*time.Second)
	// No PingResp: after one keep-alive period Run gives up, which makes
	// paho drop the connection.
	for {
		select {
		case err := <-h.errs:
			require.ErrorContains(t, err, "PINGRESP not received")
			return
		case <-h.packets:
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not fail")
		}
	}
}
