package clientsdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	ConnectionConfig

	// StampSentAt adds the SentAtProperty User Property (send time in Unix
	// nanoseconds) to every message, for end-to-end latency measurements
	// (see SentAt).
	StampSentAt bool
	// StampMessageID adds a random MessageIDProperty User Property to every
	// message, which consumers use to deduplicate (see Message.ID).
	StampMessageID bool
}

// PublishOptions are the per-message options of Publisher.Publish.
type PublishOptions struct {
	// QoS is 0, 1 or 2.
	QoS byte
	// Retain asks the broker to keep the message for future subscribers.
	Retain bool
	// MessageExpiry, when positive, is the MQTT v5 Message Expiry Interval
	// (rounded up to whole seconds).
	MessageExpiry time.Duration
	// ContentType is the MQTT v5 Content Type property.
	ContentType string
	// UserProperties are sent as MQTT v5 User Properties, before any the
	// Publisher stamps.
	UserProperties []UserProperty
}

// Publisher publishes messages over a connection it keeps up, reconnecting
// when it drops.
type Publisher struct {
	cfg  PublisherConfig
	urls []*url.URL
	log  *slog.Logger

	mu     sync.Mutex
	cm     *autopaho.ConnectionManager
	closed bool
}

// NewPublisher validates cfg and returns a Publisher; Start connects it.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	var err error
	if cfg.ConnectionConfig, err = cfg.ConnectionConfig.withDefaults(); err != nil {
		return nil, err
	}
	urls, err := parseBrokerURLs(cfg.Brokers)
	if err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, urls: urls, log: cfg.Logger.With("client_id", cfg.ClientID)}, nil
}

// Start connects to the broker and returns once connected, or with an error
// if ctx ends first (the Publisher is then closed). The Publisher reconnects
// by itself until Close.
func (p *Publisher) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.cm != nil || p.closed {
		p.mu.Unlock()
		return errors.New("publisher: Start called twice or after Close")
	}
	cm, err := autopaho.NewConnection(context.Background(), autopaho.ClientConfig{
		ServerUrls:                    p.urls,
		TlsCfg:                        p.cfg.TLS,
		KeepAlive:                     p.cfg.keepAliveSeconds(),
		CleanStartOnInitialConnection: true,
		SessionExpiryInterval:         p.cfg.sessionExpirySeconds(),
		ReconnectBackoff:              reconnectBackoff(p.cfg.MaxReconnectWait),
		ConnectTimeout:                p.cfg.ConnectTimeout,
		ConnectUsername:               p.cfg.Username,
		ConnectPassword:               []byte(p.cfg.Password),
		ConnectPacketBuilder:          connectPacketBuilder(nil),
		OnConnectionUp: func(*autopaho.ConnectionManager, *paho.Connack) {
			p.log.Debug("publisher connected")
		},
		OnConnectError: func(err error) {
			p.log.Warn("connection attempt failed", "error", err)
		},
		ClientConfig: paho.ClientConfig{ClientID: p.cfg.ClientID},
	})
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("publisher: connecting to %v: %w", p.cfg.Brokers, err)
	}
	p.cm = cm
	p.mu.Unlock()
	if err := cm.AwaitConnection(ctx); err != nil {
		_ = p.Close(context.Background())
		return fmt.Errorf("publisher: connecting to %v: %w", p.cfg.Brokers, err)
	}
	return nil
}

// Publish sends payload to topic. It waits for the connection if it is down
// and, for QoS 1 and 2, for the broker's acknowledgement, within ctx.
func (p *Publisher) Publish(ctx context.Context, topic string, payload []byte, opts PublishOptions) error {
	if opts.QoS > 2 {
		return fmt.Errorf("publish to %q: QoS %d: want 0, 1 or 2", topic, opts.QoS)
	}
	if topic == "" {
		return errors.New("publish: topic is empty")
	}
	p.mu.Lock()
	cm, closed := p.cm, p.closed
	p.mu.Unlock()
	if cm == nil || closed {
		return fmt.Errorf("publish to %q: publisher not started or closed", topic)
	}
	props := &paho.PublishProperties{ContentType: opts.ContentType}
	if opts.MessageExpiry > 0 {
		s := uint32(min((opts.MessageExpiry+time.Second-1)/time.Second, math.MaxUint32))
		props.MessageExpiry = &s
	}
	for _, u := range opts.UserProperties {
		props.User = append(props.User, paho.UserProperty{Key: u.Key, Value: u.Value})
	}
	if p.cfg.StampMessageID {
		props.User = append(props.User, paho.UserProperty{Key: MessageIDProperty, Value: newMessageID()})
	}
	pub := &paho.Publish{Topic: topic, QoS: opts.QoS, Retain: opts.Retain, Payload: payload, Properties: props}
	for {
		if err := cm.AwaitConnection(ctx); err != nil {
			return fmt.Errorf("publish to %q: waiting for the connection: %w", topic, err)
		}
		if p.cfg.StampSentAt {
			stampSentAt(props, time.Now())
		}
		_, err := cm.Publish(ctx, pub)
		if err == nil {
			return nil
		}
		if !errors.Is(err, autopaho.ConnectionDownError) || ctx.Err() != nil {
			return fmt.Errorf("publish to %q: %w", topic, err)
		}
	}
}

// Close disconnects, waiting within ctx for the disconnection to complete.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	cm, closed := p.cm, p.closed
	p.closed = true
	p.mu.Unlock()
	if cm == nil || closed {
		return nil
	}
	if err := cm.Disconnect(ctx); err != nil {
		return fmt.Errorf("publisher: close: %w", err)
	}
	return nil
}

// stampSentAt sets (or replaces) the SentAtProperty in props.
func stampSentAt(props *paho.PublishProperties, now time.Time) {
	v := strconv.FormatInt(now.UnixNano(), 10)
	for i := range props.User {
		if props.User[i].Key == SentAtProperty {
			props.User[i].Value = v
			return
		}
	}
	props.User = append(props.User, paho.UserProperty{Key: SentAtProperty, Value: v})
}

func newMessageID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
