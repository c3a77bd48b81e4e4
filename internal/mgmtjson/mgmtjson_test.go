package mgmtjson

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeObject(t *testing.T) {
	type details struct {
		Name string `json:"name"`
	}
	var answer []struct {
		Details json.RawMessage `json:"connection_details"`
	}
	// The channels of /api/channels as RabbitMQ 3.x writes them: the
	// second one's connection is closing.
	require.NoError(t, json.Unmarshal([]byte(`[{"connection_details":{"name":"a -> b"}},{"connection_details":[]},{}]`), &answer))
	require.Len(t, answer, 3)

	var d details
	require.True(t, DecodeObject(answer[0].Details, &d))
	require.Equal(t, "a -> b", d.Name)

	d = details{Name: "untouched"}
	require.False(t, DecodeObject(answer[1].Details, &d), "[] is no object")
	require.Equal(t, "untouched", d.Name)
	require.False(t, DecodeObject(answer[2].Details, &d), "a missing field is no object")
	require.False(t, DecodeObject(json.RawMessage(`{"name":`), &d), "a broken object")
	require.True(t, DecodeObject(json.RawMessage(" \n{\"name\":\"c\"}"), &d))
	require.Equal(t, "c", d.Name)
}
