package clientsdk_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk"
	"github.com/luffymq/luffymq/internal/testenv"
)

// Mosquitto ignores what it does not know: the load reports (extended
// PINGREQs, which Mosquitto 2.0.11 answers like plain ones, or PUBLISHes to
// $luffy/load) and the SDK's User Properties. The Subscriber works as a
// plain shared subscriber there.
func TestMosquittoPlainClient(t *testing.T) {
	for _, via := range []clientsdk.ReportChannel{clientsdk.ReportViaPingreq, clientsdk.ReportViaPublish, clientsdk.ReportOff} {
		for _, qos := range []byte{0, 1, 2} {
			t.Run(string(via)+"/qos"+string('0'+qos), func(t *testing.T) {
				addr := testenv.StartMosquitto(t)
				cfg, logs := subscriberConfig(t, addr, "w-plain", fixedWork(time.Millisecond))
				cfg.ReportVia, cfg.QoS, cfg.ReportInterval = via, qos, 50*time.Millisecond
				cfg.Workers = 2
				sawSentAt := make(chan bool, 100)
				handler := cfg.Handler
				cfg.Handler = func(ctx context.Context, m *clientsdk.Message) error {
					_, ok := clientsdk.SentAt(m)
					sawSentAt <- ok && m.ID != ""
					return handler(ctx, m)
				}
				s := startSubscriber(t, cfg)
				pub := startPublisher(t, addr)
				publish(t, pub, "t/x", 30, clientsdk.PublishOptions{QoS: qos})
				require.Eventually(t, func() bool { return s.Stats().Processed == 30 }, 5*time.Second, poll)
				for range 30 {
					require.True(t, <-sawSentAt, "send time and message ID stamped")
				}
				require.Zero(t, logs.count("connection to broker lost"), "nothing breaks")
				require.Equal(t, via, s.Stats().ReportVia, "Mosquitto 2.0 answers extended PINGREQs: no fallback")
				if via == clientsdk.ReportOff {
					require.Zero(t, s.Stats().ReportsSent)
				} else {
					require.Positive(t, s.Stats().ReportsSent)
				}
			})
		}
	}
}
