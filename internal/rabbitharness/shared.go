package rabbitharness

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// Shared is a harness that a test binary starts once, on the first test
// that asks for it, and shares between its tests (starting RabbitMQ nodes
// takes seconds). Declare one per package, ask for it with Get and close
// it from TestMain once m.Run returns. Each top-level test gets the nodes
// as Reset leaves them: what an earlier test declared is gone. Tests that
// share a Shared must not run in parallel.
type Shared struct {
	cfg  Config
	once sync.Once
	h    *Harness
	err  error

	mu      sync.Mutex
	lastTop string // the top-level test that last asked
}

// NewShared returns a shared harness for cfg; nothing starts yet.
func NewShared(cfg Config) *Shared { return &Shared{cfg: cfg} }

// Get returns the shared harness, starting it on first use and resetting
// it (Reset) when a top-level test other than the last one asks. It skips t in
// -short mode and, without RabbitMQ installed, skips t or fails it when CI
// is "true" (SkipIfUnavailable); a harness that failed to start fails every
// test that asks for it.
func (s *Shared) Get(t testing.TB) *Harness {
	t.Helper()
	if testing.Short() {
		t.Skip("starts RabbitMQ nodes")
	}
	SkipIfUnavailable(t)
	started := false
	s.once.Do(func() {
		s.h, s.err = Start(context.Background(), s.cfg)
		started = true
	})
	if s.err != nil {
		t.Fatalf("starting RabbitMQ nodes: %v", s.err)
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	if top != s.lastTop {
		s.lastTop = top
		if !started {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := s.h.Reset(ctx); err != nil {
				t.Fatalf("resetting the shared RabbitMQ nodes for %s: %v", top, err)
			}
		}
	}
	return s.h
}

// Close stops the harness if it was started.
func (s *Shared) Close() error {
	if s.h == nil {
		return nil
	}
	return s.h.Close()
}
