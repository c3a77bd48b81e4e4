package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// nodeSites are the package's RabbitMQ nodes; tests map their own site
// names onto them and isolate themselves in a virtual host each.
var nodeSites = []string{"berlin", "tunis", "tokyo"}

// nodes are the package's three RabbitMQ nodes, started on first use and
// stopped by TestMain.
var nodes = rabbitharness.NewShared(rabbitharness.Config{Sites: nodeSites})

func TestMain(m *testing.M) {
	code := m.Run()
	_ = nodes.Close()
	os.Exit(code)
}

// sharedNodes returns the package's RabbitMQ nodes.
func sharedNodes(t *testing.T) *rabbitharness.Harness { return nodes.Get(t) }

// testVhost creates a fresh virtual host on every node, open to the
// harness user, and deletes it when t ends.
func testVhost(t *testing.T, h *rabbitharness.Harness) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	vhost := "ctl-" + hex.EncodeToString(b)
	for _, n := range h.Nodes() {
		n.AddVhost(t, vhost)
	}
	return vhost
}

func mgmt(t *testing.T, n *rabbitharness.Node) *rabbithole.Client {
	t.Helper()
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	rh.SetTimeout(10 * time.Second)
	return rh
}

// amqpURL is node n's AMQP URI in vhost.
func amqpURL(n *rabbitharness.Node, vhost string) string {
	return "amqp://" + rabbitharness.User + ":" + rabbitharness.Password + "@" + n.AMQPAddr() + "/" + vhost
}

// testSite places a test's site on a node.
type testSite struct {
	name string
	node *rabbitharness.Node
	// managementURL overrides the node's management API (a fault
	// injecting proxy).
	managementURL string
	luffyURL      string
}

// sitesFile writes a sites file for the test's sites in vhost with the
// given delays (pairs "a-b": ms) and parses it.
func sitesFile(t *testing.T, vhost string, sites []testSite, delays map[string]float64) *Sites {
	t.Helper()
	var b strings.Builder
	b.WriteString("sites:\n")
	for _, s := range sites {
		mgmtURL := s.node.ManagementURL()
		if s.managementURL != "" {
			mgmtURL = s.managementURL
		}
		fmt.Fprintf(&b, "  - name: %s\n    amqp_url: %s\n    management_url: %s\n", s.name, amqpURL(s.node, vhost), mgmtURL)
		if s.luffyURL != "" {
			fmt.Fprintf(&b, "    luffymq_url: %s\n", s.luffyURL)
		}
	}
	b.WriteString("delays_ms:\n")
	for pair, ms := range delays {
		a, c, _ := strings.Cut(pair, "-")
		fmt.Fprintf(&b, "  %s: {%s: %v}\n", a, c, ms)
	}
	ss, err := ParseSites(t.Name()+".yaml", []byte(b.String()))
	require.NoError(t, err, b.String())
	return ss
}

// testFirstWindow is how long tests' first rounds measure.
const testFirstWindow = 300 * time.Millisecond

// newController returns a controller over sites whose logs go to logs
// (and to stderr with -v), without damping unless options set it.
func newController(t *testing.T, sites *Sites, lambda float64, logs io.Writer, options ...func(*Config)) *Controller {
	t.Helper()
	w := logs
	if testing.Verbose() {
		w = io.MultiWriter(logs, os.Stderr)
	}
	cfg := Config{Sites: sites, Lambda: lambda, Period: time.Minute, RequestTimeout: 5 * time.Second, FirstWindow: testFirstWindow,
		Logger: slog.New(slog.NewTextHandler(w, nil)).With("test", t.Name())}
	for _, o := range options {
		o(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// amqpChannel opens a channel on node n in vhost, closed when t ends.
func amqpChannel(t *testing.T, n *rabbitharness.Node, vhost string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURL(n, vhost))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	return ch
}

// declareExchange declares topic exchange x with a queue bound to it for
// every key ("local.<x>").
func declareExchange(t *testing.T, ch *amqp.Channel, x string) {
	t.Helper()
	require.NoError(t, ch.ExchangeDeclare(x, amqp.ExchangeTopic, true, false, false, false, nil))
	q, err := ch.QueueDeclare("local."+x, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "#", x, false, nil))
}

// publishN publishes n confirmed messages of size bytes to exchange x.
func publishN(t *testing.T, ch *amqp.Channel, x string, n, size int) {
	t.Helper()
	body := make([]byte, size)
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), x, "k", false, false, amqp.Publishing{Body: body})
		require.NoError(t, err)
		require.True(t, dc.Wait())
	}
}

// exchangeCounts reads publish_in and publish_out of exchange x.
func exchangeCounts(t *testing.T, n *rabbitharness.Node, vhost, x string) (in, out int) {
	t.Helper()
	info, err := mgmt(t, n).GetExchange(vhost, x)
	if err != nil {
		return -1, -1
	}
	return info.PublishStats.PublishIn, info.PublishStats.PublishOut
}

// waitExchangeCounts waits until the management API's statistics show
// exchange x with publish_in in and publish_out out (they lag by the
// statistics interval).
func waitExchangeCounts(t *testing.T, n *rabbitharness.Node, vhost, x string, in, out int) {
	t.Helper()
	require.Eventually(t, func() bool {
		gotIn, gotOut := exchangeCounts(t, n, vhost, x)
		return gotIn == in && gotOut == out
	}, 20*time.Second, 100*time.Millisecond, "%s at %s: want publish_in %d, publish_out %d; have %v", x, n.Site, in, out,
		stringer(func() string { i, o := exchangeCounts(t, n, vhost, x); return fmt.Sprint(i, " ", o) }))
}

// drainConfigs takes every message from site's configuration queue in
// vhost and decodes it as the site agent does.
func drainConfigs(t *testing.T, ch *amqp.Channel, site string) []bridge.SiteConfig {
	t.Helper()
	var out []bridge.SiteConfig
	// Declared as the site agent and the controller declare it.
	_, err := ch.QueueDeclare(bridge.ConfigQueueName(site), true, false, false, false, nil)
	require.NoError(t, err)
	for {
		d, ok, err := ch.Get(bridge.ConfigQueueName(site), true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		require.Equal(t, "application/json", d.ContentType)
		require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
		c, err := bridge.ParseSiteConfig(d.Body)
		require.NoError(t, err, string(d.Body))
		out = append(out, c)
	}
}

// stringer formats lazily.
type stringer func() string

func (s stringer) String() string { return s() }

// withDamping turns on the damping luffy-controller has by default.
func withDamping(c *Config) { c.RateHalfLife, c.MoveMargin = DefaultRateHalfLife, DefaultMoveMargin }
