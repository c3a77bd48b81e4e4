package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/broker/dashboard"
	"github.com/luffymq/luffymq/clientsdk"
)

// screenshotEnv names the file the browser test writes the README
// screenshot to, when set:
//
//	LUFFYMQ_SCREENSHOT=$PWD/docs/dashboard.png go test ./broker/dashboard -run TestDashboardInBrowser
const screenshotEnv = "LUFFYMQ_SCREENSHOT"

const chromiumPath = "/usr/bin/chromium"

// startBroker starts a broker on free loopback ports; it is closed when the
// test ends (closing twice is harmless).
func startBroker(t *testing.T) *broker.Broker { return startBrokerWith(t, nil) }

// startBrokerWith is startBroker with a config that mutate may change.
func startBrokerWith(t *testing.T, mutate func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		MQTTListen:     "127.0.0.1:0",
		HTTPListen:     "127.0.0.1:0",
		ReportInterval: 500 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := broker.New(cfg)
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
		for _, api := range []string{dashboard.EventsPath, dashboard.GroupsPath, dashboard.OverviewPath, dashboard.RejectedReportsPath, dashboard.BridgePath} {
			require.Contains(t, string(body), `"`+api+`"`, path)
			resp, err := http.Get(base + api)
			require.NoError(t, err, api)
			resp.Body.Close() // the event stream too: only its status is read
			require.Equal(t, http.StatusOK, resp.StatusCode, "the page's endpoint %s is served", api)
		}
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

// requireChromium fails the test in CI, and skips it elsewhere, when
// Debian's chromium is missing.
func requireChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (install Debian's chromium: scripts/ensure-deps.sh): %v", chromiumPath, err)
		}
		t.Skipf("%s is missing; install Debian's chromium to run this test", chromiumPath)
	}
}

// startChromium starts headless Chromium; it exits when the test ends.
func startChromium(t *testing.T) context.Context {
	t.Helper()
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
		chromedp.WindowSize(1280, 800),
	)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser), "starting %s", chromiumPath) // no timeout: it would end the browser
	return browser
}

// tab is one browser tab with a record of its console.
type tab struct {
	t   *testing.T
	ctx context.Context // bounded: the tab's actions time out

	mu      sync.Mutex
	console []chromedp.ConsoleMessage
}

// openTab opens a tab in browser, recording its console until the test
// ends; setup runs before anything is loaded in it.
func openTab(t *testing.T, browser context.Context, setup ...chromedp.Action[chromedp.Void]) *tab {
	t.Helper()
	tabCtx, cancelTab := chromedp.NewContext(browser)
	require.NoError(t, chromedp.Do(tabCtx, setup...))
	tb := &tab{t: t}
	listen, stopListening := context.WithCancel(tabCtx)
	messages := chromedp.Console(listen)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m, err := range messages {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.console = append(tb.console, m)
			tb.mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(tabCtx, 90*time.Second)
	tb.ctx = ctx
	t.Cleanup(func() { stopListening(); wg.Wait(); cancel(); cancelTab() })
	return tb
}

// problems returns the console's errors and exceptions, leaving out those
// allowed says are expected.
func (tb *tab) problems(allowed func(chromedp.ConsoleMessage) bool) []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []string
	for _, m := range tb.console {
		if (m.Type == chromedp.ConsoleError || m.IsException()) && (allowed == nil || !allowed(m)) {
			out = append(out, m.String()+" ("+m.URL+")")
		}
	}
	return out
}

func (tb *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	require.NoError(tb.t, chromedp.Do(tb.ctx, actions...))
}

func (tb *tab) text(sel string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(tb.t, err, "text of %s", sel)
	return strings.TrimSpace(s)
}

func (tb *tab) eval(expr string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](expr))
	require.NoError(tb.t, err, "evaluating %s", expr)
	return s
}

// waitFor polls the JavaScript condition until it is true.
func (tb *tab) waitFor(cond string, within time.Duration, what string) {
	tb.t.Helper()
	require.NoError(tb.t, chromedp.Do(tb.ctx,
		chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(within)),
	), what)
}

// cellJS is the JavaScript expression for a member's cell.
func cellJS(id, field string) string {
	return fmt.Sprintf(`document.querySelector('tr[data-client-id="%s"] td[data-field="%s"]')`, id, field)
}

// workload runs two SDK workers of different speed in one shared group, a
// publisher at about 125 msgs/s, and one malformed load report.
type workload struct {
	stop func()
}

const (
	sharedGroup  = "work"
	sharedFilter = "$share/" + sharedGroup + "/jobs"
)

func startWorkload(t *testing.T, b *broker.Broker) *workload {
	t.Helper()
	url := "mqtt://" + b.MQTTAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var subs []*clientsdk.Subscriber
	for _, w := range []struct {
		id      string
		process time.Duration
	}{{"worker-fast", 5 * time.Millisecond}, {"worker-slow", 20 * time.Millisecond}} {
		process := w.process
		sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
			ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{url}, ClientID: w.id,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
			Group:   sharedGroup,
			Filters: []string{"jobs"},
			QoS:     1,
			Handler: func(ctx context.Context, _ *clientsdk.Message) error {
				select {
				case <-time.After(process):
				case <-ctx.Done():
				}
				return nil
			},
		})
		require.NoError(t, err)
		require.NoError(t, sub.Start(ctx), "worker %s", w.id)
		subs = append(subs, sub)
	}
	pub, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{ConnectionConfig: clientsdk.ConnectionConfig{
		Brokers: []string{url}, ClientID: "sensor", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	require.NoError(t, err)
	require.NoError(t, pub.Start(ctx))

	bad := connect(t, b.MQTTAddr(), "bad-reporter")
	_, err = bad.Publish(ctx, &paho.Publish{Topic: "$luffy/load", QoS: 0, Payload: []byte(`{"msgsInQueue":"three"}`)})
	require.NoError(t, err)

	load, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(8 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-load.Done():
				return
			case <-tick.C:
				_ = pub.Publish(load, "jobs", []byte(fmt.Sprintf("job %d", i)), clientsdk.PublishOptions{QoS: 1})
			}
		}
	}()
	var once sync.Once
	w := &workload{stop: func() {
		once.Do(func() {
			stopLoad()
			wg.Wait()
			closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = pub.Close(closeCtx)
			for _, s := range subs {
				_ = s.Close(closeCtx)
			}
		})
	}}
	t.Cleanup(w.stop)
	return w
}

// TestDashboardInBrowser drives the page in headless Chromium against a
// real broker with two SDK workers of different speed and a publisher:
// the empty state, the live view over Server-Sent Events (numbers update
// without reload, charts, rejected reports, the keyboard), the polling
// fallback when /api/v1/events is blocked, and the error banner once the
// broker is gone; no console errors on the way.
func TestDashboardInBrowser(t *testing.T) {
	requireChromium(t)
	// A small outbox, so that a client that never reads loses messages
	// after a few hundred KiB (the workers' messages are small).
	b := startBrokerWith(t, func(c *broker.Config) { c.MaxQueuedBytes = 64 << 10 })
	pageURL := "http://" + b.HTTPAddr() + "/dashboard"
	browser := startChromium(t)

	// Empty state, before anyone subscribes, already over the stream.
	live := openTab(t, browser)
	live.do(
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(pageURL),
		chromedp.WaitVisible(chromedp.CSS("#empty")),
	)
	require.Equal(t, "No shared groups yet: subscribe to $share/<group>/<filter>", live.text("#empty"))
	live.waitFor(`document.getElementById("status").dataset.mode === "sse"`, 5*time.Second, "the page follows the event stream")
	live.eval(`(window.loadedOnce = "yes")`) // a reload would lose it

	load := startWorkload(t, b)

	// The page picks the group up by itself: both workers, their rates,
	// the fast one's larger share, reports and service estimates.
	ready := fmt.Sprintf(`(() => {
		const fr = %s, fs = %s, ss = %s, fsv = %s, ssv = %s;
		return !!(fr && fs && ss && fsv && ssv) && fr.textContent !== "—" &&
			Number(fs.dataset.share) > Number(ss.dataset.share) &&
			fsv.textContent !== "—" && ssv.textContent !== "—";
	})()`, cellJS("worker-fast", "rate"), cellJS("worker-fast", "share"), cellJS("worker-slow", "share"),
		cellJS("worker-fast", "service"), cellJS("worker-slow", "service"))
	live.waitFor(ready, 20*time.Second, "the table shows both workers with their reports")
	groupsText := live.text("#groups")
	for _, want := range []string{sharedFilter, "strategy adaptive", "stale after 1.50 s", "worker-fast", "worker-slow", "online", "Pending", "Predicted wait", "Selections/s"} {
		require.Contains(t, groupsText, want)
	}
	overviewText := live.text("#overview")
	for _, want := range []string{"Uptime", "Connections", "Msgs/s in", "Msgs/s out", "Dropped", "adaptive", "500 ms"} {
		require.Contains(t, overviewText, want)
	}

	// The numbers move without a reload, and not by polling.
	uptimeJS := `document.querySelector('#overview dd[data-field="uptime"]').textContent`
	selectionsJS := cellJS("worker-fast", "selections") + ".textContent"
	uptime, selections := live.eval(uptimeJS), live.eval(selectionsJS)
	live.waitFor(fmt.Sprintf(`%s !== %q && %s !== %q`, uptimeJS, uptime, selectionsJS, selections),
		5*time.Second, "selections and uptime change on the page")
	require.Equal(t, "yes", live.eval(`String(window.loadedOnce)`), "the page was not reloaded")
	require.Equal(t, "sse", live.eval(`document.getElementById("status").dataset.mode`))
	require.Equal(t, "0", live.eval(`String(performance.getEntriesByType("resource").filter(e => /\/api\/v1\/(groups|overview)$/.test(new URL(e.name).pathname)).length)`),
		"with the stream open the page does not poll")

	// Charts: in/out, and one line per worker for selections and waits.
	live.waitFor(`document.querySelectorAll("#chart-msgs polyline").length >= 2 &&
		document.querySelectorAll("#chart-selections polyline").length >= 2 &&
		document.querySelectorAll("#chart-wait polyline").length >= 2`, 10*time.Second, "charts drawn")
	require.Contains(t, live.eval(`document.querySelector("#chart-selections svg").getAttribute("aria-label")`), "worker-fast")
	require.Contains(t, live.text("#chart-selections"), "worker-slow")

	// The malformed report, with its sender and reason.
	live.waitFor(`document.querySelector("#rejections-table tbody tr") !== null`, 5*time.Second, "rejected report listed")
	rejected := live.text("#rejections-table")
	require.Contains(t, rejected, "bad-reporter")
	require.Contains(t, rejected, "publish")
	require.Contains(t, rejected, "msgsInQueue")

	// A subscriber that never reads its socket loses QoS 0 messages; the
	// page names it, with the count and the reason.
	require.Equal(t, "None: no connected client has lost a message.", live.text("#drops-none"))
	loseQoS0Messages(t, b, "never-reads")
	lostJS := `document.querySelector('#drops-table tr[data-client-id="never-reads"] td[data-field="qos0_outbox_full"]')`
	live.waitFor(lostJS+` !== null && `+lostJS+`.textContent !== "0"`, 10*time.Second, "the client that lost messages is listed")
	require.Equal(t, "true", live.eval(`String(document.getElementById("drops-none").hidden)`))
	require.Contains(t, live.text("#drops"), "QoS 0, outbox full")

	// The keyboard: the chart range is a focusable button toggled by Enter.
	live.do(chromedp.Focus(chromedp.CSS(`.range button[data-minutes="1"]`)), chromedp.KeyEvent("\r"))
	require.Equal(t, "true", live.eval(`document.querySelector('.range button[data-minutes="1"]').getAttribute("aria-pressed")`))
	require.Contains(t, live.eval(`document.querySelector("#chart-msgs svg").getAttribute("aria-label")`), "last 1 min")
	require.Equal(t, "BUTTON", live.eval(`document.activeElement.tagName`))

	if path := os.Getenv(screenshotEnv); path != "" {
		time.Sleep(25 * time.Second) // let the charts fill
		live.do(chromedp.Blur(chromedp.CSS(`.range button[data-minutes="1"]`)))
		shot, err := chromedp.Run(live.ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		img, err := png.Decode(bytes.NewReader(shot))
		require.NoError(t, err, "screenshot is a PNG")
		require.GreaterOrEqual(t, img.Bounds().Dx(), 1000)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, shot, 0o644))
		t.Logf("screenshot: %s (%d bytes)", path, len(shot))
	}
	require.Empty(t, live.problems(nil), "no console errors on the live page")

	// The fallback: with /api/v1/events blocked the page polls, and its
	// numbers still move.
	blocked := func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, network.SetBlockedURLs, network.SetBlockedURLsParams{
			URLPatterns: []*network.BlockPattern{{URLPattern: "http://" + b.HTTPAddr() + dashboard.EventsPath, Block: true}},
		})
		return err
	}
	polling := openTab(t, browser, chromedp.Func(blocked))
	polling.do(chromedp.EmulateViewport(1280, 800), chromedp.Navigate(pageURL))
	polling.waitFor(ready, 20*time.Second, "the polling page shows both workers")
	require.Equal(t, "polling", polling.eval(`document.getElementById("status").dataset.mode`))
	first := polling.eval(cellJS("worker-fast", "selections") + ".textContent")
	polling.waitFor(fmt.Sprintf(`%s.textContent !== %q`, cellJS("worker-fast", "selections"), first), 5*time.Second,
		"the polled numbers change")
	require.Contains(t, polling.text("#rejections-table"), "bad-reporter", "rejections are polled too")
	polling.waitFor(`document.querySelectorAll("#chart-msgs polyline").length >= 2`, 5*time.Second, "charts drawn from polls")
	require.Empty(t, polling.problems(func(m chromedp.ConsoleMessage) bool {
		return m.Type == chromedp.ConsoleError && m.Source == "network" && strings.Contains(m.URL, dashboard.EventsPath)
	}), "no console errors but the blocked event stream")

	// The broker goes away: the live page says so.
	load.stop()
	require.NoError(t, b.Close())
	live.do(chromedp.WaitVisible(chromedp.ID("error-banner")))
	bannerText := live.text("#error-banner")
	require.Contains(t, bannerText, "Cannot reach the broker API")
	require.Contains(t, bannerText, "GET "+dashboard.GroupsPath+" failed")
}

// TestDashboardShowsBridge: with the bridge on (its RabbitMQ not
// reachable), the page shows the site, that it is not connected, the
// exported exchange, that federation links are not known without the
// management API, and the exported group's work-queue row, routing
// columns included.
func TestDashboardShowsBridge(t *testing.T) {
	requireChromium(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String() // nothing listens there once closed
	require.NoError(t, ln.Close())
	b := startBrokerWith(t, func(c *broker.Config) {
		c.AMQPURL = "amqp://guest:guest@" + closed + "/"
		c.Site = "berlin"
		c.Exports = []string{"sensors/#"}
		c.ExportGroups = []string{"$share/jobs/jobs/#"}
		c.AMQPManagementURL = "http://" + closed
	})
	page := openTab(t, startChromium(t))
	page.do(chromedp.Navigate("http://"+b.HTTPAddr()+"/"), chromedp.WaitVisible(chromedp.ID("bridge")))
	text := page.text("#bridge")
	for _, want := range []string{"Site bridge", "berlin", "RabbitMQ unreachable", "sensors/#", "pubsub.sensors",
		"Federation links", "Work queues", "Routed to other sites", "Fresh site states", "Asking for states"} {
		require.Contains(t, text, want)
	}
	// The work-queue table is the panel's last part; its one row is the
	// group's, not asking for states: RabbitMQ is unreachable.
	require.Equal(t, "jobs", page.text("#bridge-body > div:last-child tbody th"))
	require.Equal(t, "no", page.text("#bridge-body > div:last-child tbody td:last-child"))
	require.Empty(t, page.problems(nil), "no console errors")
}

// loseQoS0Messages connects clientID as a QoS 0 subscriber of
// "drops/t" that never reads its socket after SUBACK, then publishes
// 1 500 messages of 8 KiB there: more than its socket buffers and b's
// outbox hold, so the broker drops some for it.
func loseQoS0Messages(t *testing.T, b *broker.Broker, clientID string) {
	t.Helper()
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	t.Cleanup(func() { _ = conn.Close() })
	reader := &stopReading{Conn: conn, closed: make(chan struct{})}
	t.Cleanup(func() { _ = reader.Close() })
	c := paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: reader})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 0, CleanStart: true})
	require.NoError(t, err)
	_, err = c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "drops/t", QoS: 0}}})
	require.NoError(t, err)
	reader.stopped.Store(true)

	pub := connect(t, b.MQTTAddr(), clientID+"-publisher")
	payload := make([]byte, 8<<10)
	for range 1500 {
		_, err := pub.Publish(ctx, &paho.Publish{Topic: "drops/t", QoS: 0, Payload: payload})
		require.NoError(t, err)
	}
}

// stopReading is a connection whose reads block, once stopped is set,
// until it is closed: a client that stops reading its socket.
type stopReading struct {
	net.Conn
	stopped   atomic.Bool
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *stopReading) Read(p []byte) (int, error) {
	if s.stopped.Load() {
		<-s.closed
		return 0, net.ErrClosed
	}
	return s.Conn.Read(p)
}

func (s *stopReading) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return s.Conn.Close()
}
