package harness

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// MachineInfo describes where the benchmarks ran.
type MachineInfo struct {
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Mosquitto string `json:"mosquitto,omitempty"`
	Mochi     string `json:"mochi"`
}

func DescribeMachine(mosquittoBin string) MachineInfo {
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

// LoadJSON reads the JSON file at path into a new T, or returns nil when
// there is no such file.
func LoadJSON[T any](path string) (*T, error) {
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

func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Finite replaces NaNs by -1 (no data), as JSON cannot hold NaN.
func (l LatencyStats) Finite() LatencyStats {
	f := func(v float64) float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return -1
		}
		return v
	}
	return LatencyStats{Count: l.Count, Mean: f(l.Mean), P50: f(l.P50), P99: f(l.P99), Max: f(l.Max)}
}

func (l LatencyStats) Unfinite() LatencyStats {
	f := func(v float64) float64 {
		if v < 0 {
			return math.NaN()
		}
		return v
	}
	return LatencyStats{Count: l.Count, Mean: f(l.Mean), P50: f(l.P50), P99: f(l.P99), Max: f(l.Max)}
}

// FmtMs formats milliseconds for tables.
func FmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// FmtRatio formats a ratio column.
func FmtRatio(v float64) string {
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

// Goal is one reported goal.
type Goal struct {
	Text   string
	Status string // "met", "missed", "not measured"
	Detail string
}

func (g Goal) String() string {
	s := "**" + g.Status + "**"
	return fmt.Sprintf("- %s: %s — %s", g.Text, s, g.Detail)
}

func MetIf(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func FileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func OrDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

type PlotRef struct{ File, Alt string }

// StringList is a repeatable string flag.
type StringList []string

func (s *StringList) String() string { return strings.Join(*s, ",") }

func (s *StringList) Set(v string) error { *s = append(*s, strings.Split(v, ",")...); return nil }

func FmtDur(d time.Duration) string {
	d = d.Round(time.Second)
	if d >= time.Minute {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

func ArgsNote(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return " and " + strings.Join(args, " ")
}

// FmtBytes formats a byte count in MiB ("—" when unknown).
func FmtBytes(n int64) string {
	if n < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// SplitList splits a comma-separated list, dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// JoinErr appends note to an error text.
func JoinErr(err, note string) string {
	if err == "" {
		return note
	}
	return err + "; " + note
}

// FmtPercent formats a fraction as a percentage with one decimal ("—" for NaN):
// a burst that loses 0.2 % must not read as 100 %.
func FmtPercent(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f %%", 100*v)
}

// ExitCode is a luffy-bench subcommand's exit code for err, the error its
// run returned: 0 for none or for --help, else 1 after printing err on
// stderr.
func ExitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "luffy-bench:", err)
	return 1
}
