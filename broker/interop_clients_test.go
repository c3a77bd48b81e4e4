package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/internal/testenv"
)

// Shared-group members written with other MQTT libraries and no LuffyMQ
// code, run as child processes from broker/testdata/interop.
const (
	interopDir         = "testdata/interop"
	mqttjsScript       = "mqttjs_member.js"
	pahoPyScript       = "paho_member.py"
	debianPython       = "/usr/bin/python3" // where Debian's python3-paho-mqtt is importable
	interopInstallHint = "run scripts/ensure-deps.sh (make deps)"
)

// requireInteropTool skips the test with a clear message, or fails it when
// the CI environment variable is "true", because something the interop
// members need is missing.
func requireInteropTool(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...) + "; " + interopInstallHint
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// mqttjsCommand returns the command line of an MQTT.js member, skipping or
// failing the test when node or the npm package is missing.
func mqttjsCommand(t *testing.T) []string {
	t.Helper()
	node := testenv.RequireBinary(t, "node", "nodejs")
	if _, err := os.Stat(filepath.Join(interopDir, "node_modules", "mqtt", "package.json")); err != nil {
		requireInteropTool(t, "MQTT.js is not installed in broker/%s/node_modules (%v)", interopDir, err)
	}
	return []string{node, filepath.Join(interopDir, mqttjsScript)}
}

// pahoPythonCommand returns the command line of a Python paho member,
// skipping or failing the test when Debian's Python or its paho is missing.
func pahoPythonCommand(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(debianPython); err != nil {
		requireInteropTool(t, "%s is missing (%v): install the Debian package python3-paho-mqtt", debianPython, err)
	}
	out, err := exec.Command(debianPython, "-c", "import paho.mqtt; print(paho.mqtt.__version__)").CombinedOutput()
	if err != nil {
		requireInteropTool(t, "%s cannot import paho.mqtt (%v: %s): install the Debian package python3-paho-mqtt",
			debianPython, err, strings.TrimSpace(string(out)))
	}
	t.Logf("paho-mqtt %s", strings.TrimSpace(string(out)))
	return []string{debianPython, filepath.Join(interopDir, pahoPyScript)}
}

// scriptMember is one interop member process and what it printed.
type scriptMember struct {
	id    string
	ready chan struct{}

	mu        sync.Mutex
	processed []string // payloads, in the order processed (and acknowledged)
	reports   []string // load-report payloads it published
	stderr    strings.Builder
	exited    error
	hasExited bool
}

// startScriptMember starts a member process, waits until it has subscribed
// and kills it when the test ends, even if the test fails.
func startScriptMember(t *testing.T, command []string, addr, id, group, topic string, processing, reportEvery time.Duration) *scriptMember {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	args := append(command[1:len(command):len(command)],
		"--host", host, "--port", port, "--client-id", id, "--group", group, "--topic", topic,
		"--processing-ms", fmt.Sprint(processing.Milliseconds()),
		"--report-every-ms", fmt.Sprint(reportEvery.Milliseconds()))
	cmd := exec.Command(command[0], args...)
	// The member exits when this pipe closes, so it cannot outlive a test
	// process that is itself killed.
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	m := &scriptMember{id: id, ready: make(chan struct{})}
	cmd.Stderr = lockedWriter{mu: &m.mu, w: &m.stderr}
	require.NoError(t, cmd.Start(), "starting %v", command)

	var readyOnce sync.Once
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			line := scanner.Text()
			switch kind, rest, _ := strings.Cut(line, " "); kind {
			case "ready":
				readyOnce.Do(func() { close(m.ready) })
			case "processed":
				m.mu.Lock()
				m.processed = append(m.processed, rest)
				m.mu.Unlock()
			case "report":
				m.mu.Lock()
				m.reports = append(m.reports, rest)
				m.mu.Unlock()
			}
		}
	}()
	waited := make(chan struct{})
	go func() {
		<-lines // Wait must not run before stdout is read to its end
		err := cmd.Wait()
		m.mu.Lock()
		m.exited, m.hasExited = err, true
		m.mu.Unlock()
		close(waited)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		<-waited
		if t.Failed() {
			t.Logf("%s stderr: %s", id, m.stderrText())
		}
	})

	select {
	case <-m.ready:
	case <-waited:
		t.Fatalf("%s exited before subscribing (%v): %s", id, m.exited, m.stderrText())
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not subscribe within 10 s: %s", id, m.stderrText())
	}
	return m
}

func (m *scriptMember) stderrText() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stderr.String()
}

func (m *scriptMember) processedPayloads() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.processed...)
}

// running fails the test if the member process has ended.
func (m *scriptMember) requireRunning(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	require.False(t, m.hasExited, "%s exited (%v): %s", m.id, m.exited, m.stderr.String())
}

// lockedWriter serialises writes into w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (lw lockedWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.Write(p)
}

// TestMQTTJSMembersReportLoadAndShareAGroup: two MQTT.js processes, a fast
// and a slow one, acknowledging after processing and reporting their load
// by publishing to $luffy/load, share a group fed by a Go publisher.
func TestMQTTJSMembersReportLoadAndShareAGroup(t *testing.T) {
	runInteropMembers(t, mqttjsCommand(t), "mqttjs")
}

// TestPahoPythonMembersReportLoadAndShareAGroup: the same with two Python
// paho-mqtt processes (Debian's paho 1.6).
func TestPahoPythonMembersReportLoadAndShareAGroup(t *testing.T) {
	runInteropMembers(t, pahoPythonCommand(t), "pahopy")
}

// runInteropMembers runs the interop scenario: a fast (5 ms) and a slow
// (40 ms) member of one QoS 1 group, 240 messages published at about 150/s
// (two thirds of the members' joint capacity). Every message must be
// processed exactly once, the fast member must take at least twice as many
// as the slow one, and the broker must have applied both members' reports.
func runInteropMembers(t *testing.T, command []string, prefix string) {
	if testing.Short() {
		t.Skip("timed run with child processes")
	}
	const (
		group       = "interop"
		topic       = "jobs"
		filter      = "$share/" + group + "/" + topic
		messages    = 240
		spacing     = 6 * time.Millisecond
		reportEvery = 100 * time.Millisecond
	)
	b := startBroker(t, nil)
	fastID, slowID := prefix+"-fast", prefix+"-slow"
	fast := startScriptMember(t, command, b.MQTTAddr(), fastID, group, topic, 5*time.Millisecond, reportEvery)
	slow := startScriptMember(t, command, b.MQTTAddr(), slowID, group, topic, 40*time.Millisecond, reportEvery)
	eventually(t, 5*time.Second, func() bool {
		groups := getGroups(t, b)
		f, okF := member(groups, filter, fastID)
		s, okS := member(groups, filter, slowID)
		return okF && okS && f.Reports > 0 && s.Reports > 0
	}, "both members joined the group and their first reports were applied")

	pub := connectPaho(t, b.MQTTAddr(), prefix+"-publisher", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for i := 0; i < messages; i++ {
		_, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(fmt.Sprintf("msg-%d", i))})
		require.NoError(t, err)
		time.Sleep(spacing)
	}
	eventually(t, 10*time.Second, func() bool {
		return len(fast.processedPayloads())+len(slow.processedPayloads()) >= messages
	}, "every message processed")
	// A duplicate could still be on its way: give it time to show.
	time.Sleep(3 * reportEvery)
	fast.requireRunning(t)
	slow.requireRunning(t)

	fastGot, slowGot := fast.processedPayloads(), slow.processedPayloads()
	seen := make(map[string]string, messages)
	for _, got := range []struct {
		id       string
		payloads []string
	}{{fastID, fastGot}, {slowID, slowGot}} {
		for _, p := range got.payloads {
			first, dup := seen[p]
			require.False(t, dup, "%s processed by %s and again by %s", p, first, got.id)
			seen[p] = got.id
		}
	}
	for i := 0; i < messages; i++ {
		require.Contains(t, seen, fmt.Sprintf("msg-%d", i), "message lost")
	}
	require.Len(t, seen, messages, "nothing but the published messages arrived")
	require.GreaterOrEqual(t, len(fastGot), 2*len(slowGot),
		"fast (5 ms) took %d, slow (40 ms) took %d", len(fastGot), len(slowGot))
	require.NotEmpty(t, slowGot, "the slow member took part")

	// Each member's reports are well formed in the one wire format and
	// were applied to its own state.
	groups := getGroups(t, b)
	fastStatus, ok := member(groups, filter, fastID)
	require.True(t, ok)
	slowStatus, ok := member(groups, filter, slowID)
	require.True(t, ok)
	for _, m := range []struct {
		proc   *scriptMember
		status MemberStatus
		want   time.Duration
	}{{fast, fastStatus, 5 * time.Millisecond}, {slow, slowStatus, 40 * time.Millisecond}} {
		m.proc.mu.Lock()
		reports := append([]string(nil), m.proc.reports...)
		m.proc.mu.Unlock()
		require.GreaterOrEqual(t, len(reports), 5, "%s published a report every %v", m.status.ClientID, reportEvery)
		var busiest report.Report
		for _, payload := range reports {
			r, err := report.Decode([]byte(payload))
			require.NoError(t, err, "%s report %s", m.status.ClientID, payload)
			require.Zero(t, r.Pending, "a member processing one message at a time holds none waiting")
			if r.Processed > busiest.Processed {
				busiest = r
			}
		}
		require.Positive(t, busiest.Processed, "%s reported processed messages", m.status.ClientID)
		require.GreaterOrEqual(t, busiest.ProcessingTime, m.want*9/10, "%s's measured processing time", m.status.ClientID)
		require.GreaterOrEqual(t, m.status.Reports, uint64(5), "%s: broker applied its reports", m.status.ClientID)
		require.NotNil(t, m.status.LastReportAgeMs, "%s has reported", m.status.ClientID)
		require.Positive(t, m.status.ProcessingTimeMs, "%s: the broker took its processing time from the reports", m.status.ClientID)
		require.Positive(t, m.status.Selections, "%s was selected", m.status.ClientID)
		t.Logf("%s: busiest report %s", m.status.ClientID, report.Encode(busiest))
	}
	require.Greater(t, slowStatus.ProcessingTimeMs, 2*fastStatus.ProcessingTimeMs,
		"reported processing times: fast %.1f ms, slow %.1f ms", fastStatus.ProcessingTimeMs, slowStatus.ProcessingTimeMs)
	require.Greater(t, slowStatus.ServiceTimeMs, 2*fastStatus.ServiceTimeMs,
		"service time estimates: fast %.1f ms, slow %.1f ms", fastStatus.ServiceTimeMs, slowStatus.ServiceTimeMs)
	reports := &b.Selection().Reports
	require.Zero(t, reports.Malformed[hooks.ViaPublish].Load(), "no report was malformed")
	require.GreaterOrEqual(t, reports.Accepted[hooks.ViaPublish].Load(), fastStatus.Reports+slowStatus.Reports,
		"reports arrived as publishes to %s", report.LoadTopic)
	t.Logf("fast: %d messages, %d reports, service estimate %.1f ms; slow: %d messages, %d reports, service estimate %.1f ms",
		len(fastGot), fastStatus.Reports, fastStatus.ServiceTimeMs, len(slowGot), slowStatus.Reports, slowStatus.ServiceTimeMs)
}

// reportKeysLine matches the line of an interop script that names the
// load-report keys, and reportKeyPair one role: key pair in it.
var (
	reportKeysLine = regexp.MustCompile(`(?m)^(?:const )?REPORT_KEYS = \{(.*)\};?$`)
	reportKeyPair  = regexp.MustCompile(`["']?(\w+)["']?\s*:\s*["'](\w+)["']`)
	loadTopicLine  = regexp.MustCompile(`(?m)^(?:const )?LOAD_TOPIC = ["']([^"']+)["'];?$`)
)

// TestInteropScriptsUseTheReportWireFormat: the topic and JSON keys the
// MQTT.js and Python members write are the ones clientsdk/report defines,
// so the scripts cannot drift from the Go code. The Go side's keys come
// from report.Encode of a report whose fields hold distinct values.
func TestInteropScriptsUseTheReportWireFormat(t *testing.T) {
	sample := report.Report{Pending: 7, ProcessingTime: 11 * time.Millisecond, Processed: 13}
	var encoded map[string]float64
	require.NoError(t, json.Unmarshal(report.Encode(sample), &encoded))
	keyOf := func(value float64) string {
		for k, v := range encoded {
			if v == value {
				return k
			}
		}
		t.Fatalf("report.Encode(%+v) = %v has no value %v", sample, encoded, value)
		return ""
	}
	goKeys := map[string]string{ // the scripts' role names → the Go encoder's keys
		"pending":        keyOf(7),
		"processingTime": keyOf(11),
		"processed":      keyOf(13),
	}

	for _, script := range []string{mqttjsScript, pahoPyScript} {
		t.Run(script, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(interopDir, script))
			require.NoError(t, err)

			topic := loadTopicLine.FindSubmatch(src)
			require.NotNil(t, topic, "%s defines LOAD_TOPIC", script)
			require.Equal(t, report.LoadTopic, string(topic[1]))

			keysLine := reportKeysLine.FindSubmatch(src)
			require.NotNil(t, keysLine, "%s defines REPORT_KEYS on one line", script)
			scriptKeys := map[string]string{}
			for _, pair := range reportKeyPair.FindAllSubmatch(keysLine[1], -1) {
				scriptKeys[string(pair[1])] = string(pair[2])
			}
			require.Equal(t, goKeys, scriptKeys, "%s's REPORT_KEYS against clientsdk/report", script)

			// And a report built from those keys decodes to what it says.
			payload, err := json.Marshal(map[string]float64{
				scriptKeys["pending"]: 3, scriptKeys["processingTime"]: 25.5, scriptKeys["processed"]: 4,
			})
			require.NoError(t, err)
			r, err := report.Decode(payload)
			require.NoError(t, err)
			require.Equal(t, report.Report{Pending: 3, ProcessingTime: 25500 * time.Microsecond, Processed: 4}, r)
		})
	}
}
