package bridge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/stretchr/testify/require"
)

// TestGetQueueToleratesConsumersWithoutChannel feeds getQueue the answer
// RabbitMQ 3.x gives for a queue one of whose consumers has no channel
// details any more ("channel_details": [], as a federation link's has
// while it stops), which rabbit-hole's GetQueue fails to decode.
func TestGetQueueToleratesConsumersWithoutChannel(t *testing.T) {
	const body = `{"name":"federation: x -> site-a","vhost":"/","arguments":{"x-internal-purpose":"federation"},
		"consumer_details":[
			{"channel_details":[],"consumer_tag":"federation-link-x"},
			{"channel_details":{"connection_name":"127.0.0.1:5000 -> 127.0.0.1:5672","name":"127.0.0.1:5000 -> 127.0.0.1:5672 (1)"},"consumer_tag":"t"}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "u" || p != "p" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		// The vhost "/" is one escaped path segment.
		if r.URL.Path == "/api/queues///federation: x -> site-a" && strings.HasPrefix(r.URL.EscapedPath(), "/api/queues/%2F/") {
			_, _ = w.Write([]byte(body))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	rh, err := rabbithole.NewClient(srv.URL, "u", "p")
	require.NoError(t, err)

	_, err = rh.GetQueue("/", "federation: x -> site-a")
	require.Error(t, err, "rabbit-hole decodes the answer after all: getQueue may go")

	q, err := getQueue(context.Background(), rh, "/", "federation: x -> site-a")
	require.NoError(t, err)
	require.Equal(t, "federation: x -> site-a", q.Name)
	require.Equal(t, "federation", argString(q.Arguments, federationPurposeArg))
	require.Equal(t, []string{"127.0.0.1:5000 -> 127.0.0.1:5672"}, q.ConsumerConnections)

	_, err = getQueue(context.Background(), rh, "/", "missing")
	require.True(t, isNotFound(err), "a missing queue is a 404: %v", err)
}
