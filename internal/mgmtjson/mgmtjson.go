// Package mgmtjson reads the RabbitMQ management API's JSON where it is
// irregular: an object field that RabbitMQ writes as [] when it has
// nothing to put in it (empty message statistics, the channel details of
// a consumer whose channel it no longer knows, the connection details of
// a channel whose connection is closing). Decoding such a field into a
// struct fails, and with it the whole answer; decode it as a
// json.RawMessage and read it with DecodeObject instead.
package mgmtjson

import "encoding/json"

// DecodeObject decodes raw into v when raw is a JSON object, and reports
// whether it did. Anything else ([] included, or nothing) leaves v alone.
func DecodeObject(raw json.RawMessage, v any) bool {
	for i, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return json.Unmarshal(raw[i:], v) == nil
		}
		return false
	}
	return false
}
