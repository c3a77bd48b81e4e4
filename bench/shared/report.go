package shared

import (
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Emulation describes the service emulation every live run uses.
const Emulation = "clientsdk.ServiceEmulator: drift-free virtual schedule (a waiting message starts exactly when the previous one ended), 1 lane per subscriber"

// SharedResults is the content of results.json for set A.
type SharedResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Emulation string              `json:"emulation"`
	// Latency defines the measured quantity.
	Latency string      `json:"latency"`
	Notes   []string    `json:"notes,omitempty"`
	Runs    []RunResult `json:"runs"`
}

// loadShared reads an existing results.json, or returns nil.
func loadShared(path string) (*SharedResults, error) {
	return harness.LoadJSON[SharedResults](path)
}

// finite returns a copy of the results for JSON, which has no NaN: NaN statistics
// become -1 (no data).
func (x *SharedResults) finite() *SharedResults {
	c := *x
	c.Runs = make([]RunResult, len(x.Runs))
	for i, r := range x.Runs {
		r.Overall = r.Overall.Finite()
		ps := make([]SubscriberResult, len(r.PerSub))
		for j, s := range r.PerSub {
			s.LatencyStats = s.LatencyStats.Finite()
			ps[j] = s
		}
		r.PerSub = ps
		c.Runs[i] = r
	}
	return &c
}
