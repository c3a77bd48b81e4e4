package broker

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// DefaultMQTTListen is the default MQTT address: loopback, where anonymous
// clients are accepted without --allow-anonymous.
const DefaultMQTTListen = "127.0.0.1:1883"

// EnvPrefix starts the name of every environment variable that sets a
// flag: EnvName("report-interval") is LUFFYMQ_REPORT_INTERVAL.
const EnvPrefix = "LUFFYMQ_"

// The flags that are not settings: --config names the file (settable by
// LUFFYMQ_CONFIG, not by the file) and --print-config is an action
// (command line only).
const (
	configFlag      = "config"
	printConfigFlag = "print-config"
)

// ErrConfigPrinted is returned by ConfigFromArgs and LoadConfig when
// --print-config was given: the effective configuration has been written
// and the program should exit with status 0.
var ErrConfigPrinted = errors.New("configuration printed")

// EnvName returns the environment variable that sets the flag name.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// envSetting is a flag's value from the environment.
type envSetting struct{ variable, value string }

// environmentSettings returns, by flag name, the LUFFYMQ_… variables of
// environ. A LUFFYMQ_ variable that names no flag is an error, so that a
// misspelt setting is not ignored.
func environmentSettings(fs *flag.FlagSet, environ []string) (map[string]envSetting, error) {
	settings := map[string]envSetting{}
	for _, kv := range environ {
		variable, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(variable, EnvPrefix) {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(variable, EnvPrefix), "_", "-"))
		if name == printConfigFlag {
			return nil, fmt.Errorf("%w: environment variable %s: print-config is an action; give --print-config on the command line", ErrInvalidConfig, variable)
		}
		if fs.Lookup(name) == nil || EnvName(name) != variable {
			return nil, fmt.Errorf("%w: environment variable %s names no luffymq flag (LUFFYMQ_<FLAG> in upper case, e.g. %s; see luffymq --help)", ErrInvalidConfig, escapeLineBreaks.Replace(variable), EnvName("report-interval"))
		}
		settings[name] = envSetting{variable: variable, value: value}
	}
	return settings, nil
}

// setFromSource sets the flag name to value from source (the file or the
// environment): a list flag's list is replaced, not added to.
func setFromSource(fs *flag.FlagSet, name, value, source string) error {
	f := fs.Lookup(name)
	if list, ok := f.Value.(*listFlag); ok {
		list.reset()
	}
	if err := fs.Set(name, value); err != nil {
		shown := fmt.Sprintf("%q", value)
		if _, secret := secretRedactions[name]; secret {
			shown = "(not shown)"
		}
		return fmt.Errorf("%w: %s: %s: invalid value %s: %s", ErrInvalidConfig, source, name, shown, valueHint(f))
	}
	return nil
}

// valueHint says what a flag's values look like.
func valueHint(f *flag.Flag) string {
	switch flagValue(f).(type) {
	case time.Duration:
		return "want a duration such as 500ms or 2s"
	case int, int64, uint, uint64:
		return "want a whole number"
	case bool:
		return "want true or false"
	default:
		return "see luffymq --help"
	}
}

// flagValue returns a flag's typed value (its string form if the flag has
// no getter).
func flagValue(f *flag.Flag) any {
	if getter, ok := f.Value.(flag.Getter); ok {
		return getter.Get()
	}
	return f.Value.String()
}

// applyConfigFile sets, from the YAML file at path, every flag it names
// that the command line does not.
func applyConfigFile(fs *flag.FlagSet, path string, onCommandLine map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: config file: %s", ErrInvalidConfig, escapeLineBreaks.Replace(err.Error()))
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: config file %s: %s", ErrInvalidConfig, escapeLineBreaks.Replace(path), fmt.Sprintf(format, args...))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return fail("%s", oneLine(err.Error()))
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return fail("%s", oneLine(err.Error()))
		}
		return fail("holds more than one YAML document; put every setting in one")
	}
	root := resolveAlias(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolveAlias(root.Content[0])
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return fail("line %d: want a mapping of flag names to values, e.g. listen: 127.0.0.1:1883", root.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		keyNode, valueNode := resolveAlias(root.Content[i]), resolveAlias(root.Content[i+1])
		key := keyNode.Value
		f := fs.Lookup(key)
		if keyNode.Kind != yaml.ScalarNode || f == nil || key == configFlag || key == printConfigFlag {
			return fail("line %d: unknown key %q (the keys are the flag names, e.g. listen or strategy; see luffymq --help)", keyNode.Line, key)
		}
		if seen[key] {
			return fail("line %d: %s is set twice", keyNode.Line, key)
		}
		seen[key] = true
		if onCommandLine[key] {
			continue
		}
		source := fmt.Sprintf("config file %s: line %d", escapeLineBreaks.Replace(path), valueNode.Line)
		switch valueNode.Kind {
		case yaml.ScalarNode:
			value := valueNode.Value
			if valueNode.Tag == "!!null" {
				value = ""
			}
			if _, isInt := flagValue(f).(int); isInt && valueNode.Tag == "!!int" {
				// As YAML reads it (0x10, 0o17, 1_000), not as Go would.
				var n int64
				if err := valueNode.Decode(&n); err == nil {
					value = strconv.FormatInt(n, 10)
				}
			}
			if err := setFromSource(fs, key, value, source); err != nil {
				return err
			}
		case yaml.SequenceNode:
			list, ok := f.Value.(*listFlag)
			if !ok {
				return fail("line %d: %s takes one value, not a list", valueNode.Line, key)
			}
			list.reset()
			for _, item := range valueNode.Content {
				item = resolveAlias(item)
				if item.Kind != yaml.ScalarNode {
					return fail("line %d: %s: every item must be a plain value", item.Line, key)
				}
				if item.Value != "" {
					*list = append(*list, item.Value)
				}
			}
		default:
			return fail("line %d: %s: want a value, not a mapping", valueNode.Line, key)
		}
	}
	return nil
}

// resolveAlias follows YAML aliases (*name) to the node they stand for.
func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; i < 8 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

// secretRedactions are the flags whose values print-config and errors do
// not show in full, with how to show them.
var secretRedactions = map[string]func(string) string{
	"http-token":          func(string) string { return "<redacted>" },
	"amqp-url":            redactURLPassword,
	"amqp-management-url": redactURLPassword,
}

// redactURLPassword replaces the password of a URL, if it has one.
func redactURLPassword(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if strings.Contains(s, "@") {
			return "<redacted>" // unparsable, and may hold credentials
		}
		return s
	}
	return u.Redacted()
}

// writeEffectiveConfig writes every setting of fs as a YAML file that
// --config would read (keys in alphabetical order), secrets redacted.
func writeEffectiveConfig(w io.Writer, fs *flag.FlagSet) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == configFlag || f.Name == printConfigFlag || err != nil {
			return
		}
		value := flagValue(f)
		switch v := value.(type) {
		case time.Duration:
			value = v.String()
		case string:
			if redact, secret := secretRedactions[f.Name]; secret && v != "" {
				value = redact(v)
			}
		}
		var node yaml.Node
		if err = node.Encode(value); err != nil {
			return
		}
		if node.Kind == yaml.SequenceNode && len(node.Content) == 0 {
			node.Style = yaml.FlowStyle // []
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f.Name}, &node)
	})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "# luffymq effective configuration: file < %s<FLAG> environment < command line; secrets redacted\n", EnvPrefix); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return err
	}
	return enc.Close()
}
