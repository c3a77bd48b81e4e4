package bridge

import (
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// arrivalBell tells a consume loop that a message reached a queue it found
// empty, the moment RabbitMQ has it. Other sites' routed messages and the
// site's other brokers' publishes arrive unannounced; by polling alone the
// loop saw them at its next look, up to 10 ms later (50 ms at a site that
// had no overflow lately). In runs of luffy-bench sites at 1 s service
// (Montréal busy), a message routed to Berlin, Tunis or Tokyo started 5.6,
// 9.0 and 9.3 ms after the router predicted (medians) with that polling,
// 4.2, 3.4 and 4.5 ms with the bells, as with a poll every millisecond
// (4.2, 3.0, 4.1), without its thousand basic.gets a second.
//
// While armed, the bell is a consumer of the queue with a prefetch of 1
// (set by the loop on its channel: it bounds consumers, not basic.get), so
// RabbitMQ hands it at most one message. The loop arms it only while its
// members have room, and disarms it once it rang or when room runs out: a
// message is never held here for a member that cannot take it.
type arrivalBell struct {
	ch    *amqp.Channel
	queue string
	name  string // consumer tag prefix: the queue and the broker
	seq   int
	tag   string // the armed consumer's tag; "" while disarmed
	rings <-chan amqp.Delivery
}

func newArrivalBell(ch *amqp.Channel, queue, brokerID string) *arrivalBell {
	return &arrivalBell{ch: ch, queue: queue, name: "luffymq-bell-" + queue + "-" + brokerID + "-"}
}

// arm starts the bell's consumer unless it is armed already.
func (a *arrivalBell) arm() error {
	if a.tag != "" {
		return nil
	}
	a.seq++
	tag := a.name + strconv.Itoa(a.seq)
	rings, err := a.ch.Consume(a.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming %s for its arrivals: %w", a.queue, err)
	}
	a.tag, a.rings = tag, rings
	return nil
}

// armed reports whether the bell's consumer is on its queue: RabbitMQ
// hands it the next message that reaches the queue, so while it has not
// rung the queue holds nothing for this broker to take.
func (a *arrivalBell) armed() bool { return a.tag != "" }

// ringing is the channel of the armed bell's message: nil (never ready)
// while disarmed.
func (a *arrivalBell) ringing() <-chan amqp.Delivery {
	if a.tag == "" {
		return nil
	}
	return a.rings
}

// disarm cancels the bell's consumer and returns what RabbitMQ handed it
// before the cancel took effect (at most one message), for the loop to
// deliver or give back.
func (a *arrivalBell) disarm() ([]amqp.Delivery, error) {
	if a.tag == "" {
		return nil, nil
	}
	tag, rings := a.tag, a.rings
	a.tag, a.rings = "", nil
	if err := a.ch.Cancel(tag, false); err != nil {
		return nil, fmt.Errorf("cancelling the arrival consumer of %s: %w", a.queue, err)
	}
	var left []amqp.Delivery
	for d := range rings {
		left = append(left, d)
	}
	return left, nil
}
