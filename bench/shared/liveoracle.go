package shared

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// liveOracleHook picks shared-group members for SystemLiveOracle, or for
// SystemLiveInformedOracle when informed is set.
type liveOracleHook struct {
	mqtt.HookBase
	// informed predicts from each member's queue and mean service time
	// (memberWorker.expectedStart) instead of its exact schedule.
	informed bool

	mu       sync.Mutex
	run      *liveRun
	idPrefix string // members' client IDs are idPrefix + member number
}

func (h *liveOracleHook) ID() string { return "luffy-bench-live-oracle" }

func (h *liveOracleHook) Provides(b byte) bool { return b == mqtt.OnSelectSubscribers }

// attach gives the hook the run whose members it routes to, before they
// connect.
func (h *liveOracleHook) attach(run *liveRun, idPrefix string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.run, h.idPrefix = run, idPrefix
}

// OnSelectSubscribers gives each shared group's copy of the message to the
// member predicted to start it first, and books it there.
func (h *liveOracleHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	h.mu.Lock()
	run, prefix := h.run, h.idPrefix
	h.mu.Unlock()
	seq, _, ok := harness.DecodePayload(pk.Payload)
	if run == nil || !ok {
		return subs // not a benchmark message: Mochi's own choice
	}
	now := time.Now()
	for _, members := range subs.Shared {
		var best *memberWorker
		var bestID string
		var bestStart time.Time
		for id := range members {
			n, err := strconv.Atoi(strings.TrimPrefix(id, prefix))
			if err != nil || !strings.HasPrefix(id, prefix) {
				continue
			}
			w := run.worker(n - 1)
			if w == nil {
				continue
			}
			start := w.predictedStart(now)
			if h.informed {
				start = w.expectedStart(now)
			}
			if best == nil || start.Before(bestStart) {
				best, bestID, bestStart = w, id, start
			}
		}
		if best == nil {
			continue
		}
		best.book(seq, bestStart)
		sub := members[bestID]
		if prev, ok := subs.SharedSelected[bestID]; ok {
			sub = prev.Merge(sub)
		}
		subs.SharedSelected[bestID] = sub
	}
	return subs
}

// liveOracleBroker is the in-process broker of SystemLiveOracle.
type liveOracleBroker struct {
	*harness.MochiBroker
	hook *liveOracleHook
}

// attach hands the hook the run whose members it routes to.
func (b *liveOracleBroker) attach(run *liveRun, idPrefix string) { b.hook.attach(run, idPrefix) }

// startLiveOracleBroker is BrokerStarter.LiveOracle: the live oracle
// (informed: the informed live oracle), logging to logPath.
func startLiveOracleBroker(logPath string, informed bool) (harness.RunningBroker, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("live oracle log: %w", err)
	}
	br, err := startLiveOracle(slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn})), informed)
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	return closingWith{br, logFile.Close}, nil
}

func startLiveOracle(logger *slog.Logger, informed bool) (*liveOracleBroker, error) {
	hook := &liveOracleHook{informed: informed}
	br, err := harness.StartVanillaMochi("127.0.0.1:0", logger, hook)
	if err != nil {
		return nil, err
	}
	return &liveOracleBroker{MochiBroker: br, hook: hook}, nil
}

// closingWith is a running broker that also closes something of its own
// (the in-process live oracle's log file) when it stops.
type closingWith struct {
	*liveOracleBroker
	also func() error
}

func (c closingWith) Close() error { return errors.Join(c.liveOracleBroker.Close(), c.also()) }
