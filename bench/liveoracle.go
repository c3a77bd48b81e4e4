package bench

import (
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// SystemLiveOracle is vanilla Mochi MQTT in luffy-bench's own process with
// a selection hook that sees the members' true state: each message goes
// to the member that will start it first, from the member's real schedule
// (the emulator's end of its last service) plus the exact work of what was
// sent to it and not yet started. Unlike the replayed oracle it routes
// through a real broker and pays the run's delivery delays, acks and
// reports included; it is the reference a live policy can be held to. Like
// the replayed oracle it is greedy (earliest start for each message in
// turn), not a proven lower bound: at 100 % utilisation on a loaded
// machine adaptive has beaten it (thesis-2, thesis-format reporters:
// 35.9 ms against 42.0 ms, medians of 2 runs).
const SystemLiveOracle = "live-oracle"

// liveOracleHook picks shared-group members for SystemLiveOracle.
type liveOracleHook struct {
	mqtt.HookBase

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
	seq, _, ok := decodePayload(pk.Payload)
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
			if start := w.predictedStart(now); best == nil || start.Before(bestStart) {
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
	*mochiBroker
	hook *liveOracleHook
}

// attach hands the hook the run whose members it routes to.
func (b *liveOracleBroker) attach(run *liveRun, idPrefix string) { b.hook.attach(run, idPrefix) }

func startLiveOracle(logger *slog.Logger) (*liveOracleBroker, error) {
	hook := new(liveOracleHook)
	br, err := startVanillaMochi("127.0.0.1:0", logger, hook)
	if err != nil {
		return nil, err
	}
	return &liveOracleBroker{mochiBroker: br, hook: hook}, nil
}
