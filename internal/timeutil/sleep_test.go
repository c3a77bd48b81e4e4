package timeutil

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	start := time.Now()
	if !Sleep(context.Background(), 5*time.Millisecond) {
		t.Fatal("Sleep with a live context reported an early end")
	}
	if time.Since(start) < 5*time.Millisecond {
		t.Fatal("Sleep returned before d")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on an ended context reported a full wait")
	}
	if time.Since(start) > time.Second {
		t.Fatal("Sleep on an ended context waited")
	}
}
