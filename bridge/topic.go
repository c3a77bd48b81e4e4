package bridge

import (
	"errors"
	"fmt"
	"strings"
)

// Topic mapping between MQTT and AMQP 0-9-1 topic exchanges.
//
// MQTT levels are separated by '/', AMQP words by '.'. A level that is
// exactly "+" or "#" (a wildcard, valid only in filters) maps to the word
// "*" or "#". Every other level is copied with these bytes percent-encoded:
// '%' (the escape character) as %25, '.' as %2E, '*' as %2A, '#' as %23
// and '+' as %2B (the last two cannot occur in valid MQTT levels but are
// encoded so the mapping stays total and reversible). A level never holds
// '/', so %2F is never written and AMQPToMQTT rejects it: decoded, it would
// split one word into two levels. Empty levels map to empty words
// ("a//b" <-> "a..b").
//
// MQTTToAMQP is injective and AMQPToMQTT inverts it: AMQPToMQTT(MQTTToAMQP(s))
// == s for every string s. A topic matches a filter in MQTT exactly when the
// mapped routing key matches the mapped binding key in RabbitMQ.

// ErrUnmappable is wrapped by AMQPToMQTT errors.
var ErrUnmappable = errors.New("routing key has no MQTT form")

// MQTTToAMQP maps an MQTT topic name or filter to an AMQP routing or
// binding key.
func MQTTToAMQP(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i, level := range strings.Split(s, "/") {
		if i > 0 {
			b.WriteByte('.')
		}
		switch level {
		case "+":
			b.WriteByte('*')
			continue
		case "#":
			b.WriteByte('#')
			continue
		}
		for j := 0; j < len(level); j++ {
			c := level[j]
			switch c {
			case '%', '.', '*', '#', '+':
				fmt.Fprintf(&b, "%%%02X", c)
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String()
}

// AMQPToMQTT maps an AMQP routing or binding key back to MQTT. Words "*"
// and "#" become the wildcards "+" and "#"; other words are
// percent-decoded. Keys that MQTTToAMQP cannot produce (a raw '/', '+' or
// '%' not followed by two hex digits, '*'/'#' inside a word, or a word that
// is only an escaped '+' or '#') are rejected with an error wrapping
// ErrUnmappable.
func AMQPToMQTT(key string) (string, error) {
	var b strings.Builder
	b.Grow(len(key))
	for i, word := range strings.Split(key, ".") {
		if i > 0 {
			b.WriteByte('/')
		}
		switch word {
		case "*":
			b.WriteByte('+')
			continue
		case "#":
			b.WriteByte('#')
			continue
		}
		if word == "%2B" || word == "%23" {
			// MQTTToAMQP maps a whole "+" or "#" level to a wildcard
			// word, never to its escape: decoded, this would be a
			// wildcard level that no topic name has.
			return "", fmt.Errorf("%w: %q: word %q would decode to a wildcard level", ErrUnmappable, key, word)
		}
		for j := 0; j < len(word); j++ {
			c := word[j]
			switch c {
			case '/', '+', '*', '#':
				return "", fmt.Errorf("%w: %q: raw %q in word %q", ErrUnmappable, key, c, word)
			case '%':
				if j+2 >= len(word) || !isUpperHex(word[j+1]) || !isUpperHex(word[j+2]) {
					return "", fmt.Errorf("%w: %q: bad escape in word %q", ErrUnmappable, key, word)
				}
				d := unhex(word[j+1])<<4 | unhex(word[j+2])
				switch d {
				case '%', '.', '*', '#', '+':
				case '/':
					// A level never holds '/': decoded, it would split the
					// word into two levels that MQTTToAMQP writes as two
					// words.
					return "", fmt.Errorf("%w: %q: escaped '/' in word %q would split an MQTT level", ErrUnmappable, key, word)
				default:
					return "", fmt.Errorf("%w: %q: needless escape %%%c%c in word %q", ErrUnmappable, key, word[j+1], word[j+2], word)
				}
				b.WriteByte(d)
				j += 2
			default:
				b.WriteByte(c)
			}
		}
	}
	return b.String(), nil
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'A' + 10
}

// validFilter reports whether f is a valid MQTT topic filter: not empty,
// '#' only as the last level, '+' and '#' only as whole levels.
func validFilter(f string) bool {
	if f == "" {
		return false
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if l == "#" {
			if i != len(levels)-1 {
				return false
			}
			continue
		}
		if l == "+" {
			continue
		}
		if strings.ContainsAny(l, "+#") {
			return false
		}
	}
	return true
}

// validTopic reports whether t is a valid MQTT topic name (no wildcards,
// a valid MQTT string).
func validTopic(t string) bool { return t != "" && !strings.ContainsAny(t, "+#") && mqttString(t) }

// MatchFilter reports whether topic name t matches MQTT filter f (topics
// starting with '$' are not matched by a leading wildcard).
func MatchFilter(f, t string) bool {
	if strings.HasPrefix(t, "$") && (strings.HasPrefix(f, "+") || strings.HasPrefix(f, "#")) {
		return false
	}
	fl, tl := strings.Split(f, "/"), strings.Split(t, "/")
	for i, l := range fl {
		if l == "#" {
			return true
		}
		if i >= len(tl) {
			return false
		}
		if l != "+" && l != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}

// IntersectFilters returns the filter matching exactly the topics matched
// by both a and b, and false when no topic matches both. The intersection
// of two MQTT filters is always a single filter.
func IntersectFilters(a, b string) (string, bool) {
	al, bl := strings.Split(a, "/"), strings.Split(b, "/")
	var out []string
	for i := 0; ; i++ {
		switch {
		case i < len(al) && al[i] == "#":
			// a matches anything from here, including nothing more.
			out = append(out, bl[min(i, len(bl)):]...)
			return strings.Join(out, "/"), len(out) > 0
		case i < len(bl) && bl[i] == "#":
			out = append(out, al[min(i, len(al)):]...)
			return strings.Join(out, "/"), len(out) > 0
		case i == len(al) && i == len(bl):
			return strings.Join(out, "/"), true
		case i == len(al) || i == len(bl):
			// One ends here; the other continues with a non-'#' level.
			return "", false
		case al[i] == "+":
			out = append(out, bl[i])
		case bl[i] == "+" || al[i] == bl[i]:
			out = append(out, al[i])
		default:
			return "", false
		}
	}
}
