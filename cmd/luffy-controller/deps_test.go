package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goListDeps returns the packages pkg links, as go list -deps prints them.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	require.NoError(t, err, "go list -deps %s", pkg)
	return strings.Fields(string(out))
}

// TestControllerLinksNoBroker: luffy-controller decodes the HTTP API with
// package broker/api, not with the broker, so it links none of the
// broker's packages, and any Mochi package it links comes through package
// bridge (the configuration message format), none through the broker.
func TestControllerLinksNoBroker(t *testing.T) {
	deps := goListDeps(t, ".")
	require.True(t, slices.Contains(deps, "github.com/luffymq/luffymq/broker/api"), "luffy-controller does not link broker/api")
	for _, p := range []string{
		"github.com/luffymq/luffymq/broker",
		"github.com/luffymq/luffymq/broker/pingreq",
		"github.com/luffymq/luffymq/broker/dashboard",
		"github.com/luffymq/luffymq/hooks",
	} {
		require.False(t, slices.Contains(deps, p), "luffy-controller links %s", p)
	}
	viaBridge := goListDeps(t, "github.com/luffymq/luffymq/bridge")
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/mochi-mqtt/") {
			require.True(t, slices.Contains(viaBridge, p), "luffy-controller links %s, and not through package bridge", p)
		}
	}
}

// TestAPIPackageLinksNoMochi: broker/api imports only the standard
// library, so whoever decodes the HTTP API links nothing of the broker.
func TestAPIPackageLinksNoMochi(t *testing.T) {
	const api = "github.com/luffymq/luffymq/broker/api"
	for _, p := range goListDeps(t, api) {
		first, _, _ := strings.Cut(p, "/")
		require.True(t, p == api || !strings.Contains(first, "."), "broker/api links %s, which is not the standard library", p)
	}
}
