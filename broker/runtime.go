package broker

import (
	"runtime/debug"
	"strings"
)

// DefaultGCPercent is the garbage collector's target luffymq sets when
// neither --gc-percent nor the GOGC environment variable says otherwise.
// Measured with `luffy-bench throughput --systems
// luffymq-adaptive,mosquitto` (same runs, medians of 3, 2 busy cores):
// shared QoS 1 went from 0.69× to 0.79× Mosquitto against Go's default of
// 100, fan-out QoS 1 stayed at 0.76×; peak RSS of one test's broker went
// from 28 to 33 MB at QoS 1 and from 53 to 93 MB while a QoS 0 burst was
// queued. 400 was no faster at QoS 1 shared and doubled that RSS again.
const DefaultGCPercent = 200

// MinGCPercent and MaxGCPercent bound --gc-percent: below 10 the
// collector runs almost continuously; above 10 000 the heap may grow a
// hundredfold before a collection. Turning the collector off is not
// offered: a broker's memory would grow without bound.
const (
	MinGCPercent = 10
	MaxGCPercent = 10000
)

// defaultGCPercent is --gc-percent's default: DefaultGCPercent, or 0
// (leave the runtime's setting) when environ sets GOGC, so an operator's
// GOGC keeps the meaning Go gives it.
func defaultGCPercent(environ []string) int {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOGC=") {
			return 0
		}
	}
	return DefaultGCPercent
}

// ApplyRuntimeSettings sets the process-wide Go runtime settings of c (the
// garbage collector's target) and returns a function that restores the
// previous ones. It changes the whole process, so the luffymq command
// calls it, not New: a program embedding the broker keeps its own.
func ApplyRuntimeSettings(c Config) (restore func()) {
	if c.GCPercent == 0 {
		return func() {}
	}
	previous := debug.SetGCPercent(c.GCPercent)
	return func() { debug.SetGCPercent(previous) }
}
