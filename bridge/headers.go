package bridge

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"
)

// mqttString reports whether s may be sent as an MQTT UTF-8 string:
// well-formed UTF-8 without U+0000 (MQTT-1.5.4-1, MQTT-1.5.4-2). AMQP
// headers are not checked by anyone, and one bad string in a PUBLISH makes
// every subscriber's decoder refuse the whole packet.
func mqttString(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// propertiesFromHeaders rebuilds the MQTT v5 properties the bridge carried
// in d's headers, leaving out user properties named in reserved (the
// bridge sets those itself) and whatever MQTT cannot carry: strings that
// are not valid MQTT strings, a payload format indicator other than 0
// or 1.
func propertiesFromHeaders(d amqp.Delivery, reserved ...string) packets.Properties {
	props := packets.Properties{}
	if mqttString(d.ContentType) {
		props.ContentType = d.ContentType
	}
	if ups, ok := d.Headers[HeaderUserProperties].([]interface{}); ok {
		for _, u := range ups {
			kv, ok := u.([]interface{})
			if !ok || len(kv) != 2 {
				continue
			}
			k, _ := kv[0].(string)
			v, _ := kv[1].(string)
			isReserved := false
			for _, r := range reserved {
				isReserved = isReserved || k == r
			}
			if !isReserved && mqttString(k) && mqttString(v) {
				props.User = append(props.User, packets.UserProperty{Key: k, Val: v})
			}
		}
	}
	if rt, ok := d.Headers[HeaderResponseTopic].(string); ok && mqttString(rt) {
		props.ResponseTopic = rt
	}
	if cd, ok := d.Headers[HeaderCorrelationData].([]byte); ok {
		props.CorrelationData = bytes.Clone(cd)
	}
	if pf, ok := asInt(d.Headers[HeaderPayloadFormat]); ok && (pf == 0 || pf == 1) {
		props.PayloadFormat, props.PayloadFormatFlag = byte(pf), true
	}
	return props
}
