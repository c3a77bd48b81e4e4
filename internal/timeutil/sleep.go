// Package timeutil holds small time helpers shared by the SDK and the
// benchmarks.
package timeutil

import (
	"context"
	"time"
)

// SleepUntil blocks until t or until ctx ends, and returns ctx's error if
// it ended first (or had already ended when t is past).
func SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sleep waits d, or until ctx ends; it reports whether it waited the whole
// d (false when ctx ended first).
func Sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
