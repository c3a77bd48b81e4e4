package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// FuzzSiteConfig reads an arbitrary configuration message with
// ParseSiteConfig, the controller's reader of what it published to a
// site, and checks that it never panics and either refuses the message
// with a one-line error wrapping ErrInvalidConfig that never shows an
// upstream URI's password, or returns a SiteConfig that passes Validate
// and round-trips: Marshal writes it, ParseSiteConfig reads back an equal
// one (Equal and deeply equal), and Marshal writes that one byte for byte
// as before. Equal also ignores the order of an entity's upstreams.
func FuzzSiteConfig(f *testing.F) {
	f.Add([]byte(`{"pubsub.weather":[{"uri":"amqp://u:p@b:5672/%2F"}],"wq.jobs":[{"uri":"amqp://b:5672"},{"uri":"amqps://c:5671"}]}`))
	f.Add([]byte(`{"pubsub.x":[],"pubsub.y":null}`))
	f.Add([]byte(`{"pubsub.x":[{"uri":"amqp://a"},{"uri":"amqp://a"}],"pubsub.x":[{"uri":"amqp://b"}]}`))
	f.Add([]byte(`{"wq.bad name":[{"uri":"amqp://b"}]}`))
	f.Add([]byte(`{"pubsub.x":[{"uri":"http://user:s3cretpw@b:15672"}]}`))
	f.Add([]byte(`{"pubsub.x":[{"uri":"amqp://b","extra":1}],"amq.topic":[]}`))
	f.Add([]byte(`{"pubsub\u0000":[{"uri":"amqp://\u00e9"}]}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := ParseSiteConfig(body)
		if err != nil {
			msg := err.Error()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %q does not wrap ErrInvalidConfig", msg)
			}
			if strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("error is not one line: %q", msg)
			}
			var m configMessage
			if json.Unmarshal(body, &m) == nil {
				for _, ups := range m {
					for _, u := range ups {
						if p, ok := passwordOf(u.URI); ok && strings.Contains(msg, u.URI) {
							t.Fatalf("error shows the URI with password %q: %v", p, msg)
						}
					}
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseSiteConfig accepted what Validate refuses: %v", err)
		}
		wire, err := c.Marshal()
		if err != nil {
			t.Fatalf("Marshal of an accepted configuration: %v", err)
		}
		back, err := ParseSiteConfig(wire)
		if err != nil {
			t.Fatalf("ParseSiteConfig of Marshal's %s: %v", wire, err)
		}
		if !back.Equal(c) || !c.Equal(back) || !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip changed %v into %v (wire %s)", c, back, wire)
		}
		again, err := back.Marshal()
		if err != nil || !bytes.Equal(again, wire) {
			t.Fatalf("second Marshal %s (%v), first %s", again, err, wire)
		}
		reversed := SiteConfig{}
		for name, uris := range c {
			r := make([]string, len(uris))
			for i, u := range uris {
				r[len(uris)-1-i] = u
			}
			reversed[name] = r
		}
		if !reversed.Equal(c) {
			t.Fatalf("Equal depends on the order of upstreams: %v, %v", c, reversed)
		}
	})
}
