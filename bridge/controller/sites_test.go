package controller

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSitesExampleFileParses(t *testing.T) {
	ss, err := LoadSites(filepath.Join("..", "..", "examples", "sites.yaml"))
	require.NoError(t, err)
	require.Equal(t, []string{"berlin", "tunis", "tokyo"}, ss.Names())
	berlin, ok := ss.Site("berlin")
	require.True(t, ok)
	require.Equal(t, "/", berlin.Vhost)
	require.Equal(t, "guest", berlin.ManagementUser, "defaults to amqp_url's user")
	require.Equal(t, "guest", berlin.ManagementPassword)
	require.InDelta(t, 3000e3/8, float64(berlin.InboundBandwidth), 1e-9, "3000 kbit/s in bytes/s")
	require.Equal(t, "3000 kbit/s", berlin.OutboundBandwidth.String())
	d, ok := ss.Delays.Between("tokyo", "berlin")
	require.True(t, ok, "one direction is enough")
	require.Equal(t, 115*time.Millisecond, d)
	d, _ = ss.Delays.Between("tunis", "tokyo")
	require.Equal(t, 120*time.Millisecond, d)
	tunis, _ := ss.Site("tunis")
	require.Equal(t, berlin.AMQPURL, berlin.UpstreamURL(tunis), "federation_url defaults to amqp_url")
}

const goodSites = `
sites:
  - name: a
    amqp_url: amqp://u:p@127.0.0.1:5672/v1
    management_url: http://127.0.0.1:15672
    management_user: admin
    management_password: secret
    federation_url: amqp://u:p@127.0.0.1:6000/v1
    inbound_bandwidth: 2 MB/s
  - name: b
    amqp_url: amqp://127.0.0.1:5673
    management_url: http://127.0.0.1:15673
    luffymq_url: http://127.0.0.1:8081
    luffymq_token: 0123456789abcdef
    outbound_bandwidth: unlimited
    upstream_urls:
      a: amqp://u:p@127.0.0.1:7000/v1
delays_ms:
  a: {b: 12.5}
`

func TestSitesParsesEveryField(t *testing.T) {
	ss, err := ParseSites("sites.yaml", []byte(goodSites))
	require.NoError(t, err)
	a, _ := ss.Site("a")
	b, _ := ss.Site("b")
	require.Equal(t, 3, a.Line)
	require.Equal(t, "v1", a.Vhost)
	require.Equal(t, "/", b.Vhost, "no path: the default vhost")
	require.Equal(t, "admin", a.ManagementUser)
	require.Equal(t, "secret", a.ManagementPassword)
	require.Equal(t, "guest", b.ManagementUser, "amqp_url without user: guest")
	require.Equal(t, Bandwidth(2e6), a.InboundBandwidth)
	require.Equal(t, Bandwidth(0), a.OutboundBandwidth)
	require.Equal(t, Bandwidth(0), b.OutboundBandwidth)
	require.Equal(t, "0123456789abcdef", b.LuffyMQToken)
	require.Equal(t, "amqp://u:p@127.0.0.1:7000/v1", a.UpstreamURL(b), "b's own upstream_urls win")
	require.Equal(t, "amqp://u:p@127.0.0.1:6000/v1", a.UpstreamURL(Site{Name: "c"}), "others reach a through its federation_url")
	require.Equal(t, "amqp://127.0.0.1:5673", b.UpstreamURL(a))
	d, ok := ss.Delays.Between("b", "a")
	require.True(t, ok)
	require.Equal(t, 12500*time.Microsecond, d)
}

func TestSitesRejectsBadFiles(t *testing.T) {
	site := func(name string, extra ...string) string {
		s := "  - name: " + name + "\n    amqp_url: amqp://127.0.0.1:5672/\n    management_url: http://127.0.0.1:15672\n"
		for _, e := range extra {
			s += "    " + e + "\n"
		}
		return s
	}
	tests := []struct {
		name, file, want string
	}{
		{"not yaml", "sites: [", "sites.yaml: yaml:"},
		{"not a mapping", "- a\n- b\n", "sites.yaml:1: want a mapping"},
		{"unknown top-level key", "sites:\n" + site("a") + "delay: {}\n", `sites.yaml:5: unknown key "delay"`},
		{"no sites", "delays_ms: {}\n", "sites: want a list"},
		{"empty sites", "sites: []\n", "sites.yaml:1: sites: want a list"},
		{"duplicate name", "sites:\n" + site("a") + site("b") + site("a") + "delays_ms: {a: {b: 1}}\n",
			`sites.yaml:8: site "a" listed twice (first at line 2)`},
		{"bad name", "sites:\n" + site("a b"), `sites.yaml:2: site "a b": name: use 1-64 letters`},
		{"unknown site key", "sites:\n" + site("a", "amqp_uri: x"), `sites.yaml:5: unknown site key "amqp_uri"`},
		{"missing amqp_url", "sites:\n  - name: a\n    management_url: http://127.0.0.1:1\n", `sites.yaml:2: site "a": amqp_url: missing`},
		{"bad amqp_url", "sites:\n  - name: a\n    amqp_url: http://u:pw@h/\n    management_url: http://127.0.0.1:1\n", `amqp_url: "http://u:xxxxx@h/"`},
		{"bad management_url", "sites:\n  - name: a\n    amqp_url: amqp://h/\n    management_url: ftp://h\n", `management_url: "ftp://h": want http://`},
		{"token without url", "sites:\n" + site("a", "luffymq_token: 0123456789abcdef"), "luffymq_token without luffymq_url"},
		{"bandwidth without unit", "sites:\n" + site("a", "inbound_bandwidth: 3000"), `line 5: bandwidth 3000 has no unit`},
		{"bandwidth bad unit", "sites:\n" + site("a", "inbound_bandwidth: 3 furlongs/s"), `unknown unit "furlongs/s"`},
		{"wrong type", "sites:\n" + site("a", "upstream_urls: [1]"), "cannot unmarshal"},
		{"upstream_urls unknown site", "sites:\n" + site("a", "upstream_urls: {c: 'amqp://h/'}") + site("b") + "delays_ms: {a: {b: 1}}\n",
			`sites.yaml:2: site "a": upstream_urls names "c"`},
		{"unknown site in matrix row", "sites:\n" + site("a") + site("b") + "delays_ms:\n  a: {b: 1}\n  c: {a: 2}\n",
			`sites.yaml:10: delays_ms names unknown site "c"`},
		{"unknown site in matrix column", "sites:\n" + site("a") + site("b") + "delays_ms:\n  a: {b: 1, z: 3}\n",
			`sites.yaml:9: delays_ms.a names unknown site "z"`},
		{"missing delay", "sites:\n" + site("a") + site("b") + site("c") + "delays_ms:\n  a: {b: 1, c: 2}\n",
			`delays_ms has no delay between "b" and "c"`},
		{"no matrix", "sites:\n" + site("a") + site("b"), `no delay between "a" and "b"`},
		{"negative delay", "sites:\n" + site("a") + site("b") + "delays_ms:\n  a: {b: -1}\n", `sites.yaml:9: delays_ms.a.b: "-1" is not a non-negative number`},
		{"text delay", "sites:\n" + site("a") + site("b") + "delays_ms:\n  a: {b: far}\n", `delays_ms.a.b: "far"`},
		{"self delay", "sites:\n" + site("a") + site("b") + "delays_ms:\n  a: {a: 3, b: 1}\n", "a site's delay to itself is 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSites("sites.yaml", []byte(tt.file))
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalidSites), "%v wraps ErrInvalidSites", err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "\n", "one line")
			require.NotContains(t, err.Error(), "pw@", "no password")
		})
	}
}

func TestSitesSingleSiteNeedsNoMatrix(t *testing.T) {
	ss, err := ParseSites("one.yaml", []byte("sites:\n  - name: solo\n    amqp_url: amqp://127.0.0.1/\n    management_url: http://127.0.0.1:15672\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"solo"}, ss.Names())
}

func TestSitesBandwidthUnits(t *testing.T) {
	for in, want := range map[string]float64{
		"8 bit/s": 1, "1 kbit/s": 125, "1.5 Mbit/s": 187500, "1 Gbit/s": 125e6,
		"1 B/s": 1, "2kB/s": 2000, "3 MB/s": 3e6, "1 GB/s": 1e9, "unlimited": 0,
	} {
		got, err := ParseBandwidth(in)
		require.NoError(t, err, in)
		require.InDelta(t, want, float64(got), 1e-6, in)
	}
	for _, bad := range []string{"", "fast", "-1 kbit/s", "1 kbps", "1e3 kbit/s"} {
		_, err := ParseBandwidth(bad)
		require.Error(t, err, bad)
	}
}

func TestControllerFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "sites.yaml")
	require.NoError(t, os.WriteFile(good, []byte(goodSites), 0o600))
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("sites: []\n"), 0o600))

	c, err := ConfigFromArgs([]string{"--sites", good}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultPeriod, c.Period)
	require.Equal(t, float64(DefaultLambda), c.Lambda)
	require.Equal(t, AlgorithmImproved, c.Algorithm)
	require.Equal(t, DefaultHTTPListen, c.HTTPListen)
	require.False(t, c.Once)
	require.Equal(t, DefaultFirstWindow, c.FirstWindow)
	require.Equal(t, []string{"a", "b"}, c.Sites.Names())

	c, err = ConfigFromArgs([]string{"--sites", good, "--period", "30s", "--lambda", "0", "--algorithm", "thesis", "--http", "", "--once"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, c.Period)
	require.Zero(t, c.Lambda)
	require.Equal(t, AlgorithmThesis, c.Algorithm)
	require.Empty(t, c.HTTPListen)
	require.True(t, c.Once)
	require.Equal(t, 10*time.Second, c.FirstWindow)

	c, err = ConfigFromArgs([]string{"--sites", good, "--period", "4s", "--first-window", "1m"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, c.FirstWindow, "at most half the period")

	var usage strings.Builder
	_, err = ConfigFromArgs([]string{"--help"}, &usage)
	require.ErrorIs(t, err, ErrHelp)
	require.Contains(t, usage.String(), "99 %", "the algorithm flag says why improved is the default")
	require.Contains(t, usage.String(), "54-78 %")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--sites FILE is required"},
		{[]string{"--sites", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"--sites", bad}, "bad.yaml:1: sites: want a list"},
		{[]string{"--sites", good, "--algorithm", "random"}, `algorithm "random"`},
		{[]string{"--sites", good, "--period", "10ms"}, "period 10ms"},
		{[]string{"--sites", good, "--lambda", "-1"}, "lambda -1"},
		{[]string{"--sites", good, "--lambda", "NaN"}, "lambda NaN"},
		{[]string{"--sites", good, "--http", "0.0.0.0:9090"}, "set http-token"},
		{[]string{"--sites", good, "--http", "nonsense"}, `http "nonsense": want host:port`},
		{[]string{"--sites", good, "--http-token", "short"}, "http-token is 5 characters"},
		{[]string{"--sites", good, "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"--sites", good, "extra"}, `unexpected argument "extra"`},
	} {
		_, err := ConfigFromArgs(tt.args, io.Discard)
		require.Error(t, err, "%v", tt.args)
		require.Contains(t, err.Error(), tt.want, "%v", tt.args)
		require.True(t, errors.Is(err, ErrInvalidConfig) || errors.Is(err, ErrInvalidSites), "%v", err)
	}
	_, err = ConfigFromArgs([]string{"--sites", good, "--http", "0.0.0.0:9090", "--http-token", "0123456789abcdef"}, io.Discard)
	require.NoError(t, err, "beyond loopback with a token")
}
