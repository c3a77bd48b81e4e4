// Package broker assembles a running LuffyMQ broker from a Config: Mochi
// MQTT with listeners that lift load reports off extended PINGREQs, the
// load-aware selection hook, authentication, and the HTTP server for
// health, status and metrics.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/internal/logthrottle"
	"github.com/luffymq/luffymq/scoring"
)

// Broker is a LuffyMQ broker built from a Config.
type Broker struct {
	cfg       Config
	log       *slog.Logger
	server    *mqtt.Server
	engine    *scoring.Engine
	selection *hooks.SelectionHook
	// topicRules enforces the '$' and $luffy/ topic rules and answers
	// every ACL check, consulting the auth hook.
	topicRules *hooks.TopicRulesHook
	reconnect  *hooks.ReconnectOrderHook
	takeover   *hooks.TakeoverHook
	tlsConfig  *tls.Config
	// httpTLSConfig serves HTTP over TLS (nil: plain HTTP).
	httpTLSConfig *tls.Config
	authData      []byte
	bridge        *bridge.Bridge
	guard         *pingreq.Guard
	persist       *persistence // nil without DataDir
	live          *liveState   // history and event streams (events.go)

	mu        sync.Mutex
	started   bool
	mqtt      listeners.Listener
	http      *http.Server
	httpAddr  string
	httpDone  chan struct{}
	closeOnce sync.Once

	// connections counts accepted MQTT connections for the metrics.
	connections *hooks.ConnectionCounterHook

	// pacing makes publishers wait for clients draining a full write
	// queue; nil with publisher pacing off.
	pacing *hooks.PacingHook

	// trim returns freed memory to the OS after connection storms; nil
	// when off or not started.
	trim *memTrimLoop
}

// New validates cfg, reads the files it names and builds a broker. Nothing
// listens until Start.
func New(cfg Config) (*Broker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Broker{cfg: cfg, log: cfg.Logger}
	if cfg.TLSListen != "" {
		cert, err := loadKeyPair("tls-cert", "tls-key", cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, err
		}
		b.tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if b.httpTLSConfig, err = httpTLSConfig(cfg); err != nil {
		return nil, err
	}
	if cfg.AuthFile != "" {
		if b.authData, err = readAuthFile(cfg.AuthFile); err != nil {
			return nil, err
		}
	}
	b.engine, err = scoring.NewEngine(scoring.Config{
		Strategy:       cfg.Strategy,
		ReportInterval: cfg.ReportInterval,
		StaleAfter:     cfg.StaleAfter,
		Clock:          cfg.Clock,
		HoldLead:       lateBindingLead(cfg),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}

	capabilities := mqtt.NewDefaultServerCapabilities()
	// Mochi allocates a packet's whole remaining length before reading
	// it; without a limit one client could make it allocate 256 MiB.
	capabilities.MaximumPacketSize = uint32(cfg.MaxPacketSize)
	// Mochi's per-client write queue: what --max-pending-writes says, or
	// sized from the outbox, which bounds the bytes (see PendingWritesFor).
	capabilities.MaximumClientWritesPending = int32(PendingWritesFor(cfg.MaxQueuedBytes))
	if cfg.MaxPendingWrites > 0 {
		capabilities.MaximumClientWritesPending = int32(cfg.MaxPendingWrites)
	}
	// A session's QoS≥1 messages, in flight or waiting (offline or past
	// its Receive Maximum).
	capabilities.MaximumInflight = uint16(cfg.MaxSessionMessages)
	// Connection hygiene: idle connections are closed after the connect
	// timeout, and packets over 64 KiB are held by the connection wrapper
	// until their bytes have arrived, so Mochi never allocates a length a
	// client only declared.
	b.guard = pingreq.NewGuard(pingreq.GuardConfig{
		MaxPayload:          report.MaxPayload,
		ConnectTimeout:      max(cfg.ConnectTimeout, 0),
		BufferAbove:         pingreq.DefaultBufferAbove,
		MaxPacketSize:       cfg.MaxPacketSize,
		MaxConnections:      cfg.MaxConnections,
		MaxConnectionsPerIP: cfg.MaxConnectionsPerIP,
		Write:               pingreq.WriteLimits{Timeout: cfg.WriteTimeout, MaxQueuedBytes: cfg.MaxQueuedBytes},
		Logger:              cfg.Logger,
	})
	b.server = mqtt.New(&mqtt.Options{
		// Mochi logs a line per delivery it drops and per connection
		// that ends with an error; the same line at most every
		// mochiLogEvery, with the count held back.
		Logger:       mochiLogger(cfg.Logger),
		Capabilities: capabilities,
		// Allocated per client at connect (see Config.ReadBufferBytes).
		ClientNetReadBufferSize: cfg.ReadBufferBytes,
		InlineClient:            cfg.AMQPURL != "", // the bridge injects remote messages through it
	})
	// A client reconnecting while Mochi still tears down its previous
	// connection waits for the teardown, before any hook sees it (see
	// hooks.ReconnectOrderHook).
	if b.reconnect, err = hooks.NewReconnectOrderHook(b.server, 0); err != nil {
		return nil, err
	}
	if err := b.server.AddHook(b.reconnect, nil); err != nil {
		return nil, fmt.Errorf("adding reconnect order hook: %w", err)
	}
	// The topic rules hook goes before every other: it keeps '$' topics
	// from shared groups with a leading wildcard before any hook picks a
	// member, and it alone answers ACL checks (Mochi allows what any hook
	// allows), asking the auth hook added below for what the rules allow.
	var access mqtt.Hook = new(auth.AllowHook)
	if b.authData != nil {
		access = new(auth.Hook)
	}
	if b.topicRules, err = hooks.NewTopicRulesHook(hooks.TopicRulesConfig{Access: access}); err != nil {
		return nil, err
	}
	// $queue/<filter> becomes $share/$queue/<filter> before any hook
	// sees the filter.
	if err := b.server.AddHook(new(QueueAliasHook), nil); err != nil {
		return nil, fmt.Errorf("adding $queue alias hook: %w", err)
	}
	// Publisher pacing waits in the ACL check of each delivery, which it
	// never allows: it must come before the topic rules hook, which
	// answers (Mochi stops at the first hook that allows).
	if cfg.PublisherPacingMaxWait > 0 {
		if b.pacing, err = hooks.NewPacingHook(hooks.PacingConfig{Server: b.server, MaxWait: cfg.PublisherPacingMaxWait}); err != nil {
			return nil, fmt.Errorf("%w: publisher pacing: %w", ErrInvalidConfig, err)
		}
		if err := b.server.AddHook(b.pacing, nil); err != nil {
			return nil, fmt.Errorf("adding publisher pacing hook: %w", err)
		}
	}
	if err := b.server.AddHook(b.topicRules, nil); err != nil {
		return nil, fmt.Errorf("adding topic rules hook: %w", err)
	}
	// The bridge hook goes first: for exported groups it decides which
	// messages reach the group before the selection hook picks the member.
	if cfg.AMQPURL != "" {
		wq := cfg.WorkQueue
		wq.ManagementURL, wq.Load = cfg.AMQPManagementURL, b.engine
		b.bridge, err = bridge.New(bridge.Config{
			Site:         cfg.Site,
			BrokerID:     cfg.BrokerID,
			AMQPURL:      cfg.AMQPURL,
			Exports:      cfg.Exports,
			ExportGroups: cfg.ExportGroups,
			Logger:       cfg.Logger,
			WorkQueue:    wq,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if err := b.bridge.Attach(b.server); err != nil {
			return nil, err
		}
	}
	// One record of delivery order, shared by the selection hook and the
	// store, so resumed sessions get their messages in order, after a
	// restart too.
	order := hooks.NewDeliveryOrder(uint64(time.Now().UnixNano()))
	selCfg := hooks.SelectionConfig{
		DeliveryOrder:   order,
		Engine:          b.engine,
		Server:          b.server,
		ReportInterval:  cfg.ReportInterval,
		RedispatchGrace: cfg.RedispatchGrace,
	}
	if b.bridge != nil {
		selCfg.RequeuedElsewhere = b.bridge.ExportsGroup
	}
	b.selection, err = hooks.NewSelectionHook(selCfg)
	if err != nil {
		return nil, err
	}
	// Re-dispatch deletes what it takes out of a session from the store.
	b.selection.SetInflightStorage(storedInflight{b})
	if cfg.AckTimeout > 0 {
		ackTimeout, err := hooks.NewAckTimeoutHook(hooks.AckTimeoutConfig{Selection: b.selection, Timeout: cfg.AckTimeout})
		if err != nil {
			return nil, fmt.Errorf("%w: ack-timeout: %w", ErrInvalidConfig, err)
		}
		// Before the selection hook, as AckTimeoutHook asks.
		if err := b.server.AddHook(ackTimeout, nil); err != nil {
			return nil, fmt.Errorf("adding ack timeout hook: %w", err)
		}
	}
	// No outbound topic aliases for sessions that can resume: Mochi
	// resends their messages under the old connection's aliases.
	if err := b.server.AddHook(new(hooks.SessionTopicAliasHook), nil); err != nil {
		return nil, fmt.Errorf("adding session topic alias hook: %w", err)
	}
	// Before the selection hook: deliveries it moves to a resumed session
	// must be written before the connection orders the resent ones.
	b.takeover = hooks.NewTakeoverHook(b.server)
	b.takeover.Order = order
	b.takeover.Restore = func(cl *mqtt.Client, pk packets.Packet) {
		if p := b.persist; p != nil {
			p.store.OnQosPublish(cl, pk, pk.Created, 0)
		}
	}
	if err := b.server.AddHook(b.takeover, nil); err != nil {
		return nil, fmt.Errorf("adding takeover hook: %w", err)
	}
	if err := b.server.AddHook(b.selection, nil); err != nil {
		return nil, fmt.Errorf("adding selection hook: %w", err)
	}
	// The bridge's wake hook goes after the selection hook: it wakes the
	// work-queue pull loops on a member's PUBACK, PUBCOMP or disconnection,
	// and they must find the engine already counting it, or they see the
	// member still busy and sleep up to 10 ms before looking again.
	if b.bridge != nil {
		if err := b.server.AddHook(b.bridge.WakeHook(), nil); err != nil {
			return nil, fmt.Errorf("adding bridge wake hook: %w", err)
		}
	}
	b.connections = new(hooks.ConnectionCounterHook)
	if err := b.server.AddHook(b.connections, nil); err != nil {
		return nil, fmt.Errorf("adding connection counter hook: %w", err)
	}
	if b.live, err = newLiveState(b); err != nil {
		return nil, fmt.Errorf("adding session times hook: %w", err)
	}
	if b.authData != nil {
		if err := b.server.AddHook(hooks.WithoutACLCheck(access), &auth.Options{Data: b.authData}); err != nil {
			return nil, fmt.Errorf("%w: auth-file %s: %w", ErrInvalidConfig, cfg.AuthFile, err)
		}
	} else {
		if err := b.server.AddHook(hooks.WithoutACLCheck(access), nil); err != nil {
			return nil, fmt.Errorf("adding allow-all hook: %w", err)
		}
	}
	// Persistence goes last: its journal records a publish as the other
	// hooks left it.
	if cfg.DataDir != "" {
		if b.persist, err = attachPersistence(b.server, cfg.DataDir, cfg.Fsync, order, cfg.Logger); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// mochiLogEvery is how often Mochi's log may repeat a line.
const mochiLogEvery = 10 * time.Second

// mochiLogger is the logger Mochi gets: log, with repeated lines held back.
func mochiLogger(log *slog.Logger) *slog.Logger {
	return slog.New(logthrottle.New(log.Handler(), mochiLogEvery))
}

// Bridge returns the site bridge, or nil when AMQPURL is empty.
func (b *Broker) Bridge() *bridge.Bridge { return b.bridge }

// Engine returns the selection engine (for status views and tests).
func (b *Broker) Engine() *scoring.Engine { return b.engine }

// TopicRules returns the topic rules hook (for its counters).
func (b *Broker) TopicRules() *hooks.TopicRulesHook { return b.topicRules }

// Selection returns the selection hook (for its counters).
func (b *Broker) Selection() *hooks.SelectionHook { return b.selection }

// Server returns the underlying Mochi server.
func (b *Broker) Server() *mqtt.Server { return b.server }

// Start opens the listeners and serves in the background. It returns an
// error naming the address that could not be opened.
func (b *Broker) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return errors.New("broker already started")
	}
	if b.cfg.AuthFile == "" {
		b.log.Warn(anonymousAccessWarning(b.cfg))
	}
	add := func(l listeners.Listener) error {
		return b.server.AddListener(b.guard.WrapListener(l))
	}
	if b.cfg.MQTTListen != "" {
		tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: b.cfg.MQTTListen})
		if err := add(tcp); err != nil {
			return fmt.Errorf("listen %s: %w", b.cfg.MQTTListen, err)
		}
		b.mqtt = tcp
	}
	if b.cfg.TLSListen != "" {
		l := listeners.NewTCP(listeners.Config{ID: "tls", Address: b.cfg.TLSListen, TLSConfig: b.tlsConfig})
		if err := add(l); err != nil {
			b.closeListeners()
			return fmt.Errorf("tls-listen %s: %w", b.cfg.TLSListen, err)
		}
	}
	if b.cfg.WSListen != "" {
		// Mochi's websocket listener binds in Serve; check the address now
		// so a bad one fails Start instead of being logged later.
		probe, err := net.Listen("tcp", b.cfg.WSListen)
		if err != nil {
			b.closeListeners()
			return fmt.Errorf("ws-listen %s: %w", b.cfg.WSListen, err)
		}
		_ = probe.Close()
		if err := add(listeners.NewWebsocket(listeners.Config{ID: "ws", Address: b.cfg.WSListen})); err != nil {
			b.closeListeners()
			return fmt.Errorf("ws-listen %s: %w", b.cfg.WSListen, err)
		}
	}
	if b.cfg.HTTPListen != "" {
		ln, err := b.listenHTTP()
		if err != nil {
			b.closeListeners()
			return fmt.Errorf("http %s: %w", b.cfg.HTTPListen, err)
		}
		b.httpAddr = ln.Addr().String()
		b.http = &http.Server{Handler: b.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
		b.httpDone = make(chan struct{})
		go func() {
			defer close(b.httpDone)
			if err := b.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("http server stopped", "error", err)
			}
		}()
	}
	if err := b.server.Serve(); err != nil {
		return fmt.Errorf("starting mqtt server: %w", err)
	}
	if b.bridge != nil {
		// Never fails for an unreachable RabbitMQ: the bridge retries.
		if err := b.bridge.Start(context.Background()); err != nil {
			return fmt.Errorf("starting bridge: %w", err)
		}
	}
	b.live.start()
	if b.cfg.MemoryTrimStep > 0 {
		info := b.server.Info
		heap := newHeapReader() // read by the trim loop only
		b.trim = newMemTrimLoop(b.cfg.MemoryTrimStep, func() counts {
			return counts{accepted: b.connections.Accepted.Load(), connected: atomic.LoadInt64(&info.ClientsConnected),
				subscriptions: atomic.LoadInt64(&info.Subscriptions), heap: heap.read()}
		}, b.log)
		b.trim.start()
	}
	b.started = true
	b.log.Info("luffymq started", "mqtt", b.mqttAddrLocked(), "tls", b.cfg.TLSListen, "ws", b.cfg.WSListen,
		"http", b.httpAddr, "strategy", b.cfg.Strategy, "report_interval", b.cfg.ReportInterval)
	return nil
}

func (b *Broker) closeListeners() {
	b.server.Listeners.CloseAll(func(string) {})
}

// MQTTAddr returns the address the plain TCP listener is bound to (with the
// real port when configured as :0), or "" if there is none.
func (b *Broker) MQTTAddr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mqttAddrLocked()
}

// mqttAddrLocked is MQTTAddr for callers holding b.mu.
func (b *Broker) mqttAddrLocked() string {
	if b.mqtt == nil {
		return ""
	}
	return b.mqtt.Address()
}

// HTTPAddr returns the address the HTTP server is bound to, or "".
func (b *Broker) HTTPAddr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.httpAddr
}

// Close stops the listeners, disconnects clients and stops the HTTP server.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.live.stop() // ends the event streams, so the HTTP server can shut down
		b.mu.Lock()
		started := b.started
		if b.trim != nil {
			b.trim.close()
		}
		b.mu.Unlock()
		if b.bridge != nil {
			_ = b.bridge.Close() // before the server, so nothing is injected into a closed broker
		}
		if started {
			b.disconnectClients(5 * time.Second)
			err = b.server.Close() // stops every hook, the storage hook too
		} else if b.persist != nil {
			err = b.persist.close()
		}
		if b.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if herr := b.http.Shutdown(ctx); herr != nil && err == nil {
				err = herr
			}
			<-b.httpDone
		}
	})
	return err
}

// disconnectClients stops every client connection and waits, at most
// timeout, for Mochi to finish with them. Mochi 2.7.9's Close lists a
// listener's clients while holding the clients' read lock and takes it
// again inside (Clients.GetByListener calls Len); a client removing
// itself at that moment waits for the write lock and both block forever.
// With every client already gone, Close finds nothing to race with. New
// connections are refused first, so none attaches meanwhile (a client
// reconnecting at once would otherwise keep Close waiting for it).
func (b *Broker) disconnectClients(timeout time.Duration) {
	b.guard.StopAccepting()
	deadline := time.Now().Add(timeout)
	for {
		// Again each round: a connection admitted just before may have
		// attached its client since.
		for _, cl := range b.server.Clients.GetAll() {
			cl.Stop(errBrokerClosing)
		}
		if b.guard.WaitConnections(50 * time.Millisecond) {
			return
		}
		if time.Now().After(deadline) {
			b.log.Warn("clients still finishing at shutdown", "timeout", timeout)
			return
		}
	}
}

// errBrokerClosing is the stop cause of clients disconnected at shutdown.
var errBrokerClosing = errors.New("broker shutting down")

// lateBindingLead is the engine's HoldLead: cfg.HoldLead, except with
// persistence, since held messages are in memory only.
func lateBindingLead(cfg Config) time.Duration {
	if cfg.DataDir != "" {
		return 0
	}
	return cfg.HoldLead
}
