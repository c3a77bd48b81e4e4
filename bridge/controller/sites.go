package controller

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/luffymq/luffymq/bridge/placement"
)

// ErrInvalidSites wraps every problem found in a sites file.
var ErrInvalidSites = errors.New("sites file")

// Sites is what a sites file (--sites) describes: the sites the controller
// places synchronisation instances on and the one-way delays between them.
//
//	sites:
//	  - name: berlin
//	    amqp_url: amqp://guest:guest@10.0.0.1:5672/%2F
//	    management_url: http://10.0.0.1:15672
//	    management_user: guest          # default: the user of amqp_url
//	    management_password: guest      # default: the password of amqp_url
//	    luffymq_url: http://10.0.0.1:8080   # optional: luffymq status API
//	    luffymq_token: 0123456789abcdef     # optional: its --http-token
//	    inbound_bandwidth: 3000 kbit/s      # optional: unlimited
//	    outbound_bandwidth: 3000 kbit/s
//	    federation_url: amqp://...      # optional: how the other sites reach
//	                                    # this node (default amqp_url)
//	    upstream_urls:                  # optional: how this site reaches
//	      tunis: amqp://...             # a given other site
//	delays_ms:                          # one-way delay of every pair, in ms;
//	  berlin: {tunis: 22, tokyo: 115}   # one direction is enough when
//	  tunis: {tokyo: 120}               # both are equal
type Sites struct {
	// Sites in file order.
	Sites []Site
	// Delays is the delay matrix as placement reads it.
	Delays placement.Delays
}

// Site is one site of a sites file.
type Site struct {
	// Name names the site: its configuration queue is
	// luffymq.config.<name> (letters, digits, '-', '_').
	Name string `yaml:"name"`
	// AMQPURL is the site's RabbitMQ node as the controller reaches it; its
	// path is the virtual host the controller reads and configures.
	AMQPURL string `yaml:"amqp_url"`
	// FederationURL is the node as the other sites reach it (AMQPURL).
	FederationURL string `yaml:"federation_url"`
	// UpstreamURLs overrides, per other site, the URI this site's
	// federation links use to reach it.
	UpstreamURLs map[string]string `yaml:"upstream_urls"`
	// ManagementURL is the node's management API (http://host:15672).
	ManagementURL string `yaml:"management_url"`
	// ManagementUser and ManagementPassword log in to the management API
	// (those of AMQPURL).
	ManagementUser     string `yaml:"management_user"`
	ManagementPassword string `yaml:"management_password"`
	// LuffyMQURL is the site's luffymq HTTP API (optional).
	LuffyMQURL string `yaml:"luffymq_url"`
	// LuffyMQToken is sent as a bearer token to LuffyMQURL (its
	// --http-token), if set.
	LuffyMQToken string `yaml:"luffymq_token"`
	// InboundBandwidth and OutboundBandwidth bound the site's overlay
	// traffic, in bytes per second (0: unlimited). The file writes them
	// with a unit: "3000 kbit/s", "2 MB/s".
	InboundBandwidth  Bandwidth `yaml:"inbound_bandwidth"`
	OutboundBandwidth Bandwidth `yaml:"outbound_bandwidth"`

	// Vhost is the virtual host of AMQPURL.
	Vhost string `yaml:"-"`
	// Line is where the site starts in the file.
	Line int `yaml:"-"`
}

// UpstreamURL returns the URI through which site from's federation links
// reach site s.
func (s Site) UpstreamURL(from Site) string {
	if u := from.UpstreamURLs[s.Name]; u != "" {
		return u
	}
	if s.FederationURL != "" {
		return s.FederationURL
	}
	return s.AMQPURL
}

// Site returns the site named name.
func (ss *Sites) Site(name string) (Site, bool) {
	for _, s := range ss.Sites {
		if s.Name == name {
			return s, true
		}
	}
	return Site{}, false
}

// Names returns the site names in file order.
func (ss *Sites) Names() []string {
	names := make([]string, len(ss.Sites))
	for i, s := range ss.Sites {
		names[i] = s.Name
	}
	return names
}

// Bandwidth is an overlay bandwidth in bytes per second; 0 is unlimited.
type Bandwidth float64

var bandwidthUnits = map[string]float64{
	"bit/s": 1.0 / 8, "kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8,
	"B/s": 1, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9,
}

var bandwidthPattern = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z/]+)$`)

// ParseBandwidth reads "<number> <unit>" with a unit among bit/s, kbit/s,
// Mbit/s, Gbit/s, B/s, kB/s, MB/s, GB/s (decimal multiples), or
// "unlimited".
func ParseBandwidth(s string) (Bandwidth, error) {
	s = strings.TrimSpace(s)
	if s == "unlimited" {
		return 0, nil
	}
	m := bandwidthPattern.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("bandwidth %q: want a number and a unit (bit/s, kbit/s, Mbit/s, Gbit/s, B/s, kB/s, MB/s, GB/s), e.g. \"3000 kbit/s\", or \"unlimited\"", s)
	}
	mult, ok := bandwidthUnits[m[2]]
	if !ok {
		return 0, fmt.Errorf("bandwidth %q: unknown unit %q (use bit/s, kbit/s, Mbit/s, Gbit/s, B/s, kB/s, MB/s or GB/s)", s, m[2])
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || math.IsInf(v*mult, 0) {
		return 0, fmt.Errorf("bandwidth %q: not a finite number", s)
	}
	return Bandwidth(v * mult), nil
}

// UnmarshalYAML reads a bandwidth written with its unit.
func (b *Bandwidth) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: bandwidth must be a string like \"3000 kbit/s\"", n.Line)
	}
	if n.Tag == "!!int" || n.Tag == "!!float" {
		if v, err := strconv.ParseFloat(n.Value, 64); err == nil && v == 0 {
			*b = 0
			return nil
		}
		return fmt.Errorf("line %d: bandwidth %s has no unit; write e.g. \"%s kbit/s\" or \"%s B/s\"", n.Line, n.Value, n.Value, n.Value)
	}
	v, err := ParseBandwidth(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// String writes the bandwidth in kbit/s, the thesis's unit.
func (b Bandwidth) String() string {
	if b == 0 {
		return "unlimited"
	}
	return strconv.FormatFloat(float64(b)*8/1e3, 'f', -1, 64) + " kbit/s"
}

var siteKeys = []string{"name", "amqp_url", "federation_url", "upstream_urls", "management_url", "management_user",
	"management_password", "luffymq_url", "luffymq_token", "inbound_bandwidth", "outbound_bandwidth"}

// LoadSites reads and validates a sites file.
func LoadSites(path string) (*Sites, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSites, err)
	}
	return ParseSites(path, data)
}

// ParseSites reads and validates the sites file held in data; name
// prefixes every error ("sites.yaml:12: ...").
func ParseSites(name string, data []byte) (*Sites, error) {
	fail := func(line int, format string, args ...any) error {
		where := name
		if line > 0 {
			where += ":" + strconv.Itoa(line)
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalidSites, where, fmt.Sprintf(format, args...))
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fail(0, "%s", oneLine(err))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fail(root.Line, "want a mapping with the keys sites and delays_ms")
	}
	var sitesNode, delaysNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "sites":
			sitesNode = v
		case "delays_ms":
			delaysNode = v
		default:
			return nil, fail(k.Line, "unknown key %q (known: sites, delays_ms)", k.Value)
		}
	}
	if sitesNode == nil || sitesNode.Kind != yaml.SequenceNode || len(sitesNode.Content) == 0 {
		line := root.Line
		if sitesNode != nil {
			line = sitesNode.Line
		}
		return nil, fail(line, "sites: want a list of at least one site")
	}
	out := &Sites{}
	firstLine := map[string]int{}
	for _, n := range sitesNode.Content {
		if n.Kind != yaml.MappingNode {
			return nil, fail(n.Line, "a site must be a mapping (name, amqp_url, management_url, ...)")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; !contains(siteKeys, k.Value) {
				return nil, fail(k.Line, "unknown site key %q (known: %s)", k.Value, strings.Join(siteKeys, ", "))
			}
		}
		var s Site
		if err := n.Decode(&s); err != nil {
			return nil, fail(0, "%s", oneLine(err))
		}
		s.Line = n.Line
		if err := s.check(); err != nil {
			return nil, fail(n.Line, "site %q: %v", s.Name, err)
		}
		if first, dup := firstLine[s.Name]; dup {
			return nil, fail(n.Line, "site %q listed twice (first at line %d)", s.Name, first)
		}
		firstLine[s.Name] = n.Line
		out.Sites = append(out.Sites, s)
	}
	for _, s := range out.Sites {
		others := make([]string, 0, len(s.UpstreamURLs))
		for other := range s.UpstreamURLs {
			others = append(others, other)
		}
		sort.Strings(others)
		for _, other := range others {
			if _, ok := firstLine[other]; !ok || other == s.Name {
				return nil, fail(s.Line, "site %q: upstream_urls names %q, which is not another site of this file", s.Name, other)
			}
			if err := checkAMQPURL(s.UpstreamURLs[other]); err != nil {
				return nil, fail(s.Line, "site %q: upstream_urls.%s: %v", s.Name, other, err)
			}
		}
	}
	delays, err := parseDelays(delaysNode, firstLine, fail)
	if err != nil {
		return nil, err
	}
	out.Delays = delays
	for i, a := range out.Sites {
		for _, b := range out.Sites[i+1:] {
			if _, ok := delays.Between(a.Name, b.Name); !ok {
				line := root.Line
				if delaysNode != nil {
					line = delaysNode.Line
				}
				return nil, fail(line, "delays_ms has no delay between %q and %q (give %s: {%s: <ms>})", a.Name, b.Name, a.Name, b.Name)
			}
		}
	}
	return out, nil
}

func parseDelays(n *yaml.Node, sites map[string]int, fail func(int, string, ...any) error) (placement.Delays, error) {
	delays := placement.Delays{}
	if n == nil {
		return delays, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fail(n.Line, "delays_ms: want a mapping of site to {other site: milliseconds}")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		from, row := n.Content[i], n.Content[i+1]
		if _, ok := sites[from.Value]; !ok {
			return nil, fail(from.Line, "delays_ms names unknown site %q", from.Value)
		}
		if row.Kind != yaml.MappingNode {
			return nil, fail(row.Line, "delays_ms.%s: want a mapping of other site to milliseconds", from.Value)
		}
		for j := 0; j+1 < len(row.Content); j += 2 {
			to, v := row.Content[j], row.Content[j+1]
			if _, ok := sites[to.Value]; !ok {
				return nil, fail(to.Line, "delays_ms.%s names unknown site %q", from.Value, to.Value)
			}
			ms, err := strconv.ParseFloat(v.Value, 64)
			if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") || err != nil || ms < 0 || math.IsInf(ms, 0) || math.IsNaN(ms) {
				return nil, fail(v.Line, "delays_ms.%s.%s: %q is not a non-negative number of milliseconds", from.Value, to.Value, v.Value)
			}
			if ms*float64(time.Millisecond) >= math.MaxInt64 {
				// A time.Duration holds about 292 years; the conversion
				// of a larger value would not fail but give a negative delay.
				return nil, fail(v.Line, "delays_ms.%s.%s: %q milliseconds is too large", from.Value, to.Value, v.Value)
			}
			if from.Value == to.Value && ms != 0 {
				return nil, fail(v.Line, "delays_ms.%s.%s: a site's delay to itself is 0", from.Value, to.Value)
			}
			if _, dup := delays[from.Value][to.Value]; dup {
				return nil, fail(to.Line, "delays_ms.%s.%s given twice", from.Value, to.Value)
			}
			if delays[from.Value] == nil {
				delays[from.Value] = map[string]time.Duration{}
			}
			delays[from.Value][to.Value] = time.Duration(ms * float64(time.Millisecond))
		}
	}
	return delays, nil
}

var siteNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (s *Site) check() error {
	if !siteNamePattern.MatchString(s.Name) {
		return errors.New("name: use 1-64 letters, digits, '-' or '_'")
	}
	if err := checkAMQPURL(s.AMQPURL); err != nil {
		return fmt.Errorf("amqp_url: %w", err)
	}
	uri, _ := amqp.ParseURI(s.AMQPURL)
	s.Vhost = uri.Vhost
	if s.FederationURL != "" {
		if err := checkAMQPURL(s.FederationURL); err != nil {
			return fmt.Errorf("federation_url: %w", err)
		}
	}
	if err := checkHTTPURL(s.ManagementURL); err != nil {
		return fmt.Errorf("management_url: %w", err)
	}
	if s.ManagementUser == "" {
		s.ManagementUser, s.ManagementPassword = uri.Username, uri.Password
	}
	if s.LuffyMQURL != "" {
		if err := checkHTTPURL(s.LuffyMQURL); err != nil {
			return fmt.Errorf("luffymq_url: %w", err)
		}
	} else if s.LuffyMQToken != "" {
		return errors.New("luffymq_token without luffymq_url")
	}
	return nil
}

func checkAMQPURL(raw string) error {
	if raw == "" {
		return errors.New("missing (want amqp://user:password@host:5672/vhost)")
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		// net/url's errors quote the whole URL, password included: give
		// only what it found wrong.
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			return fmt.Errorf("%q: %v (want amqp://user:password@host:5672/vhost, reserved characters in user and password percent-encoded)", redactURL(raw), urlErr.Err)
		}
		return fmt.Errorf("%q: %v (want amqp://user:password@host:5672/vhost)", redactURL(raw), err)
	}
	// ParseURI takes any case and a single slash; the site agent takes
	// federation upstreams only as amqp:// or amqps://.
	if !strings.HasPrefix(raw, "amqp://") && !strings.HasPrefix(raw, "amqps://") {
		return fmt.Errorf("%q: write the scheme amqp:// or amqps:// (want amqp://user:password@host:5672/vhost)", redactURL(raw))
	}
	return nil
}

func checkHTTPURL(raw string) error {
	if raw == "" {
		return errors.New("missing (want http://host:port)")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want http://host:port or https://host:port", redactURL(raw))
	}
	return nil
}

// redactURL hides the password of a URL for logs, errors and the status
// API.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if at := strings.LastIndex(raw, "@"); at >= 0 {
			return "xxxxx" + raw[at:]
		}
		return raw
	}
	return u.Redacted()
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
