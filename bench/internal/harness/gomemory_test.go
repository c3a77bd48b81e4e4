package harness

import (
	"bufio"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const goMemoryText = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 20013
go_memstats_heap_inuse_bytes 1.43745024e+08
go_memstats_stack_inuse_bytes 2.46480896e+08
go_memstats_stack_sys_bytes 2.46480896e+08
`

// TestParseGoMemoryReadsTheGauges reads the three gauges, skips the rest,
// and refuses text that lacks one or carries a bad value.
func TestParseGoMemoryReadsTheGauges(t *testing.T) {
	m, err := parseGoMemory(bufio.NewScanner(strings.NewReader(goMemoryText)))
	require.NoError(t, err)
	require.Equal(t, GoMemory{StackBytes: 246480896, HeapInuseBytes: 143745024, Goroutines: 20013}, m)

	_, err = parseGoMemory(bufio.NewScanner(strings.NewReader("go_goroutines 3\n")))
	require.ErrorContains(t, err, "missing")
	_, err = parseGoMemory(bufio.NewScanner(strings.NewReader(strings.Replace(goMemoryText, "20013", "many", 1))))
	require.ErrorContains(t, err, "go_goroutines")
}

// TestGoMetricsServeWhatReadGoMemoryReads serves this process's gauges
// as `luffy-bench mochi-server --metrics` does and reads them back.
func TestGoMetricsServeWhatReadGoMemoryReads(t *testing.T) {
	addr, err := FreeAddr()
	require.NoError(t, err)
	stop, err := ServeGoMetrics(addr)
	require.NoError(t, err)
	defer stop()
	m, err := ReadGoMemory(context.Background(), "http://"+addr+"/metrics")
	require.NoError(t, err)
	require.Positive(t, m.StackBytes)
	require.Positive(t, m.HeapInuseBytes)
	require.Positive(t, m.Goroutines)
}

// FuzzParseGoMemory feeds arbitrary text to the parser: it never panics,
// and never finds the three gauges in fewer than three lines.
func FuzzParseGoMemory(f *testing.F) {
	f.Add(goMemoryText)
	f.Add("go_goroutines 1\ngo_memstats_heap_inuse_bytes 2\ngo_memstats_stack_inuse_bytes NaN\n")
	f.Add("go_goroutines\n \n go_goroutines 1e400")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := parseGoMemory(bufio.NewScanner(strings.NewReader(text)))
		if strings.Count(text, "\n") < 2 {
			// Three gauges take three lines.
			require.Error(t, err, "three gauges from %q: %+v", text, m)
		}
	})
}
