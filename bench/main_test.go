package bench

import (
	"os"
	"testing"
)

// TestMain lets the test binary stand in for luffy-bench when a test
// starts vanilla Mochi, which runs as `luffy-bench mochi-server` (the
// brokers run as processes of their own, and os.Executable is the test
// binary here).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == MochiServerCommand {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
