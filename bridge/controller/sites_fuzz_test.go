package controller

import (
	"errors"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
)

// fuzzSitesName is the file name FuzzSitesFile gives ParseSites; every
// error must start with it.
const fuzzSitesName = "sites.yaml"

// FuzzSitesFile feeds arbitrary bytes to ParseSites, the reader of
// luffy-controller's --sites file, and checks that it never panics and
// that it either
//   - refuses the file with a clear error: one line, wrapping
//     ErrInvalidSites, starting "sites file: sites.yaml", and never showing
//     the password of a URL it complains about; or
//   - returns sites that pass every check the controller relies on: at
//     least one site, names valid and unique, every URL of the kind its
//     field wants (the virtual host the one of amqp_url), upstream_urls
//     naming other sites, bandwidths finite and non-negative, a
//     non-negative delay for every pair and only for known sites; that
//     placement accepts as its input (placement.Heuristic validates it);
//     and whose federation URIs the site agent accepts in a configuration
//     message (bridge.SiteConfig.Validate) for every pair of sites.
//
// Parsing the same bytes twice gives the same result. (Sites has no
// marshaller, so there is no round trip to check.)
func FuzzSitesFile(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "sites.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(goodSites))
	f.Fuzz(func(t *testing.T, data []byte) {
		ss, err := ParseSites(fuzzSitesName, data)
		again, err2 := ParseSites(fuzzSitesName, data)
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) || !reflect.DeepEqual(ss, again) {
			t.Fatalf("second parse gave %v (%+v), first %v (%+v)", err2, again, err, ss)
		}
		if err != nil {
			checkSitesError(t, data, err)
			return
		}
		checkSites(t, ss)
	})
}

// checkSitesError checks that err is a clear refusal of data.
func checkSitesError(t *testing.T, data []byte, err error) {
	t.Helper()
	msg := err.Error()
	if !errors.Is(err, ErrInvalidSites) {
		t.Fatalf("error %q does not wrap ErrInvalidSites", msg)
	}
	if !strings.HasPrefix(msg, ErrInvalidSites.Error()+": "+fuzzSitesName) {
		t.Fatalf("error %q does not start with %q", msg, ErrInvalidSites.Error()+": "+fuzzSitesName)
	}
	if strings.ContainsAny(msg, "\n\r") {
		t.Fatalf("error is not one line: %q", msg)
	}
	// An error about a site's URL field must not show that URL's
	// password. The site (by its line) and the field are read from the
	// message ("sites.yaml:<line>: site "<name>": <field>: ..."), the URL
	// from the file.
	rest, ok := strings.CutPrefix(msg, ErrInvalidSites.Error()+": "+fuzzSitesName+":")
	if !ok {
		return
	}
	lineText, rest, ok := strings.Cut(rest, ": site ")
	line, err := strconv.Atoi(lineText)
	if !ok || err != nil {
		return
	}
	if _, rest, ok = strings.Cut(rest, `": `); !ok {
		return
	}
	for field, raws := range fuzzSiteURLs(data)[line] {
		if !strings.HasPrefix(rest, field+": ") {
			continue
		}
		for _, raw := range raws {
			if secret, ok := userinfoWithPassword(raw); ok && strings.Contains(rest, secret) {
				t.Fatalf("error shows the password of %s %q: %s", field, raw, msg)
			}
		}
	}
}

// fuzzSiteURLs reads data as a YAML document as far as it can and returns,
// for each site mapping by the line it starts on, the raw values of its URL
// fields keyed as ParseSites names the field in its errors (upstream_urls
// entries as upstream_urls.<site>).
func fuzzSiteURLs(data []byte) map[int]map[string][]string {
	var doc yaml.Node
	_ = yaml.Unmarshal(data, &doc)
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	out := map[int]map[string][]string{}
	for i := 0; root.Kind == yaml.MappingNode && i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "sites" {
			continue
		}
		for _, site := range root.Content[i+1].Content {
			if site.Kind != yaml.MappingNode {
				continue
			}
			fields := map[string][]string{}
			for j := 0; j+1 < len(site.Content); j += 2 {
				key, v := site.Content[j].Value, site.Content[j+1]
				switch key {
				case "amqp_url", "federation_url", "management_url", "luffymq_url":
					fields[key] = append(fields[key], v.Value)
				case "upstream_urls":
					for k := 0; k+1 < len(v.Content); k += 2 {
						name := "upstream_urls." + v.Content[k].Value
						fields[name] = append(fields[name], v.Content[k+1].Value)
					}
				}
			}
			out[site.Line] = fields
		}
	}
	return out
}

// userinfoWithPassword returns "user:password@" of a URL that carries a
// password, as it would appear in a message that shows the URL. It reads
// the URL as net/url does (scheme "://" authority, the userinfo before the
// authority's last '@'), but also when net/url would refuse it, as
// redactURL does.
func userinfoWithPassword(raw string) (string, bool) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || scheme == "" || strings.Trim(scheme, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.") != "" {
		return "", false
	}
	if end := strings.IndexAny(rest, "/?#"); end >= 0 {
		rest = rest[:end]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return "", false
	}
	_, pass, ok := strings.Cut(rest[:at], ":")
	if !ok || pass == "" || pass == "xxxxx" {
		return "", false
	}
	return rest[:at+1], true
}

// checkSites checks what ParseSites accepted.
func checkSites(t *testing.T, ss *Sites) {
	t.Helper()
	if len(ss.Sites) == 0 {
		t.Fatal("accepted a file with no site")
	}
	names := map[string]bool{}
	for _, s := range ss.Sites {
		if !siteNamePattern.MatchString(s.Name) || names[s.Name] {
			t.Fatalf("site name %q accepted (names so far %v)", s.Name, names)
		}
		names[s.Name] = true
		uri, err := amqp.ParseURI(s.AMQPURL)
		if err != nil || uri.Vhost != s.Vhost {
			t.Fatalf("site %q: amqp_url %q (%v), vhost %q", s.Name, s.AMQPURL, err, s.Vhost)
		}
		if s.FederationURL != "" {
			if _, err := amqp.ParseURI(s.FederationURL); err != nil {
				t.Fatalf("site %q: federation_url %q accepted: %v", s.Name, s.FederationURL, err)
			}
		}
		httpURLs := []string{s.ManagementURL}
		if s.LuffyMQURL != "" { // optional
			httpURLs = append(httpURLs, s.LuffyMQURL)
		}
		for _, u := range httpURLs {
			if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
				t.Fatalf("site %q: HTTP URL %q accepted", s.Name, u)
			}
		}
		if s.LuffyMQToken != "" && s.LuffyMQURL == "" {
			t.Fatalf("site %q: luffymq_token without luffymq_url accepted", s.Name)
		}
		for _, b := range []Bandwidth{s.InboundBandwidth, s.OutboundBandwidth} {
			if v := float64(b); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("site %q: bandwidth %v accepted", s.Name, v)
			}
		}
	}
	for _, s := range ss.Sites {
		for other, u := range s.UpstreamURLs {
			if !names[other] || other == s.Name {
				t.Fatalf("site %q: upstream_urls names %q", s.Name, other)
			}
			if _, err := amqp.ParseURI(u); err != nil {
				t.Fatalf("site %q: upstream_urls.%s %q accepted: %v", s.Name, other, u, err)
			}
		}
	}
	for from, row := range ss.Delays {
		for to, d := range row {
			if !names[from] || !names[to] || d < 0 || (from == to && d != 0) {
				t.Fatalf("delay %s -> %s of %v accepted", from, to, d)
			}
		}
	}
	for _, a := range ss.Sites {
		for _, b := range ss.Sites {
			if d, ok := ss.Delays.Between(a.Name, b.Name); !ok || d < 0 {
				t.Fatalf("no valid delay between %q and %q (%v, %v)", a.Name, b.Name, d, ok)
			}
			if a.Name == b.Name {
				continue
			}
			// What the controller publishes to a's configuration queue
			// to federate an exchange from b.
			msg := bridge.SiteConfig{"pubsub.fuzz": {b.UpstreamURL(a)}, "wq.fuzz": {b.UpstreamURL(a)}}
			if err := msg.Validate(); err != nil {
				t.Fatalf("site %q's federation URI for %q is refused by the site agent: %v", a.Name, b.Name, err)
			}
		}
	}
	in, _ := buildInput(ss, nil, nil, 0, 0)
	if _, err := placement.Heuristic(in); err != nil {
		t.Fatalf("placement refuses the sites: %v", err)
	}
	if _, ok := ss.Site(ss.Sites[0].Name); !ok || len(ss.Names()) != len(ss.Sites) {
		t.Fatalf("Site/Names disagree with Sites: %v", ss.Names())
	}
}
