package broker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/luffymq/luffymq/scoring"
)

// EMQXStrategyAliases maps EMQX's shared-subscription strategy names
// (shared_subscription_strategy) to the LuffyMQ strategy that does the
// same. round_robin rotates per publisher in EMQX and per group here;
// both spread a group's messages evenly. hash is EMQX 4's name for
// hash_clientid.
var EMQXStrategyAliases = map[string]string{
	"random":                "random",
	"round_robin":           "round-robin",
	"round_robin_per_group": "round-robin",
	"sticky":                "sticky",
	"hash_clientid":         "hash-clientid",
	"hash":                  "hash-clientid",
	"hash_topic":            "hash-topic",
}

// emqxStrategiesWithoutEquivalent are EMQX strategies LuffyMQ refuses,
// with the reason.
var emqxStrategiesWithoutEquivalent = map[string]string{
	"local": "it prefers members on the publisher's node of an EMQX cluster, and a LuffyMQ broker is one node (use random, or adaptive)",
}

// resolveStrategy returns the LuffyMQ strategy called name, which may be
// an EMQX alias; the error lists the names that exist.
func resolveStrategy(name string) (string, error) {
	if canonical, ok := EMQXStrategyAliases[name]; ok {
		name = canonical
	}
	if why, ok := emqxStrategiesWithoutEquivalent[name]; ok {
		return "", fmt.Errorf("EMQX strategy %q has no LuffyMQ equivalent: %s; choose one of %s, or the EMQX names %s",
			name, why, strings.Join(scoring.Strategies(), ", "), strings.Join(emqxAliasNames(), ", "))
	}
	if _, err := scoring.StrategyByName(name); err != nil {
		return "", fmt.Errorf("%w, or the EMQX names %s", err, strings.Join(emqxAliasNames(), ", "))
	}
	return name, nil
}

// emqxAliasNames lists the accepted EMQX names, sorted.
func emqxAliasNames() []string {
	names := make([]string, 0, len(EMQXStrategyAliases))
	for n := range EMQXStrategyAliases {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
