package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/broker/dashboard"
)

// update rewrites the README screenshot:
//
//	go test ./broker/dashboard -run TestDashboardInBrowser -update
var update = flag.Bool("update", false, "rewrite testdata/dashboard.png from the browser test")

const chromiumPath = "/usr/bin/chromium"

// startBroker starts a broker on free loopback ports; it is closed when the
// test ends (closing twice is harmless).
func startBroker(t *testing.T) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{
		MQTTListen:     "127.0.0.1:0",
		HTTPListen:     "127.0.0.1:0",
		ReportInterval: 500 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// connect opens an MQTT v5 session for clientID.
func connect(t *testing.T, addr, clientID string) *paho.Client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	c := paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return c
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

func TestBrokerServesDashboard(t *testing.T) {
	b := startBroker(t)
	base := "http://" + b.HTTPAddr()

	for _, path := range []string{"/", "/dashboard"} {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), path)
		require.Contains(t, string(body), dashboard.GroupsPath, path)
	}

	resp, err := http.Get(base + "/no-such-page")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "/ must not catch every path")

	var o broker.OverviewResponse
	getJSON(t, base+dashboard.OverviewPath, &o)
	require.Equal(t, "adaptive", o.Strategy)
	require.Equal(t, 500.0, o.ReportIntervalMs)
	require.Equal(t, 1500.0, o.StaleAfterMs)
	require.GreaterOrEqual(t, o.UptimeSeconds, int64(0))

	c := connect(t, b.MQTTAddr(), "reporter")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Publish(ctx, &paho.Publish{Topic: "$luffy/load", QoS: 1, Payload: []byte(`{"msgsInQueue":1,"processingTimePerMsg":5}`)})
	require.NoError(t, err)
	_, err = c.Publish(ctx, &paho.Publish{Topic: "$luffy/load", QoS: 0, Payload: []byte(`{"msgsInQueue":"x"}`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		getJSON(t, base+dashboard.OverviewPath, &o)
		return o.ReportsAccepted == 1 && o.ReportsMalformed == 1
	}, 5*time.Second, 20*time.Millisecond, "overview counts the reports: %+v", o)
	require.Equal(t, int64(1), o.ClientsConnected)
	require.GreaterOrEqual(t, o.MessagesReceived, int64(2))
}

// member is a simulated shared-group member: the fixed load it reports.
type member struct {
	id      string
	pending int
	procMs  float64
}

// TestDashboardInBrowser drives the page in headless Chromium against a real
// broker: empty state, two members of different speed, the error banner
// once the broker is gone.
func TestDashboardInBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (install Debian's chromium: scripts/ensure-deps.sh): %v", chromiumPath, err)
		}
		t.Skipf("%s is missing; install Debian's chromium to run this test", chromiumPath)
	}
	b := startBroker(t)
	pageURL := "http://" + b.HTTPAddr() + "/dashboard"

	profile := t.TempDir() // registered first, so removed after Chromium has exited
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1200, 700),
	)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "starting %s", chromiumPath) // no timeout: it would end the browser
	ctx, cancel := context.WithTimeout(browser, 20*time.Second)
	t.Cleanup(cancel)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "text of %s", sel)
		return strings.TrimSpace(s)
	}

	// Empty state, before anyone subscribes.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.EmulateViewport(1200, 440),
		chromedp.Navigate(pageURL),
		chromedp.WaitVisible(chromedp.CSS("#empty")),
	))
	require.Equal(t, "No shared groups yet: subscribe to $share/<group>/<filter>", text("#empty"))

	// Two members of different speed, reporting like SDK workers, and a
	// steady stream of jobs.
	const filter = "$share/work/jobs"
	members := []member{{"worker-fast", 1, 10}, {"worker-slow", 3, 40}}
	load, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop := func() { stopLoad(); wg.Wait() }
	t.Cleanup(stop)
	for _, m := range members {
		c := connect(t, b.MQTTAddr(), m.id)
		subCtx, subCancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Subscribe(subCtx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter}}})
		subCancel()
		require.NoError(t, err)
		payload := []byte(fmt.Sprintf(`{"msgsInQueue":%d,"processingTimePerMsg":%g}`, m.pending, m.procMs))
		report := func() error {
			_, err := c.Publish(load, &paho.Publish{Topic: "$luffy/load", QoS: 1, Payload: payload})
			return err
		}
		require.NoError(t, report())
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-load.Done():
					return
				case <-tick.C:
					_ = report()
				}
			}
		}()
	}
	pub := connect(t, b.MQTTAddr(), "sensor")
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-load.Done():
				return
			case <-tick.C:
				_, _ = pub.Publish(load, &paho.Publish{Topic: "jobs", Payload: []byte(fmt.Sprintf("job %d", i))})
			}
		}
	}()

	// The page picks the group up by itself: both members, their reported
	// pending counts and processing times, a measured rate, and the fast
	// member's larger share.
	cell := func(id, field string) string {
		return fmt.Sprintf(`document.querySelector('tr[data-client-id="%s"] td[data-field="%s"]')`, id, field)
	}
	ready := fmt.Sprintf(`(() => {
		const fp = %s, sp = %s, fr = %s, fs = %s, ss = %s, ft = %s, st = %s;
		return !!(fp && sp && fr && fs && ss && ft && st) &&
			fp.textContent === "1" && sp.textContent === "3" &&
			ft.textContent === "10.0 ms" && st.textContent === "40.0 ms" &&
			fr.textContent !== "—" && Number(fs.dataset.share) > Number(ss.dataset.share);
	})()`, cell("worker-fast", "pending"), cell("worker-slow", "pending"), cell("worker-fast", "rate"),
		cell("worker-fast", "share"), cell("worker-slow", "share"),
		cell("worker-fast", "processing"), cell("worker-slow", "processing"))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(`tr[data-client-id="worker-slow"]`)),
		chromedp.Poll[chromedp.Void](ready, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(10*time.Second)),
	), "the table shows both members with their reports")
	groupsText := text("#groups")
	for _, want := range []string{filter, "strategy adaptive", "worker-fast", "worker-slow", "online", "Pending", "Predicted wait"} {
		require.Contains(t, groupsText, want)
	}
	require.NotContains(t, groupsText, "No shared groups yet")
	overviewText := text("#overview")
	require.Contains(t, overviewText, "adaptive")
	require.Contains(t, overviewText, "500 ms")
	bannerHidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("error-banner").hidden`))
	require.NoError(t, err)
	require.True(t, bannerHidden, "no error banner while the broker answers")

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(shot))
	require.NoError(t, err, "screenshot is a PNG")
	require.GreaterOrEqual(t, img.Bounds().Dx(), 1000)
	shotPath := filepath.Join(t.TempDir(), "dashboard.png")
	require.NoError(t, os.WriteFile(shotPath, shot, 0o644))
	t.Logf("screenshot: %s (%d bytes)", shotPath, len(shot))
	if *update {
		require.Less(t, len(shot), 200<<10, "README screenshot must stay small")
		require.NoError(t, os.WriteFile(filepath.Join("testdata", "dashboard.png"), shot, 0o644))
	}

	// The broker goes away: the page says so.
	stop()
	require.NoError(t, b.Close())
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("error-banner"))))
	bannerText := text("#error-banner")
	require.Contains(t, bannerText, "Cannot reach the broker API")
	require.Contains(t, bannerText, "GET "+dashboard.GroupsPath+" failed")
}
