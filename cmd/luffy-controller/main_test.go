package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/controller"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sites.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// TestControllerCommandExitCodes checks what the command prints and
// returns for help, bad flags, a bad sites file, and a --once round whose
// only site cannot be read.
func TestControllerCommandExitCodes(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-algorithm")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{}, "--sites FILE is required"},
		{[]string{"--sites", writeFile(t, "sites:\n  - name: a\n    amqp_url: amqp://h/\n")}, "sites.yaml:2: site \"a\": management_url: missing"},
		{[]string{"--sites", filepath.Join("..", "..", "examples", "sites.yaml"), "--algorithm", "best"}, `algorithm "best"`},
	} {
		out.Reset()
		errOut.Reset()
		require.Equal(t, 2, run(tt.args, &out, &errOut), "%v", tt.args)
		lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
		last := lines[len(lines)-1]
		require.True(t, strings.HasPrefix(last, "luffy-controller: "), "%q", last)
		require.Contains(t, last, tt.want, "the error is one line, last")
		require.Empty(t, out.String())
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	sites := writeFile(t, fmt.Sprintf("sites:\n  - name: a\n    amqp_url: amqp://127.0.0.1:1/\n    management_url: %s\n", down.URL))
	out.Reset()
	errOut.Reset()
	require.Equal(t, 1, run([]string{"--sites", sites, "--once", "--first-window", "10ms"}, &out, &errOut))
	require.Contains(t, errOut.String(), "site a unreachable (management API)")
	var st controller.Status
	require.NoError(t, json.Unmarshal(out.Bytes(), &st), out.String())
	require.Equal(t, uint64(1), st.Rounds)
	require.False(t, *st.Sites[0].Management.Reachable)
}

// TestControllerCommandOnce runs one --once round over two sites held by
// one real RabbitMQ node (a virtual host each): the exchange both have is
// placed, each site's configuration queue gets its configuration, the
// status goes to stdout, and the command exits 0.
func TestControllerCommandOnce(t *testing.T) {
	h := rabbitharness.StartT(t, rabbitharness.Config{Sites: []string{"berlin"}})
	n := h.Node("berlin")
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	urls := map[string]string{}
	var file strings.Builder
	file.WriteString("sites:\n")
	for _, site := range []string{"east", "west"} {
		vhost := site + "-" + hex.EncodeToString(b)
		n.AddVhost(t, vhost)
		urls[site] = "amqp://guest:guest@" + n.AMQPAddr() + "/" + vhost
		conn, err := amqp.Dial(urls[site])
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.ExchangeDeclare("pubsub.cmd", amqp.ExchangeTopic, true, false, false, false, nil))
		fmt.Fprintf(&file, "  - name: %s\n    amqp_url: %s\n    management_url: %s\n", site, urls[site], n.ManagementURL())
	}
	file.WriteString("delays_ms:\n  east: {west: 40}\n")

	var out, errOut bytes.Buffer
	code := run([]string{"--sites", writeFile(t, file.String()), "--once", "--first-window", "200ms", "--lambda", "5"}, &out, &errOut)
	require.Equal(t, 0, code, "stderr: %s", errOut.String())
	var st controller.Status
	require.NoError(t, json.Unmarshal(out.Bytes(), &st), out.String())
	require.Equal(t, 5.0, st.Lambda)
	require.Equal(t, "improved", st.Algorithm)
	require.Contains(t, []string{"east", "west"}, st.Plan["pubsub.cmd"])
	require.Equal(t, []string{"east", "west"}, st.LastRound.Published)
	require.Contains(t, errOut.String(), "configuration published")

	for site, other := range map[string]string{"east": "west", "west": "east"} {
		conn, err := amqp.Dial(urls[site])
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		d, ok, err := ch.Get(bridge.ConfigQueueName(site), true)
		require.NoError(t, err)
		require.True(t, ok, "%s got its configuration", site)
		cfg, err := bridge.ParseSiteConfig(d.Body)
		require.NoError(t, err)
		require.True(t, cfg.Equal(bridge.SiteConfig{"pubsub.cmd": {urls[other]}}), "%s: %v", site, cfg)
	}
}
