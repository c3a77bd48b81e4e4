package broker

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPprofIsOffByDefault: without --pprof, /debug/pprof/ is not served.
func TestPprofIsOffByDefault(t *testing.T) {
	b := startBroker(t, nil)
	require.Equal(t, http.StatusNotFound, httpStatus(t, http.DefaultClient, "http", b, "/debug/pprof/heap", "", ""))
}

// TestPprofNeedsTheToken: with --pprof and a token, profiles are served
// only to requests that carry the token.
func TestPprofNeedsTheToken(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.Pprof = true; c.HTTPToken = testHTTPToken })
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
		require.Equal(t, http.StatusUnauthorized, httpStatus(t, http.DefaultClient, "http", b, path, "", ""), path)
		require.Equal(t, http.StatusOK, httpStatus(t, http.DefaultClient, "http", b, path, "", "Bearer "+testHTTPToken), path)
	}
}

// TestPprofFlag: --pprof sets Config.Pprof; it is off without it.
func TestPprofFlag(t *testing.T) {
	cfg, err := LoadConfig([]string{"--pprof"}, nil, nil, nil)
	require.NoError(t, err)
	require.True(t, cfg.Pprof)
	cfg, err = LoadConfig(nil, nil, nil, nil)
	require.NoError(t, err)
	require.False(t, cfg.Pprof)
}
