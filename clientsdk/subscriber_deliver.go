package clientsdk

// A Subscriber's deliveries: from paho to the handler, with retries and
// dead-lettering, and the acknowledgement back.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// onPublish puts a received message of a group in the pending queue and
// leaves other messages to the application's handlers. When the queue is
// full it blocks, which stops paho reading the connection: back-pressure.
func (s *Subscriber) onPublish(pr paho.PublishReceived) (bool, error) {
	g := s.groupOf(pr.Packet)
	if g == nil {
		return false, nil
	}
	d := &delivery{msg: messageFromPublish(pr.Packet, time.Now()), group: g, pub: pr.Packet, client: pr.Client}
	d.msg.Group = g.Group
	s.received.Add(1)
	s.reporter.noteReceivedOnConnection()
	select {
	case <-s.intake:
		s.discard(d)
		return true, nil
	default:
	}
	s.waiting.Add(1) // before a worker can take it
	select {
	case s.queue <- d:
	default:
		s.log.Debug("pending queue full; reading paused", "capacity", cap(s.queue))
		s.pinger.pauseReading()
		select {
		case s.queue <- d:
			s.pinger.resumeReading()
		case <-s.intake:
			s.pinger.resumeReading()
			s.discardWaiting(d)
			return true, nil
		}
	}
	s.pinger.notePending(s.pendingCount())
	return true, nil
}

// ackOthers acknowledges, after the application's handlers, a QoS 1/2
// message of no group when the Subscriber turned manual acknowledgement on
// and the application did not ask for it.
func (s *Subscriber) ackOthers(pr paho.PublishReceived) (bool, error) {
	if pr.Packet.QoS == 0 || s.groupOf(pr.Packet) != nil {
		return false, nil
	}
	if err := pr.Client.Ack(pr.Packet); err != nil {
		s.log.Debug("acknowledgement of a message of no group not sent", "topic", pr.Packet.Topic, "error", err)
	}
	return false, nil
}

func messageFromPublish(p *paho.Publish, now time.Time) *Message {
	m := &Message{
		Topic:      p.Topic,
		Payload:    p.Payload,
		QoS:        p.QoS,
		Retain:     p.Retain,
		Duplicate:  p.Duplicate(),
		PacketID:   p.PacketID,
		ReceivedAt: now,
	}
	if p.Properties != nil {
		m.ContentType = p.Properties.ContentType
		m.ResponseTopic = p.Properties.ResponseTopic
		m.CorrelationData = p.Properties.CorrelationData
		if len(p.Properties.User) > 0 {
			m.UserProperties = make([]UserProperty, len(p.Properties.User))
			for i, u := range p.Properties.User {
				m.UserProperties[i] = UserProperty{Key: u.Key, Value: u.Value}
			}
		}
	}
	m.ID, _ = m.UserProperty(MessageIDProperty)
	return m
}

// work is one worker: it takes messages from the pending queue until Close
// drains it or abandons work.
func (s *Subscriber) work() {
	defer s.workers.Done()
	for {
		select {
		case d := <-s.queue:
			s.process(d)
		case <-s.drain:
			for s.runCtx.Err() == nil {
				select {
				case d := <-s.queue:
					s.process(d)
				default:
					return
				}
			}
			return
		case <-s.runCtx.Done():
			return
		}
	}
}

// process runs the handler on one message with retries, then acknowledges
// it or dead-letters it.
// The message stops waiting once its first handler call has begun.
func (s *Subscriber) process(d *delivery) {
	var (
		firstFailure time.Time
		lastErr      error
		attempts     int
	)
	for attempts < s.cfg.MaxAttempts {
		if s.runCtx.Err() != nil {
			if attempts == 0 {
				s.discardWaiting(d)
			} else {
				s.discard(d)
			}
			return
		}
		attempts++
		d.msg.Attempt = attempts
		start := s.reporter.begin()
		if attempts == 1 {
			s.pinger.notePending(int(max(s.waiting.Add(-1), 0)))
		}
		err := s.callHandler(d.group.Handler, d.msg)
		end := time.Now()
		s.reporter.finish(start, end)
		if err == nil {
			s.processed.Add(1)
			s.ack(d)
			return
		}
		if s.runCtx.Err() != nil {
			s.discard(d)
			return
		}
		if firstFailure.IsZero() {
			firstFailure = end
		}
		lastErr = err
		s.log.Warn("handler failed", "topic", d.msg.Topic, "attempt", attempts, "of", s.cfg.MaxAttempts, "error", err)
		if attempts < s.cfg.MaxAttempts {
			s.retries.Add(1)
			t := time.NewTimer(retryDelay(s.cfg.RetryBackoff, s.cfg.MaxRetryBackoff, attempts))
			select {
			case <-t.C:
			case <-s.runCtx.Done():
			}
			t.Stop()
		}
	}
	s.failed.Add(1)
	if s.deadLetter(d, attempts, lastErr, firstFailure) {
		s.ack(d)
	}
}

func (s *Subscriber) callHandler(h Handler, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(s.runCtx, m)
}

// ack acknowledges a QoS 1/2 message on the connection it came from. If that
// connection is gone the broker delivers the message again.
func (s *Subscriber) ack(d *delivery) {
	if d.pub.QoS == 0 || s.runCtx.Err() != nil {
		return
	}
	select {
	case <-d.client.Done():
		s.log.Debug("connection closed before acknowledgement; the broker will deliver again", "topic", d.msg.Topic)
		return
	default:
	}
	if err := d.client.Ack(d.pub); err != nil {
		s.log.Debug("acknowledgement not sent; the broker will deliver again", "topic", d.msg.Topic, "error", err)
	}
}

// deadLetter publishes a failed message to the dead-letter topic and says
// whether it was accepted.
func (s *Subscriber) deadLetter(d *delivery, attempts int, lastErr error, firstFailure time.Time) bool {
	pub := &paho.Publish{
		Topic:   d.group.DeadLetterTopic,
		QoS:     1,
		Payload: d.msg.Payload,
		Properties: &paho.PublishProperties{
			ContentType:     d.msg.ContentType,
			ResponseTopic:   d.msg.ResponseTopic,
			CorrelationData: d.msg.CorrelationData,
			User:            toPahoUser(deadLetterProperties(d.msg, attempts, lastErr, firstFailure)),
		},
	}
	ctx, cancel := context.WithTimeout(s.runCtx, 2*s.cfg.ConnectTimeout)
	defer cancel()
	s.mu.Lock()
	cm := s.cm
	s.mu.Unlock()
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		if err = cm.AwaitConnection(ctx); err != nil {
			break
		}
		if _, err = cm.Publish(ctx, pub); err == nil {
			s.deadLettered.Add(1)
			s.log.Warn("message dead-lettered", "topic", d.msg.Topic, "dead_letter_topic", d.group.DeadLetterTopic, "attempts", attempts)
			return true
		}
		if !errors.Is(err, autopaho.ConnectionDownError) {
			break
		}
	}
	s.log.Error("dead-lettering failed; message left unacknowledged", "topic", d.msg.Topic,
		"dead_letter_topic", d.group.DeadLetterTopic, "error", err)
	return false
}
