package bridge

import amqp "github.com/rabbitmq/amqp091-go"

// ArrivalBell gives the external tests an arrivalBell of queue on ch.
type ArrivalBell struct{ b *arrivalBell }

func NewArrivalBellForTest(ch *amqp.Channel, queue, brokerID string) ArrivalBell {
	return ArrivalBell{newArrivalBell(ch, queue, brokerID)}
}

func (a ArrivalBell) Arm() error                       { return a.b.arm() }
func (a ArrivalBell) Ringing() <-chan amqp.Delivery    { return a.b.ringing() }
func (a ArrivalBell) Disarm() ([]amqp.Delivery, error) { return a.b.disarm() }
