package bridge_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// testSites are the sites of the shared RabbitMQ nodes.
var testSites = []string{"berlin", "tunis", "montreal"}

// nodes are the package's RabbitMQ nodes, one per test site, started in
// parallel on first use and stopped by TestMain.
var nodes = rabbitharness.NewShared(rabbitharness.Config{Sites: testSites})

// fedResets is the nodes' Resets count when the federation mesh was last
// applied: -1 before the first time. Each top-level test finds the nodes
// reset, so the mesh is applied again for it.
var fedResets = -1

func TestMain(m *testing.M) {
	code := m.Run()
	_ = nodes.Close()
	os.Exit(code)
}

// sharedNodes returns the package's RabbitMQ nodes.
func sharedNodes(t *testing.T) *rabbitharness.Harness { return nodes.Get(t) }

// federatedNodes returns the shared nodes joined in a full mesh through
// latency links (max-hops 1).
func federatedNodes(t *testing.T) *rabbitharness.Harness {
	t.Helper()
	h := sharedNodes(t)
	if fedResets == h.Resets() {
		return h
	}
	for _, site := range testSites {
		n := h.Node(site)
		upstreams := bridge.FullMesh(site, testSites, func(from, to string) string {
			l, err := h.Link(h.Node(from), h.Node(to))
			require.NoError(t, err)
			return l.AMQPURL()
		})
		require.NoError(t, bridge.ApplyFederation(context.Background(), bridge.FederationConfig{
			ManagementURL: n.ManagementURL(),
			Username:      rabbitharness.User,
			Password:      rabbitharness.Password,
			Upstreams:     upstreams,
			MaxHops:       1,
		}))
	}
	fedResets = h.Resets()
	return h
}

// startSite starts a luffymq broker bridged to node with the given exports.
func startSite(t *testing.T, site string, amqpURL string, exports ...string) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{
		MQTTListen:     "127.0.0.1:0",
		HTTPListen:     "127.0.0.1:0",
		ReportInterval: time.Second,
		Logger:         testLogger(t),
		AMQPURL:        amqpURL,
		Site:           site,
		Exports:        exports,
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// waitFederation waits until every site's node runs one federation link
// per other site for exchange.
func waitFederation(t *testing.T, h *rabbitharness.Harness, exchange string) {
	t.Helper()
	var last sync.Map
	require.Eventually(t, func() bool {
		for _, site := range testSites {
			n := h.Node(site)
			links, err := bridge.FederationLinks(context.Background(), n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
			last.Store(site, fmt.Sprint(links, err))
			if err != nil {
				return false
			}
			running := 0
			for _, l := range links {
				if l.Exchange == exchange && l.Status == "running" {
					running++
				}
			}
			if running != len(testSites)-1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "federation links of %s not all running: %s", exchange, stringer(func() string {
		var b strings.Builder
		last.Range(func(k, v any) bool { fmt.Fprintf(&b, "\n%s: %s", k, v); return true })
		return b.String()
	}))
}

// stringer formats lazily.
type stringer func() string

func (s stringer) String() string { return s() }

// resetNodes empties h's nodes (rabbitharness.Harness.Reset) for a
// subtest that starts its own brokers: sharedNodes resets them only
// between top-level tests, and what earlier subtests' federation links
// left running slowed the later ones by half.
func resetNodes(t *testing.T, h *rabbitharness.Harness) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, h.Reset(ctx))
}
