package bridge

// Small helpers for AMQP channels, queues and errors.

import (
	"errors"
	"net/http"

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
