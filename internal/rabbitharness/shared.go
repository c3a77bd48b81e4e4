package rabbitharness

import (
	"context"
	"sync"
	"testing"
)

// Shared is a harness that a test binary starts once, on the first test
// that asks for it, and shares between its tests (starting RabbitMQ nodes
// takes seconds). Declare one per package, ask for it with Get and close
// it from TestMain once m.Run returns.
type Shared struct {
	cfg  Config
	once sync.Once
	h    *Harness
	err  error
}

// NewShared returns a shared harness for cfg; nothing starts yet.
func NewShared(cfg Config) *Shared { return &Shared{cfg: cfg} }

// Get returns the shared harness, starting it on first use. It skips t in
// -short mode and, without RabbitMQ installed, skips t or fails it when CI
// is "true" (SkipIfUnavailable); a harness that failed to start fails every
// test that asks for it.
func (s *Shared) Get(t testing.TB) *Harness {
	t.Helper()
	if testing.Short() {
		t.Skip("starts RabbitMQ nodes")
	}
	SkipIfUnavailable(t)
	s.once.Do(func() { s.h, s.err = Start(context.Background(), s.cfg) })
	if s.err != nil {
		t.Fatalf("starting RabbitMQ nodes: %v", s.err)
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
