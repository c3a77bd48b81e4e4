package bridge

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// SiteConfig is the content of one configuration message (algorithms.md
// §2.6) in a form a controller can build and compare: each global entity
// (a pubsub* exchange or a wq.<g> work queue) mapped to the AMQP URIs of
// the upstreams this site federates it from. Marshal writes the exact JSON
// the site agent's configuration loop reads from ConfigQueueName(site);
// ParseSiteConfig reads it back.
type SiteConfig map[string][]string

// Marshal validates c as the site agent would and returns the
// configuration message: {"<entity>": [{"uri": "..."}, ...], ...}. Keys
// are written in sorted order and each entity's URIs in the order given,
// so equal configurations give equal bytes.
func (c SiteConfig) Marshal() ([]byte, error) {
	m := c.message()
	if _, err := federationFor(m); err != nil {
		return nil, err
	}
	return json.Marshal(m) // encoding/json sorts map keys
}

// Validate reports what the site agent would refuse in c, wrapping
// ErrInvalidConfig.
func (c SiteConfig) Validate() error {
	_, err := federationFor(c.message())
	return err
}

func (c SiteConfig) message() configMessage {
	m := make(configMessage, len(c))
	for name, uris := range c {
		ups := make([]struct {
			URI string `json:"uri"`
		}, len(uris))
		for i, u := range uris {
			ups[i].URI = u
		}
		m[name] = ups
	}
	return m
}

// Equal reports whether c and o federate the same entities from the same
// upstreams (the order of an entity's upstreams does not matter; an entity
// listed with no upstream equals an absent one, as the site agent treats
// both alike).
func (c SiteConfig) Equal(o SiteConfig) bool {
	norm := func(s SiteConfig) map[string]string {
		out := map[string]string{}
		for name, uris := range s {
			if len(uris) == 0 {
				continue
			}
			sorted := append([]string(nil), uris...)
			sort.Strings(sorted)
			out[name] = strings.Join(sorted, "\x00")
		}
		return out
	}
	a, b := norm(c), norm(o)
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ParseSiteConfig decodes a configuration message and validates it as the
// site agent does.
func ParseSiteConfig(body []byte) (SiteConfig, error) {
	var m configMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: configuration message: %w", ErrInvalidConfig, err)
	}
	if _, err := federationFor(m); err != nil {
		return nil, err
	}
	c := make(SiteConfig, len(m))
	for name, ups := range m {
		uris := make([]string, 0, len(ups))
		for _, u := range ups {
			uris = append(uris, u.URI)
		}
		c[name] = uris
	}
	return c, nil
}

// SiteConfigEntity returns the configuration entity that federation of
// the local exchange x belongs to: x itself for a pubsub* exchange, wq.<g>
// for wq.<g>'s intake exchange (see IntakeExchangeName); ok is false for
// any other exchange.
func SiteConfigEntity(x string) (entity string, ok bool) {
	if strings.HasPrefix(x, "pubsub") {
		return x, true
	}
	if g, found := strings.CutSuffix(strings.TrimPrefix(x, WorkQueuePrefix), ".in"); found && validName(g) && IntakeExchangeName(g) == x {
		return WorkQueueName(g), true
	}
	return "", false
}
