package broker

import (
	"io"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGCPercentDefault: --gc-percent defaults to DefaultGCPercent, steps
// aside (0) for an operator's GOGC, and an explicit setting wins over both.
func TestGCPercentDefault(t *testing.T) {
	cfg, err := LoadConfig(nil, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, DefaultGCPercent, cfg.GCPercent)

	cfg, err = LoadConfig(nil, []string{"GOGC=50"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Zero(t, cfg.GCPercent, "GOGC set: leave the runtime's setting")

	cfg, err = LoadConfig([]string{"--gc-percent", "400"}, []string{"GOGC=50"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 400, cfg.GCPercent)

	cfg, err = LoadConfig(nil, []string{"LUFFYMQ_GC_PERCENT=0"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Zero(t, cfg.GCPercent)
}

// TestApplyRuntimeSettingsRestores: the target is set for the process and
// the returned function puts the previous one back; 0 changes nothing.
func TestApplyRuntimeSettingsRestores(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)

	restore := ApplyRuntimeSettings(Config{GCPercent: 300})
	require.Equal(t, 300, debug.SetGCPercent(300), "set while applied")
	restore()
	require.Equal(t, 100, debug.SetGCPercent(100), "restored")

	ApplyRuntimeSettings(Config{})()
	require.Equal(t, 100, debug.SetGCPercent(100), "0 leaves the runtime's setting")
}
