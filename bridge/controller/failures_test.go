package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// TestControllerUnreachableAPIsLogOnce points a site at fake HTTP servers
// that fail (a management API answering 503, a luffymq API answering bad
// JSON): each round reports the failures, the status and metrics show them,
// and each API logs one line when it fails and one when it is back, not one
// per round.
func TestControllerUnreachableAPIsLogOnce(t *testing.T) {
	var mgmtDown, luffyBad atomic.Bool
	mgmtDown.Store(true)
	luffyBad.Store(true)
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mgmtDown.Load() {
			http.Error(w, "node down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasPrefix(r.URL.Path, "/api/exchanges/"):
			fmt.Fprint(w, `[{"name":"pubsub.t","type":"topic","message_stats":{"publish_in":5,"publish_in_details":{"rate":1.5},"publish_out":5,"publish_out_details":{"rate":1.5}}}]`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	defer mgmt.Close()
	var luffyAuth atomic.Value
	luffyAuth.Store("")
	luffy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		luffyAuth.Store(r.Header.Get("Authorization"))
		if luffyBad.Load() {
			fmt.Fprint(w, `{"bridge": [not json`)
			return
		}
		switch r.URL.Path {
		case "/api/v1/bridge":
			fmt.Fprint(w, `{"bridge":{"site":"a","connected":true,"work_queues":[{"group":"jobs","max_length":3000,"weight":2990,"depth":10}]}}`)
		case "/api/v1/groups":
			fmt.Fprint(w, `{"groups":[{"filter":"$share/jobs/jobs/#","members":[{"client_id":"w1","online":true},{"client_id":"w2","online":false}]},{"filter":"$share/other/x","members":[{"client_id":"w3","online":true}]}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer luffy.Close()

	file := fmt.Sprintf(`
sites:
  - name: a
    amqp_url: amqp://guest:guest@127.0.0.1:1/%%2F
    management_url: %s
    luffymq_url: %s
    luffymq_token: 0123456789abcdef
`, mgmt.URL, luffy.URL)
	sites, err := ParseSites("fake.yaml", []byte(file))
	require.NoError(t, err)
	logs := &testenv.LockedBuffer{}
	c, err := New(Config{Sites: sites, FirstWindow: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	count := func(s string) int { return strings.Count(logs.String(), s) }

	for range 3 {
		res, err := c.Round(context.Background())
		require.Error(t, err)
		require.Len(t, res.Errors, 2, "%v", res.Errors)
		require.Contains(t, err.Error(), "site a: management API")
		require.Contains(t, err.Error(), "503")
		require.Contains(t, err.Error(), "site a: luffymq API")
		require.Empty(t, res.Published, "nothing is sent to a site that cannot be read")
	}
	require.Equal(t, 1, count("site a unreachable (management API); keeping its last plan"), logs.String())
	require.Equal(t, 1, count("site a unreachable (luffymq API)"), logs.String())
	require.Equal(t, "Bearer 0123456789abcdef", luffyAuth.Load(), "the luffymq token is sent")

	st := c.Status()
	require.Equal(t, uint64(3), st.Rounds)
	require.Len(t, st.Sites, 1)
	require.False(t, *st.Sites[0].Management.Reachable)
	require.Equal(t, uint64(1), st.Sites[0].Management.Failures)
	require.Contains(t, st.Sites[0].Management.Error, "503")
	require.False(t, *st.Sites[0].LuffyMQ.Reachable)
	require.Contains(t, st.Sites[0].LuffyMQ.Error, "invalid character")
	require.Nil(t, st.Sites[0].AMQP.Reachable, "never used")
	require.False(t, st.Sites[0].Stale, "never read: nothing stale stands in")
	metrics := scrape(t, c.Handler(), "")
	require.Contains(t, metrics, `luffy_controller_site_reachable{api="management",site="a"} 0`)
	require.Contains(t, metrics, `luffy_controller_site_unreachable_total{api="management",site="a"} 1`)
	require.Contains(t, metrics, `luffy_controller_site_unreachable_total{api="luffymq",site="a"} 1`)
	require.Contains(t, metrics, `luffy_controller_rounds_total 3`)

	mgmtDown.Store(false)
	luffyBad.Store(false)
	res, err := c.Round(context.Background())
	require.NoError(t, err, "one site, no global exchange: nothing to publish")
	require.Empty(t, res.Errors)
	require.Equal(t, 1, count("site a reachable again (management API)"), logs.String())
	require.Equal(t, 1, count("site a reachable again (luffymq API)"), logs.String())
	st = c.Status()
	require.True(t, *st.Sites[0].Management.Reachable)
	require.Equal(t, []GroupCapacity{{Group: "jobs", OnlineMembers: 1, MaxLength: 3000, Weight: 2990, Depth: 10}}, st.Sites[0].Capacity)
	require.True(t, st.Sites[0].LuffyMQConnected)
	require.Empty(t, st.Plan, "an exchange at one site is not global")
	require.InDelta(t, 0.05, st.Sites[0].PeriodSeconds, 0.04, "first read: measured over the first window")

	mgmtDown.Store(true)
	_, err = c.Round(context.Background())
	require.Error(t, err)
	require.Equal(t, 2, count("site a unreachable (management API)"))
	st = c.Status()
	require.True(t, st.Sites[0].Stale, "its last read stands in")
	require.Equal(t, uint64(2), st.Sites[0].Management.Failures)
}

// scrape returns the body of GET path on h (/metrics by default).
func scrape(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	if path == "" {
		path = "/metrics"
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

func TestControllerHTTPToken(t *testing.T) {
	sites, err := ParseSites("t.yaml", []byte("sites:\n  - name: a\n    amqp_url: amqp://127.0.0.1:1/\n    management_url: http://127.0.0.1:1\n"))
	require.NoError(t, err)
	c, err := New(Config{Sites: sites, HTTPToken: "0123456789abcdef", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	for _, auth := range []string{"", "Bearer wrong-token-0000000", "0123456789abcdef"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/status", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "auth %q", auth)
	}
	for _, path := range []string{"/api/v1/status", "/metrics"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer 0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
}

// TestControllerRunLoop runs the controller as the command does: the HTTP
// server comes up, a round runs every period, and cancelling stops it.
func TestControllerRunLoop(t *testing.T) {
	var reads atomic.Int64
	mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/exchanges/") {
			reads.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `[]`)
	}))
	defer mgmt.Close()
	sites, err := ParseSites("run.yaml", []byte(fmt.Sprintf("sites:\n  - name: a\n    amqp_url: amqp://127.0.0.1:1/\n    management_url: %s\n", mgmt.URL)))
	require.NoError(t, err)
	c, err := New(Config{Sites: sites, Period: time.Second, FirstWindow: 10 * time.Millisecond, HTTPListen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool { return c.HTTPAddr() != "" }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return c.Status().Rounds >= 3 }, 10*time.Second, 50*time.Millisecond)
	resp, err := http.Get("http://" + c.HTTPAddr() + "/api/v1/status")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	require.GreaterOrEqual(t, reads.Load(), int64(4), "the first round reads twice (first window), then once a round")
	_, err = http.Get("http://" + c.HTTPAddr() + "/metrics")
	require.Error(t, err, "the HTTP server stops with Run")
}
