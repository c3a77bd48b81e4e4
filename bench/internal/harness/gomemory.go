package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// GoMemory is what a Go broker process says of its memory through the
// Prometheus Go collector's gauges (go_memstats_*, go_goroutines): the
// part of its RSS that goroutine stacks take, which no option of Mochi's
// changes, beside the heap.
type GoMemory struct {
	// StackBytes is go_memstats_stack_inuse_bytes: the goroutine stacks.
	StackBytes int64 `json:"stack_bytes"`
	// HeapInuseBytes is go_memstats_heap_inuse_bytes: heap spans in use,
	// garbage not yet collected included.
	HeapInuseBytes int64 `json:"heap_inuse_bytes"`
	Goroutines     int64 `json:"goroutines"`
}

// goMemoryGauges maps the gauges ReadGoMemory reads to their fields.
var goMemoryGauges = map[string]func(*GoMemory) *int64{
	"go_memstats_stack_inuse_bytes": func(m *GoMemory) *int64 { return &m.StackBytes },
	"go_memstats_heap_inuse_bytes":  func(m *GoMemory) *int64 { return &m.HeapInuseBytes },
	"go_goroutines":                 func(m *GoMemory) *int64 { return &m.Goroutines },
}

// ReadGoMemory reads the Go runtime's gauges from the Prometheus text
// served at url (a luffymq broker's /metrics, or `luffy-bench
// mochi-server --metrics`).
func ReadGoMemory(ctx context.Context, url string) (GoMemory, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return GoMemory{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return GoMemory{}, fmt.Errorf("reading Go memory gauges: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return GoMemory{}, fmt.Errorf("reading Go memory gauges: %s: %s", url, resp.Status)
	}
	return parseGoMemory(bufio.NewScanner(resp.Body))
}

// parseGoMemory reads the gauges of goMemoryGauges from Prometheus text
// lines ("name value"); every one must be there.
func parseGoMemory(sc *bufio.Scanner) (GoMemory, error) {
	var m GoMemory
	seen := 0
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		field, known := goMemoryGauges[name]
		if !ok || !known {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return m, fmt.Errorf("gauge %s: %w", name, err)
		}
		*field(&m) = int64(v)
		seen++
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if seen < len(goMemoryGauges) {
		return m, errors.New("the Go runtime's gauges are missing (go_memstats_stack_inuse_bytes, go_memstats_heap_inuse_bytes, go_goroutines)")
	}
	return m, nil
}

// ServeGoMetrics serves the Go collector's gauges at http://addr/metrics
// until the returned stop is called.
func ServeGoMetrics(addr string) (stop func(), err error) {
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector())
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() { _ = srv.Close() }, nil
}
