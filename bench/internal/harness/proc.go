package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// EnsureFDLimit raises the soft open-file limit to need (at most the hard
// limit) when it is lower, and fails if even the hard limit is lower.
func EnsureFDLimit(need uint64) (soft, hard uint64, raised bool, err error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, false, fmt.Errorf("reading the open-file limit: %w", err)
	}
	if rl.Cur >= need {
		return rl.Cur, rl.Max, false, nil
	}
	if rl.Max < need {
		return rl.Cur, rl.Max, false, fmt.Errorf("the open-file limit (hard %d) is below the %d this run needs: raise it (ulimit -Hn) or give fewer --connections", rl.Max, need)
	}
	rl.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return rl.Cur, rl.Max, false, fmt.Errorf("raising the open-file limit to %d: %w", need, err)
	}
	return rl.Cur, rl.Max, true, nil
}

// ProcStatus returns VmRSS in MB and Threads from /proc/<pid>/status
// ("self" for this process).
func ProcStatus(pid string) (rssMB float64, threads int, err error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			kb, _ := strconv.ParseFloat(f[0], 64)
			rssMB = kb / 1024
		case "Threads":
			threads, _ = strconv.Atoi(f[0])
		}
	}
	return rssMB, threads, nil
}
