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
// package broker/api and builds configuration messages with
// bridge/siteconfig, so it links none of the broker's or the bridge's
// packages, and no Mochi MQTT package at all.
func TestControllerLinksNoBroker(t *testing.T) {
	deps := goListDeps(t, ".")
	require.True(t, slices.Contains(deps, "github.com/luffymq/luffymq/broker/api"), "luffy-controller does not link broker/api")
	require.True(t, slices.Contains(deps, "github.com/luffymq/luffymq/bridge/siteconfig"), "luffy-controller does not link bridge/siteconfig")
	for _, p := range []string{
		"github.com/luffymq/luffymq/broker",
		"github.com/luffymq/luffymq/broker/pingreq",
		"github.com/luffymq/luffymq/broker/dashboard",
		"github.com/luffymq/luffymq/hooks",
		"github.com/luffymq/luffymq/bridge",
	} {
		require.False(t, slices.Contains(deps, p), "luffy-controller links %s", p)
	}
	for _, p := range deps {
		require.False(t, strings.HasPrefix(p, "github.com/mochi-mqtt/"), "luffy-controller links %s", p)
	}
}

// TestSiteConfigLinksOnlyTheStandardLibrary: bridge/siteconfig is what the
// controller shares with the bridge; it must stay free of the broker.
func TestSiteConfigLinksOnlyTheStandardLibrary(t *testing.T) {
	const pkg = "github.com/luffymq/luffymq/bridge/siteconfig"
	for _, p := range goListDeps(t, pkg) {
		first, _, _ := strings.Cut(p, "/")
		require.True(t, p == pkg || !strings.Contains(first, "."), "bridge/siteconfig links %s, which is not the standard library", p)
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
