package clientsdk

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// maxErrorPropertyLen bounds the error text put in a dead-lettered message.
const maxErrorPropertyLen = 1024

// deadLetterProperties returns the User Properties of a dead-lettered copy
// of m: m's own properties without earlier diagnostics, then the number of
// attempts, the last error, the time of the first failure and the original
// topic.
func deadLetterProperties(m *Message, attempts int, lastErr error, firstFailure time.Time) []UserProperty {
	props := make([]UserProperty, 0, len(m.UserProperties)+4)
	for _, p := range m.UserProperties {
		switch p.Key {
		case AttemptsProperty, ErrorProperty, FirstFailureProperty, OriginalTopicProperty:
			continue
		}
		props = append(props, p)
	}
	errText := "unknown error"
	if lastErr != nil {
		errText = lastErr.Error()
	}
	return append(props,
		UserProperty{Key: AttemptsProperty, Value: strconv.Itoa(attempts)},
		UserProperty{Key: ErrorProperty, Value: mqttString(errText, maxErrorPropertyLen)},
		UserProperty{Key: FirstFailureProperty, Value: firstFailure.UTC().Format(time.RFC3339Nano)},
		UserProperty{Key: OriginalTopicProperty, Value: m.Topic},
	)
}

// mqttString makes s a valid MQTT UTF-8 string (no NUL, valid UTF-8) of at
// most limit bytes.
func mqttString(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
