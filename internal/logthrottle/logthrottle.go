// Package logthrottle keeps a library's repeated log lines from flooding
// the log: Mochi MQTT 2.7.9 writes one WARN line per delivery it drops for
// a session past its in-flight limit ("client store quota reached"), and
// one line is written per connection that ends with an error (by LuffyMQ's
// listener, broker/pingreq, in Mochi's place), which a fleet reconnecting
// or a slow subscriber under load turns into tens of thousands of lines.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// maxKeys bounds the messages remembered; past it the memory starts over
// (a line may then pass early, never be lost for good).
const maxKeys = 1024

// Handler passes a record to the next handler unless a record with the
// same level, message and "error" attribute passed less than Every ago.
// The records it holds back are counted, and the count goes with the next
// one of them it passes, as the attribute "repeated".
type Handler struct {
	next  slog.Handler
	every time.Duration
	now   func() time.Time
	state *state
}

type state struct {
	mu   sync.Mutex
	seen map[string]*seenLine
}

type seenLine struct {
	passed time.Time
	held   int
}

// New returns a Handler in front of next that passes each kind of line at
// most once every every.
func New(next slog.Handler, every time.Duration) *Handler {
	return NewWithClock(next, every, time.Now)
}

// NewWithClock is New with a clock (for tests).
func NewWithClock(next slog.Handler, every time.Duration, now func() time.Time) *Handler {
	return &Handler{next: next, every: every, now: now, state: &state{seen: map[string]*seenLine{}}}
}

// Enabled reports whether the next handler takes records at level.
func (h *Handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

// Handle passes r on, or holds it back and counts it.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	key := lineKey(r)
	now := h.now()
	h.state.mu.Lock()
	line := h.state.seen[key]
	if line != nil && now.Sub(line.passed) < h.every {
		line.held++
		h.state.mu.Unlock()
		return nil
	}
	held := 0
	if line != nil {
		held = line.held
	} else {
		if len(h.state.seen) >= maxKeys {
			clear(h.state.seen)
		}
		line = new(seenLine)
		h.state.seen[key] = line
	}
	line.passed, line.held = now, 0
	h.state.mu.Unlock()
	if held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", held))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs returns a Handler whose next handler has attrs; it shares the
// lines seen with h.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(attrs), every: h.every, now: h.now, state: h.state}
}

// WithGroup returns a Handler whose next handler opens group; it shares
// the lines seen with h.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), every: h.every, now: h.now, state: h.state}
}

// lineKey is what makes two records the same kind of line: level, message
// and the "error" attribute's text.
func lineKey(r slog.Record) string {
	key := r.Level.String() + "\x00" + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			key += "\x00" + a.Value.String()
			return false
		}
		return true
	})
	return key
}
