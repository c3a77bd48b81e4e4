package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// This file holds what lets several brokers share one site's RabbitMQ
// node (see "Several brokers at one site" in the package doc): broker
// identity, the origin rule of imports, the import queue's lifecycle and
// the election of the broker that retunes each work queue for the site.

// headerReceivedFrom is set by RabbitMQ exchange federation on every
// message a federation link carried from another node.
const headerReceivedFrom = "x-received-from"

// DefaultBrokerID derives a broker ID from this host's name and the port of
// listen ("host:port"): "<host>-<port>", each character of the host name
// outside letters, digits, '-' and '_' replaced by '-', cut so the ID fits
// in 64 characters. Without a fixed port (listen empty, unparsable or with
// port 0) the port is replaced by eight random hex digits. Two brokers of
// one host therefore never share a derived ID, and a broker restarted on
// the same host and port keeps its ID (and import queue name).
func DefaultBrokerID(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "luffymq"
	}
	return brokerIDFor(host, listen)
}

// brokerIDFor is DefaultBrokerID on host.
func brokerIDFor(host, listen string) string {
	suffix := ""
	if _, port, err := net.SplitHostPort(listen); err == nil {
		if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65536 {
			suffix = strconv.Itoa(n)
		}
	}
	if suffix == "" {
		suffix = randomHex(4)
	}
	var b strings.Builder
	for i := 0; i < len(host) && b.Len() < 64-1-len(suffix); i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String() + "-" + suffix
}

// BrokerID returns this broker's ID among the brokers of its site.
func (b *Bridge) BrokerID() string { return b.cfg.BrokerID }

// localAlready reports whether this broker's local subscribers already
// had a message taken from the import queue, which is then skipped: its
// origin is this site and either this broker published it or it came back
// through federation (a message of this site reaches every broker of the
// site straight from the site's exchange, never through a federation
// link). Messages of the site's other brokers are injected.
func (b *Bridge) localAlready(h amqp.Table) bool {
	if origin, _ := h[HeaderOrigin].(string); origin != b.cfg.Site {
		return false
	}
	if _, federated := h[headerReceivedFrom]; federated {
		return true
	}
	broker, _ := h[HeaderBroker].(string)
	return broker == b.cfg.BrokerID
}

// ImportQueueInUseError ends a session when another connection consumes
// this broker's import queue: another broker of the site runs with the
// same broker ID, or the connection of a previous process with this ID has
// not been closed by RabbitMQ yet. The bridge keeps retrying.
type ImportQueueInUseError struct {
	Queue, Site, BrokerID string
	// Cause is RabbitMQ's refusal.
	Cause error
}

func (e *ImportQueueInUseError) Error() string {
	return fmt.Sprintf("import queue %s is in use by another connection: another broker of site %s runs with broker ID %s (give each broker its own --broker-id), or RabbitMQ has not yet closed an earlier connection with this ID (%v)",
		e.Queue, e.Site, e.BrokerID, e.Cause)
}

// queueInUse turns RabbitMQ's refusal to delete a queue that has
// consumers (406) or to consume it exclusively (403) into an
// ImportQueueInUseError; other errors are returned unchanged.
func (b *Bridge) queueInUse(err error, code int) error {
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == code {
		return &ImportQueueInUseError{Queue: b.queue, Site: b.cfg.Site, BrokerID: b.cfg.BrokerID, Cause: amqpErr}
	}
	return err
}

// deleteImportQueue deletes the import queue when the bridge closes: no
// other broker reads it and the next process with this ID would recreate
// it anyway. It waits at most 2 s; closing the connection afterwards ends
// a delete RabbitMQ did not answer. A broker that dies without closing
// leaves its queue to expire after Config.QueueExpires without consumer.
func (b *Bridge) deleteImportQueue(conn *amqp.Connection) {
	done := make(chan error, 1)
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(b.queue, false, false, false)
			_ = ch.Close()
		}
		done <- err
	}()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			b.log.Warn("bridge: could not delete the import queue on close; it expires when unused", "queue", b.queue, "expires_after", b.cfg.QueueExpires, "error", err)
		}
	case <-t.C:
		b.log.Warn("bridge: RabbitMQ did not answer the import queue's deletion on close; it expires when unused", "queue", b.queue, "expires_after", b.cfg.QueueExpires)
	}
}

// RetuneOwnerQueueName returns the exclusive queue of group g at a site:
// the broker whose connection holds it retunes wq.<g> for the whole site,
// and the site's other brokers send it their share of the group's
// capacity: "luffymq.wqowner.<g>".
func RetuneOwnerQueueName(g string) string { return "luffymq.wqowner." + g }

// RetuneOwner reports whether this broker currently retunes group g's work
// queue for its site (see the package doc).
func (b *Bridge) RetuneOwner(group string) bool {
	b.wqMu.Lock()
	defer b.wqMu.Unlock()
	return b.wqStates[group].owner
}

// capacityShare is one broker's part of a group's capacity, sent each
// RetuneInterval by every broker of the site that does not retune the
// group to the one that does.
type capacityShare struct {
	Broker    string  `json:"broker"`
	Online    int     `json:"online"`
	Available float64 `json:"available"`
	// Unacked counts the messages the broker took from the group's queues
	// and has not settled (its part of eq. 2.14).
	Unacked int `json:"unacked"`
	// ValidMs is how long the share stands: three of the sender's retune
	// intervals. A broker that stops sending drops out of the sum then.
	ValidMs int64 `json:"valid_ms"`
}

// siteShares sums the shares of a site's brokers for one group.
type siteShares struct {
	self  string
	peers map[string]timedShare // by broker ID
}

type timedShare struct {
	share capacityShare
	until time.Time
}

// add records a peer's share received at now; it reports false for a
// share that carries this broker's own ID.
func (s *siteShares) add(sh capacityShare, now time.Time) bool {
	if sh.Broker == s.self {
		return false
	}
	if s.peers == nil {
		s.peers = map[string]timedShare{}
	}
	s.peers[sh.Broker] = timedShare{share: sh, until: now.Add(time.Duration(max(sh.ValidMs, 1)) * time.Millisecond)}
	return true
}

// sum returns the site's capacity (own plus every peer share still valid
// at now, eq. 2.12 applied to the summed availability) and its
// unacknowledged messages, forgetting expired shares.
func (s *siteShares) sum(c WorkQueueConfig, own Capacity, ownUnacked int, now time.Time) (Capacity, int) {
	site, unacked := Capacity{Online: own.Online, Available: own.Available}, ownUnacked
	for id, p := range s.peers {
		if now.After(p.until) {
			delete(s.peers, id)
			continue
		}
		site.Online += max(p.share.Online, 0)
		site.Available += max(p.share.Available, 0)
		unacked += max(p.share.Unacked, 0)
	}
	site.MaxLength, site.TTL = c.limits(site.Available)
	return site, unacked
}

// groupRetune is one group's retune ownership during a session.
type groupRetune struct {
	owner  bool
	adopt  bool                 // owner that has not read the current weights back yet
	shares <-chan amqp.Delivery // the owner queue's messages, while owner
	site   siteShares
	warned bool // a peer with this broker's ID was reported
}

// retuneCoordinator elects, per group, the one broker of the site that
// retunes the group's work queue, and carries the other brokers' capacity
// shares to it. It lives for one session and is used by the retune loop
// only.
type retuneCoordinator struct {
	b       *Bridge
	conn    *amqp.Connection
	ch      *amqp.Channel // confirm mode: shares, published mandatory
	returns chan amqp.Return
	seq     atomic.Uint64
	groups  map[string]*groupRetune
}

func (b *Bridge) newRetuneCoordinator(conn *amqp.Connection) (*retuneCoordinator, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening capacity share channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("enabling confirms on the capacity share channel: %w", err)
	}
	rc := &retuneCoordinator{b: b, conn: conn, ch: ch, returns: make(chan amqp.Return, 16), groups: map[string]*groupRetune{}}
	ch.NotifyReturn(rc.returns)
	return rc, nil
}

// retuneTurn is what the coordinator decided for one group in one retune.
type retuneTurn struct {
	owner   bool     // this broker retunes the group
	adopt   bool     // it must read the current weights back first
	site    Capacity // the site's capacity (owner only)
	unacked int      // the site's unacknowledged messages (owner only)
}

// turn runs one retune turn of group g: a broker that does not own the
// group sends its share to the owner, and claims the ownership when nobody
// holds it; the owner sums the shares it received.
func (rc *retuneCoordinator) turn(ctx context.Context, g *workGroup, own Capacity, ownUnacked int) (retuneTurn, error) {
	gr := rc.groups[g.name]
	if gr == nil {
		gr = &groupRetune{site: siteShares{self: rc.b.cfg.BrokerID}}
		rc.groups[g.name] = gr
	}
	var out retuneTurn
	if !gr.owner {
		routed, err := rc.sendShare(ctx, g, own, ownUnacked)
		if err != nil || routed {
			return out, err
		}
		claimed, err := rc.claim(gr, g)
		if err != nil || !claimed {
			return out, err
		}
		rc.b.log.Debug("bridge: this broker now retunes the work queue for the site", "queue", g.queue())
	}
	now := time.Now()
	for drained := false; !drained; {
		select {
		case d, ok := <-gr.shares:
			if !ok {
				// The owner queue was deleted under us: claim again next turn.
				gr.owner, gr.shares = false, nil
				return out, nil
			}
			var sh capacityShare
			if err := json.Unmarshal(d.Body, &sh); err != nil || !validName(sh.Broker) {
				rc.b.log.Debug("bridge: dropping malformed capacity share", "queue", RetuneOwnerQueueName(g.name))
				continue
			}
			if !gr.site.add(sh, now) && !gr.warned {
				gr.warned = true
				rc.b.log.Error("bridge: another broker of this site uses this broker's ID; give each broker its own --broker-id", "broker_id", sh.Broker, "site", rc.b.cfg.Site)
			}
		default:
			drained = true
		}
	}
	out.owner, out.adopt = true, gr.adopt
	out.site, out.unacked = gr.site.sum(rc.b.cfg.WorkQueue, own, ownUnacked, now)
	return out, nil
}

// sendShare publishes this broker's share to g's owner queue, mandatory
// and confirmed: it reports whether some broker holds the queue (RabbitMQ
// returns the message before confirming it when no queue has that name).
func (rc *retuneCoordinator) sendShare(ctx context.Context, g *workGroup, own Capacity, unacked int) (bool, error) {
	body, err := json.Marshal(capacityShare{
		Broker: rc.b.cfg.BrokerID, Online: own.Online, Available: own.Available, Unacked: unacked,
		ValidMs: 3 * rc.b.cfg.WorkQueue.RetuneInterval.Milliseconds(),
	})
	if err != nil {
		return false, err
	}
	id := rc.b.cfg.BrokerID + "-" + strconv.FormatUint(rc.seq.Add(1), 10)
	q := RetuneOwnerQueueName(g.name)
	dc, err := rc.ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
		ContentType: "application/json", MessageId: id, Body: body,
	})
	if err != nil {
		return false, fmt.Errorf("sending capacity share to %s: %w", q, err)
	}
	if _, err := dc.WaitContext(ctx); err != nil {
		return true, nil // the session is ending
	}
	routed := true
	for drained := false; !drained; {
		select {
		case r := <-rc.returns:
			if r.MessageId == id {
				routed = false
			}
		default:
			drained = true
		}
	}
	return routed, nil
}

// claim declares g's owner queue exclusive to this connection; it reports
// false when another broker's connection got it first.
func (rc *retuneCoordinator) claim(gr *groupRetune, g *workGroup) (bool, error) {
	q := RetuneOwnerQueueName(g.name)
	ch, err := rc.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("opening retune owner channel: %w", err)
	}
	if _, err := ch.QueueDeclare(q, false, false, true, false, nil); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.ResourceLocked {
			return false, nil // the server closed ch
		}
		return false, fmt.Errorf("declaring retune owner queue %s: %w", q, err)
	}
	shares, err := ch.Consume(q, "luffymq-retune-"+rc.b.cfg.BrokerID, true, true, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consuming retune owner queue %s: %w", q, err)
	}
	gr.owner, gr.adopt, gr.shares, gr.site.peers = true, true, shares, nil
	return true, nil
}

// adopted records that the owner of group g read the current weights back.
func (rc *retuneCoordinator) adopted(g string) {
	if gr := rc.groups[g]; gr != nil {
		gr.adopt = false
	}
}
