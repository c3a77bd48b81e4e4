package pingreq

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// refusalLogInterval is the least time between two log lines about
// connections refused for a limit; the refusals in between are counted in
// the next line.
const refusalLogInterval = 10 * time.Second

// GuardConfig configures the connection hygiene of a broker's listeners.
type GuardConfig struct {
	// MaxPayload is the load-report size limit of every Conn (see NewConn).
	MaxPayload int
	// ConnectTimeout, BufferAbove and MaxPacketSize are applied to every
	// connection (see ReadLimits).
	ConnectTimeout time.Duration
	BufferAbove    int
	MaxPacketSize  int
	// MaxConnections is the most connections one listener holds at once;
	// more are closed when accepted. 0: no limit.
	MaxConnections int
	// MaxConnectionsPerIP is the most connections one source address holds
	// at once, over all the listeners wrapped by the same Guard; more are
	// closed when accepted. Connections without an IP address (Unix
	// sockets) are not counted. 0: no limit.
	MaxConnectionsPerIP int
	// Write bounds what every connection queues for a slow client (see
	// WriteLimits); the guard counts the drops and failures into its
	// Outbox totals.
	Write WriteLimits
	// Logger receives the (rate-limited) refusal lines; slog.Default()
	// when nil.
	Logger *slog.Logger
}

// Guard enforces connection limits and read limits on the listeners it
// wraps, and counts what it refused and closed. One Guard serves all the
// listeners of a broker, so the per-address limit spans them. Its methods
// are safe for concurrent use.
type Guard struct {
	cfg GuardConfig
	log *slog.Logger

	mu    sync.Mutex
	perIP map[netip.Addr]int

	// Outbox sums the drops and failures of every connection's outbox.
	Outbox OutboxTotals

	connectTimeouts  atomic.Uint64
	refusedListener  atomic.Uint64
	refusedPerIP     atomic.Uint64
	logMu            sync.Mutex
	lastRefusalLog   time.Time
	refusedSinceLast int

	// Shutdown: once closing is set (under admitMu) no connection is
	// admitted, so conns only counts down and may be waited for.
	admitMu sync.Mutex
	closing bool
	conns   sync.WaitGroup
}

// StopAccepting makes the guard close every connection accepted from now
// on before the broker sees it. A broker shutting down calls it first, so
// that no client attaches while it disconnects the others.
func (g *Guard) StopAccepting() {
	g.admitMu.Lock()
	g.closing = true
	g.admitMu.Unlock()
}

// WaitConnections waits until every admitted connection has ended (its
// client is gone from the broker), at most timeout; it reports whether they
// all did. Call it after StopAccepting.
func (g *Guard) WaitConnections(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		g.conns.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// admit counts c as a connection of the broker, or reports false when the
// guard stopped accepting.
func (g *Guard) admit() bool {
	g.admitMu.Lock()
	defer g.admitMu.Unlock()
	if g.closing {
		return false
	}
	g.conns.Add(1)
	return true
}

// GuardStats are a Guard's counters since it was made.
type GuardStats struct {
	// ConnectTimeouts counts connections closed because their CONNECT was
	// not complete within the connect timeout.
	ConnectTimeouts uint64
	// RefusedListenerLimit and RefusedIPLimit count connections closed at
	// accept because their listener, or their source address, was at its
	// limit.
	RefusedListenerLimit uint64
	RefusedIPLimit       uint64
}

// NewGuard returns a Guard with cfg.
func NewGuard(cfg GuardConfig) *Guard {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Guard{cfg: cfg, log: log, perIP: map[netip.Addr]int{}}
}

// Stats returns the guard's counters.
func (g *Guard) Stats() GuardStats {
	return GuardStats{
		ConnectTimeouts:      g.connectTimeouts.Load(),
		RefusedListenerLimit: g.refusedListener.Load(),
		RefusedIPLimit:       g.refusedPerIP.Load(),
	}
}

// WrapListener returns a listener that delegates to l and hands Mochi
// every accepted connection as a *Conn with the guard's read limits, after
// closing those over a connection limit. Like the package's WrapListener
// it works with Mochi's TCP, TLS, Unix socket and Websocket listeners.
func (g *Guard) WrapListener(l listeners.Listener) listeners.Listener {
	return &listener{Listener: l, max: g.cfg.MaxPayload, guard: g}
}

// establish admits c on l or closes it, and runs establish for the
// connection's lifetime (Mochi's establish function returns when the
// client is gone).
func (g *Guard) establish(l *listener, id string, c net.Conn, establish listeners.EstablishFn) error {
	if !g.admit() {
		_ = c.Close() // shutting down
		return nil
	}
	defer g.conns.Done()
	if limit := g.cfg.MaxConnections; limit > 0 {
		if l.active.Add(1) > int64(limit) {
			l.active.Add(-1)
			g.refusedListener.Add(1)
			g.logRefusal("listener limit", id, c.RemoteAddr(), limit)
			_ = c.Close()
			return nil
		}
		defer l.active.Add(-1)
	}
	if limit := g.cfg.MaxConnectionsPerIP; limit > 0 {
		if addr, ok := remoteIP(c); ok {
			if !g.takeIP(addr, limit) {
				g.refusedPerIP.Add(1)
				g.logRefusal("per-address limit", id, c.RemoteAddr(), limit)
				_ = c.Close()
				return nil
			}
			defer g.releaseIP(addr)
		}
	}

	cn := NewConn(c, g.cfg.MaxPayload)
	writeLimits := g.cfg.Write
	writeLimits.Totals = &g.Outbox
	cn.SetWriteLimits(writeLimits)
	if err := cn.SetReadLimits(ReadLimits{
		ConnectTimeout: g.cfg.ConnectTimeout,
		BufferAbove:    g.cfg.BufferAbove,
		MaxPacketSize:  g.cfg.MaxPacketSize,
	}); err != nil {
		_ = c.Close()
		return err
	}
	err := establish(id, cn)
	if cn.ConnectTimedOut() {
		// Counted, not logged one by one: a flood of idle connections
		// must not become a flood of log lines.
		g.connectTimeouts.Add(1)
		g.log.Debug("connection closed: no CONNECT within the connect timeout",
			"listener", id, "remote", c.RemoteAddr(), "timeout", g.cfg.ConnectTimeout)
		return nil
	}
	return err
}

// takeIP counts a connection from addr if it is below limit.
func (g *Guard) takeIP(addr netip.Addr, limit int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perIP[addr] >= limit {
		return false
	}
	g.perIP[addr]++
	return true
}

// releaseIP uncounts a connection from addr.
func (g *Guard) releaseIP(addr netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perIP[addr] <= 1 {
		delete(g.perIP, addr)
		return
	}
	g.perIP[addr]--
}

// logRefusal logs a refused connection, at most once per
// refusalLogInterval; the line counts the refusals not logged before it.
func (g *Guard) logRefusal(limit, listenerID string, remote net.Addr, max int) {
	g.logMu.Lock()
	now := time.Now()
	if !g.lastRefusalLog.IsZero() && now.Sub(g.lastRefusalLog) < refusalLogInterval {
		g.refusedSinceLast++
		g.logMu.Unlock()
		return
	}
	unlogged := g.refusedSinceLast
	g.refusedSinceLast = 0
	g.lastRefusalLog = now
	g.logMu.Unlock()
	g.log.Warn("connection refused: "+limit+" reached", "listener", listenerID, "remote", remote,
		"max", max, "refused_unlogged", unlogged, "log_interval", refusalLogInterval)
}

// remoteIP returns the IP address c comes from, if it has one.
func remoteIP(c net.Conn) (netip.Addr, bool) {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap(), true
	case nil:
		return netip.Addr{}, false
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}, false
		}
		return ap.Addr().Unmap(), true
	}
}
