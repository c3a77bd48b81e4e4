package bridge

// Small helpers for AMQP channels, queues and errors.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/luffymq/luffymq/internal/mgmtjson"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

// withChannel runs fn on a channel of its own, closed afterwards (an
// operation RabbitMQ refuses closes its channel).
func withChannel(conn *amqp.Connection, fn func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	return fn(ch)
}

// inspectQueue declares queue passively on a channel of its own (a
// missing queue closes the channel); nil means the queue is gone.
func inspectQueue(conn *amqp.Connection, queue string) (*amqp.Queue, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if isAMQPCode(err, amqp.NotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &q, nil
}

// deleteQueue deletes queue on a channel of its own (a refused delete
// closes the channel) and returns how many messages it held. With
// ifUnused, RabbitMQ refuses while the queue has a consumer (whose
// unacknowledged messages an if-empty delete would not count).
func deleteQueue(conn *amqp.Connection, queue string, ifUnused, ifEmpty bool) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	n, err := ch.QueueDelete(queue, ifUnused, ifEmpty, false)
	if isAMQPCode(err, amqp.NotFound) {
		return 0, nil
	}
	return n, err
}

func isAMQPCode(err error, code int) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == code
}

// isNotFound reports whether the management API answered 404.
func isNotFound(err error) bool {
	var e rabbithole.ErrorResponse
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound
}

func argString(args map[string]interface{}, k string) string {
	s, _ := args[k].(string)
	return s
}

// managedQueue is what the bridge reads of a queue through the
// management API.
type managedQueue struct {
	Name      string                 `json:"name"`
	Arguments map[string]interface{} `json:"arguments"`
	Consumers int                    `json:"consumers"`
	// ConsumerConnections names the connection of each consumer whose
	// channel the management API knows.
	ConsumerConnections []string `json:"-"`
}

// getQueue reads queue name in vhost. rabbit-hole's GetQueue cannot be
// used: RabbitMQ gives a consumer whose channel it no longer knows (a
// federation link's, while it stops) "channel_details": [], which
// rabbit-hole fails to decode as an object, and the whole read fails. A
// missing queue is a rabbithole.ErrorResponse of 404 (isNotFound).
func getQueue(ctx context.Context, rh *rabbithole.Client, vhost, name string) (managedQueue, error) {
	var q managedQueue
	u := strings.TrimSuffix(rh.Endpoint, "/") + "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return q, err
	}
	req.SetBasicAuth(rh.Username, rh.Password)
	client := &http.Client{Timeout: managementTimeout}
	res, err := client.Do(req)
	if err != nil {
		return q, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return q, rabbithole.ErrorResponse{StatusCode: res.StatusCode, Message: res.Status}
	}
	var raw struct {
		managedQueue
		ConsumerDetails []struct {
			ChannelDetails json.RawMessage `json:"channel_details"`
		} `json:"consumer_details"`
	}
	if err := json.NewDecoder(res.Body).Decode(&raw); err != nil {
		return q, fmt.Errorf("decoding queue %s: %w", name, err)
	}
	q = raw.managedQueue
	for _, c := range raw.ConsumerDetails {
		var ch struct {
			ConnectionName string `json:"connection_name"`
		}
		if mgmtjson.DecodeObject(c.ChannelDetails, &ch) && ch.ConnectionName != "" {
			q.ConsumerConnections = append(q.ConsumerConnections, ch.ConnectionName)
		}
	}
	return q, nil
}
