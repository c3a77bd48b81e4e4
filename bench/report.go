package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// Emulation describes the service emulation every live run uses.
const Emulation = "clientsdk.ServiceEmulator: drift-free virtual schedule (a waiting message starts exactly when the previous one ended), 1 lane per subscriber"

// MachineInfo describes where the benchmarks ran.
type MachineInfo struct {
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Mosquitto string `json:"mosquitto,omitempty"`
	Mochi     string `json:"mochi"`
}

func machineInfo(mosquittoBin string) MachineInfo {
	m := MachineInfo{CPU: cpuModel(), Cores: runtime.NumCPU(), GoVersion: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, Mosquitto: mosquittoVersion(mosquittoBin), Mochi: mochiVersion()}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// SharedResults is the content of results.json for set A.
type SharedResults struct {
	Generated time.Time   `json:"generated"`
	Machine   MachineInfo `json:"machine"`
	Emulation string      `json:"emulation"`
	// Latency defines the measured quantity.
	Latency string      `json:"latency"`
	Notes   []string    `json:"notes,omitempty"`
	Runs    []RunResult `json:"runs"`
}

// loadShared reads an existing results.json, or returns nil.
func loadShared(path string) (*SharedResults, error) {
	return loadJSON[SharedResults](path)
}

// loadJSON reads the JSON file at path into a new T, or returns nil when
// there is no such file.
func loadJSON[T any](path string) (*T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := new(T)
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(sanitize(v), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// sanitize round-trips v through a NaN-free representation: JSON has no
// NaN, so NaN statistics become null.
func sanitize(v any) any {
	switch x := v.(type) {
	case *SharedResults:
		c := *x
		c.Runs = make([]RunResult, len(x.Runs))
		for i, r := range x.Runs {
			r.Overall = r.Overall.finite()
			ps := make([]SubscriberResult, len(r.PerSub))
			for j, s := range r.PerSub {
				s.LatencyStats = s.LatencyStats.finite()
				ps[j] = s
			}
			r.PerSub = ps
			c.Runs[i] = r
		}
		return &c
	}
	return v
}

// finite replaces NaNs by -1 (no data), as JSON cannot hold NaN.
func (l LatencyStats) finite() LatencyStats {
	f := func(v float64) float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return -1
		}
		return v
	}
	return LatencyStats{Count: l.Count, Mean: f(l.Mean), P50: f(l.P50), P99: f(l.P99), Max: f(l.Max)}
}

func (l LatencyStats) unfinite() LatencyStats {
	f := func(v float64) float64 {
		if v < 0 {
			return math.NaN()
		}
		return v
	}
	return LatencyStats{Count: l.Count, Mean: f(l.Mean), P50: f(l.P50), P99: f(l.P99), Max: f(l.Max)}
}

// fmtMs formats milliseconds for tables.
func fmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// fmtRatio formats a ratio column.
func fmtRatio(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 100:
		return fmt.Sprintf("%.0f×", v)
	case v >= 10:
		return fmt.Sprintf("%.1f×", v)
	case v >= 0.1:
		return fmt.Sprintf("%.2f×", v)
	}
	return fmt.Sprintf("%.4f×", v)
}
