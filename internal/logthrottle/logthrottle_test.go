package logthrottle

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newLogger(every time.Duration) (*slog.Logger, *bytes.Buffer, *fakeClock) {
	var out bytes.Buffer
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	text := slog.NewTextHandler(&out, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})
	return slog.New(NewWithClock(text, every, clock.now)), &out, clock
}

func lines(out *bytes.Buffer) []string {
	s := strings.TrimSpace(out.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestRepeatedLinesPassOncePerIntervalWithTheirCount(t *testing.T) {
	log, out, clock := newLogger(10 * time.Second)
	for i := range 5 {
		log.Warn("client store quota reached", "client", i)
	}
	require.Equal(t, []string{`level=WARN msg="client store quota reached" client=0`}, lines(out))

	clock.t = clock.t.Add(10 * time.Second)
	log.Warn("client store quota reached", "client", 9)
	require.Equal(t, `level=WARN msg="client store quota reached" client=9 repeated=4`, lines(out)[1],
		"the next line passed says how many were held back")

	clock.t = clock.t.Add(11 * time.Second)
	log.Warn("client store quota reached", "client", 10)
	require.Equal(t, `level=WARN msg="client store quota reached" client=10`, lines(out)[2], "none held back since")
}

func TestDifferentLinesDoNotHoldEachOtherBack(t *testing.T) {
	log, out, _ := newLogger(time.Minute)
	log.Warn("", "listener", "tcp", "error", errors.New("EOF"))
	log.Warn("", "listener", "tcp", "error", errors.New("connection reset by peer"))
	log.Warn("", "listener", "tcp", "error", errors.New("EOF"))
	log.Error("", "listener", "tcp", "error", errors.New("EOF"))
	log.Warn("another message")
	got := lines(out)
	require.Len(t, got, 4, "error text and level make lines different: %q", got)
	require.Contains(t, got[0], "error=EOF")
	require.Contains(t, got[1], `error="connection reset by peer"`)
	require.Contains(t, got[2], "level=ERROR")
	require.Contains(t, got[3], "another message")
}

func TestLoggersWithAttrsShareWhatTheySaw(t *testing.T) {
	log, out, _ := newLogger(time.Minute)
	log.With("listener", "tcp").Warn("client store quota reached")
	log.With("listener", "ws").WithGroup("g").Warn("client store quota reached")
	require.Len(t, lines(out), 1)
}

func TestMemoryOfLinesIsBounded(t *testing.T) {
	log, out, _ := newLogger(time.Minute)
	h := log.Handler().(*Handler)
	for i := range maxKeys + 10 {
		log.Info("line", "error", i)
	}
	require.LessOrEqual(t, len(h.state.seen), maxKeys)
	require.Len(t, lines(out), maxKeys+10, "distinct lines all pass")
}

func BenchmarkHandleHeldBack(b *testing.B) {
	log, _, _ := newLogger(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		log.Warn("client store quota reached", "client", "c1", "listener", "tcp")
	}
}
