// Package docs holds LuffyMQ's guides. Its tests check the README and
// every guide: each command runs as written (every flag it gives exists,
// every make target it names is in the Makefile), the operating guide's
// flag table lists exactly luffymq's flags, each relative link resolves,
// headings do not skip a level, the README stays short, and the generated
// benchmark sections are what make bench wrote.
package docs

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench"
	"github.com/luffymq/luffymq/bench/reliability"
	"github.com/luffymq/luffymq/bench/sites"
	"github.com/luffymq/luffymq/bench/soak"
	"github.com/luffymq/luffymq/bridge/controller"
	"github.com/luffymq/luffymq/broker"
)

// maxReadmeLines is the README's budget: what LuffyMQ is, the two
// commands, the tour and the guides; the rest lives in docs/.
const maxReadmeLines = 250

// guide is one markdown file: its path and its lines.
type guide struct {
	path  string
	lines []string
}

// guides reads README.md and every docs/*.md.
func guides(t *testing.T) []guide {
	t.Helper()
	paths, err := filepath.Glob("*.md")
	require.NoError(t, err)
	paths = append([]string{filepath.Join("..", "README.md")}, paths...)
	require.Greater(t, len(paths), 4, "README.md and at least 4 guides")
	var out []guide
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out = append(out, guide{path: p, lines: strings.Split(string(b), "\n")})
	}
	return out
}

var fence = regexp.MustCompile("^\\s*```")

// split returns g's lines inside fenced code blocks, and its other lines
// with the code ones blanked (so line numbers stay right).
func (g guide) split() (code map[int]string, prose []string) {
	code = map[int]string{}
	prose = make([]string, len(g.lines))
	in := false
	for i, l := range g.lines {
		switch {
		case fence.MatchString(l):
			in = !in
		case in:
			code[i] = l
		default:
			prose[i] = l
		}
	}
	return code, prose
}

// commandLines returns g's shell lines in fenced code blocks, continuation
// lines (ending in \) joined, each with the number of its first line.
func (g guide) commandLines() map[int]string {
	code, _ := g.split()
	out := map[int]string{}
	first, acc := -1, ""
	for i := range g.lines {
		l, ok := code[i]
		if !ok {
			continue
		}
		if first < 0 {
			first = i + 1
		}
		if s, cont := strings.CutSuffix(strings.TrimRight(l, " "), `\`); cont {
			acc += s + " "
			continue
		}
		out[first] = acc + l
		first, acc = -1, ""
	}
	return out
}

// words splits a shell line into simple commands and their words: quotes
// are removed, ;, &&, || and | end a command, # starts a comment.
func words(line string) [][]string {
	var cmds [][]string
	var cur []string
	var w strings.Builder
	inWord := false
	quote := rune(0)
	endWord := func() {
		if inWord {
			cur = append(cur, w.String())
		}
		w.Reset()
		inWord = false
	}
	endCmd := func() {
		endWord()
		if len(cur) > 0 {
			cmds = append(cmds, cur)
		}
		cur = nil
	}
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			endWord()
		case r == ';' || r == '|' || r == '&':
			endCmd()
		case r == '#' && !inWord:
			endCmd()
			return cmds
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// helpFlag matches a flag in the usage flag.PrintDefaults writes.
var helpFlag = regexp.MustCompile(`(?m)^  -([^\s=]+)`)

// flagsIn returns the flag names a command's usage lists.
func flagsIn(t *testing.T, command, usage string) map[string]bool {
	t.Helper()
	names := map[string]bool{"help": true, "h": true}
	for _, m := range helpFlag.FindAllStringSubmatch(usage, -1) {
		names[m[1]] = true
	}
	require.Greater(t, len(names), 3, "%s --help lists no flags:\n%s", command, usage)
	return names
}

// commandFlags returns the flags of each command, read from the --help of
// the flag sets the binaries parse with. The keys are "luffymq",
// "luffy-controller" and "luffy-bench <subcommand>".
type commandFlags map[string]map[string]bool

func (c commandFlags) of(t *testing.T, command string) map[string]bool {
	t.Helper()
	if f, ok := c[command]; ok {
		return f
	}
	var out bytes.Buffer
	switch sub, isBench := strings.CutPrefix(command, "luffy-bench "); {
	case command == "luffymq":
		_, err := broker.LoadConfig([]string{"--help"}, nil, &out, io.Discard)
		require.ErrorIs(t, err, broker.ErrHelp)
	case command == "luffy-controller":
		_, err := controller.ConfigFromArgs([]string{"--help"}, &out)
		require.ErrorIs(t, err, controller.ErrHelp)
	case isBench:
		// cmd/luffy-bench runs these three itself; bench.Main the others.
		ctx := context.Background()
		code := map[string]func() int{
			soak.Command:        func() int { return soak.Main([]string{"--help"}, io.Discard, &out) },
			reliability.Command: func() int { return reliability.Main(ctx, []string{"--help"}, io.Discard, &out) },
			sites.Command:       func() int { return sites.Main(ctx, []string{"--help"}, io.Discard, &out) },
		}[sub]
		if code == nil {
			code = func() int { return bench.Main([]string{sub, "--help"}, io.Discard, &out) }
		}
		require.Zero(t, code(), "luffy-bench %s --help: %s", sub, out.String())
	default:
		t.Fatalf("no flags known for %q", command)
	}
	c[command] = flagsIn(t, command, out.String())
	return c[command]
}

// envAssignment matches NAME=value before a command.
var envAssignment = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// commandName returns which of LuffyMQ's commands words runs ("" for
// another program) and the index of its first argument.
func commandName(words []string) (string, int) {
	i := 0
	for i < len(words) && envAssignment.MatchString(words[i]) {
		i++ // environment assignments
	}
	if i+2 < len(words) && words[i] == "go" && words[i+1] == "run" {
		i += 2
	}
	if i >= len(words) {
		return "", 0
	}
	switch name := path.Base(words[i]); name {
	case "luffymq", "luffy-controller", "luffy-bench", "make":
		return name, i + 1
	}
	return "", 0
}

// makeArgsCommand names the command each Makefile variable passes its
// flags to.
var makeArgsCommand = map[string]string{
	"ARGS":       "luffymq",
	"SOAK_ARGS":  "luffy-bench soak",
	"SITES_ARGS": "luffy-bench sites",
}

// makeTargets returns the targets the Makefile defines.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "Makefile"))
	require.NoError(t, err)
	targets := map[string]bool{}
	rule := regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:([^=]|$)`)
	for _, m := range rule.FindAllStringSubmatch(string(b), -1) {
		for _, name := range strings.Fields(m[1]) {
			targets[name] = true
		}
	}
	require.True(t, targets["run"] && targets["test"], "the Makefile parser found no run and test targets: %v", targets)
	return targets
}

// problem is what is wrong with one command of a guide.
type problem struct {
	where, what string
}

// checkFlags reports every flag in args that command does not have.
func checkFlags(t *testing.T, flags commandFlags, where, command string, args []string) []problem {
	var out []problem
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags.of(t, command)[name] {
			out = append(out, problem{where, command + " has no flag " + a})
		}
	}
	return out
}

// checkCommands checks every LuffyMQ command and make invocation in the
// guides and returns what is wrong, and how many commands of each kind it
// checked.
func checkCommands(t *testing.T, gs []guide) ([]problem, map[string]int) {
	flags := commandFlags{}
	targets := makeTargets(t)
	var problems []problem
	checked := map[string]int{}
	for _, g := range gs {
		for n, line := range g.commandLines() {
			for _, ws := range words(line) {
				name, i := commandName(ws)
				where := g.path + ":" + strconv.Itoa(n)
				args := ws[i:]
				switch name {
				case "":
					continue
				case "make":
					for _, a := range args {
						if v, value, ok := strings.Cut(a, "="); ok {
							if c := makeArgsCommand[v]; c != "" {
								problems = append(problems, checkFlags(t, flags, where, c, strings.Fields(value))...)
							}
						} else if !strings.HasPrefix(a, "-") && !targets[a] {
							problems = append(problems, problem{where, "the Makefile has no target " + a})
						}
					}
				case "luffy-bench":
					if len(args) == 0 || strings.HasPrefix(args[0], "-") {
						problems = append(problems, problem{where, "luffy-bench without a subcommand"})
						continue
					}
					name, args = "luffy-bench "+args[0], args[1:]
					fallthrough
				default:
					problems = append(problems, checkFlags(t, flags, where, name, args)...)
				}
				checked[strings.Fields(name)[0]]++
			}
		}
	}
	return problems, checked
}

// TestGuideCommandsUseRealFlags: every luffymq, luffy-controller and
// luffy-bench command in a code block of the README or a guide uses only
// flags its binary has (ARGS, SOAK_ARGS and SITES_ARGS of make too), and
// every make target named exists.
func TestGuideCommandsUseRealFlags(t *testing.T) {
	problems, checked := checkCommands(t, guides(t))
	for _, p := range problems {
		t.Errorf("%s: %s", p.where, p.what)
	}
	for _, c := range []string{"luffymq", "luffy-controller", "luffy-bench", "make"} {
		require.Positive(t, checked[c], "no %s command found in the guides: is the extraction broken?", c)
	}
}

// TestCommandCheckCatchesAWrongFlag: the check above fails on a flag a
// binary does not have, a subcommand's flag given to another, and a make
// target the Makefile lacks.
func TestCommandCheckCatchesAWrongFlag(t *testing.T) {
	g := guide{path: "bad.md", lines: strings.Split(strings.Join([]string{
		"```sh",
		"bin/luffymq --listen :1883 --colour blue",
		`make run ARGS="--strategy thesis --no-such-flag"`,
		"bin/luffy-bench shared --out x --burst-pending-writes 1  # reliability's flag",
		"LUFFYMQ_X=1 go run ./cmd/luffy-controller --sites s.yaml \\",
		"  --once --twice",
		"make bench-everything",
		"```",
	}, "\n"), "\n")}
	problems, _ := checkCommands(t, []guide{g})
	var got []string
	for _, p := range problems {
		got = append(got, p.where+" "+p.what)
	}
	require.ElementsMatch(t, []string{
		"bad.md:2 luffymq has no flag --colour",
		"bad.md:3 luffymq has no flag --no-such-flag",
		"bad.md:4 luffy-bench shared has no flag --burst-pending-writes",
		"bad.md:5 luffy-controller has no flag --twice",
		"bad.md:7 the Makefile has no target bench-everything",
	}, got)
}

// link matches a markdown link or image: [text](target) or ![alt](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineCode matches a code span, whose brackets are not links.
var inlineCode = regexp.MustCompile("`[^`]*`")

// heading matches a markdown heading and its level.
var heading = regexp.MustCompile(`^(#{1,6})\s+(.*)$`)

// slug is GitHub's anchor for a heading's text.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of g's headings.
func (g guide) anchors() map[string]bool {
	_, prose := g.split()
	out := map[string]bool{}
	for _, l := range prose {
		if m := heading.FindStringSubmatch(l); m != nil {
			out[slug(m[2])] = true
		}
	}
	return out
}

// TestGuideLinksResolve: every relative link of the README and the guides
// names a file that exists, and an anchor into a guide names one of its
// headings.
func TestGuideLinksResolve(t *testing.T) {
	gs := guides(t)
	byPath := map[string]guide{}
	for _, g := range gs {
		abs, err := filepath.Abs(g.path)
		require.NoError(t, err)
		byPath[abs] = g
	}
	links := 0
	for _, g := range gs {
		_, prose := g.split()
		for i, l := range prose {
			for _, m := range link.FindAllStringSubmatch(inlineCode.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, anchor, _ := strings.Cut(target, "#")
				abs := filepath.Join(filepath.Dir(g.path), file)
				if file == "" {
					abs = g.path
				}
				abs, err := filepath.Abs(abs)
				require.NoError(t, err)
				if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s:%d: link %s: %v", g.path, i+1, target, err)
					continue
				}
				if to, ok := byPath[abs]; ok && anchor != "" && !to.anchors()[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading with that anchor", g.path, i+1, target, to.path)
				}
			}
		}
	}
	require.Greater(t, links, 10, "links found: is the extraction broken?")
}

// TestHeadingsDoNotSkipLevels: a heading is at most one level below the
// one before it (## then ###, never ## then ####), and each file has one
// title.
func TestHeadingsDoNotSkipLevels(t *testing.T) {
	for _, g := range guides(t) {
		_, prose := g.split()
		prev, titles := 0, 0
		for i, l := range prose {
			m := heading.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			level := len(m[1])
			if level == 1 {
				titles++
			}
			if level > prev+1 {
				t.Errorf("%s:%d: %q is level %d after level %d", g.path, i+1, l, level, prev)
			}
			prev = level
		}
		require.Equal(t, 1, titles, "%s: one # title", g.path)
	}
}

// TestReadmeIsShort: the README fits its budget; the manual is in docs/.
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(b), "\n")
	require.LessOrEqual(t, lines, maxReadmeLines, "README.md has %d lines; move the detail into a guide under docs/", lines)
}

// TestGeneratedBenchmarkSectionsAreUpToDate: the README's headline and
// docs/benchmarks.md's report are what scripts/update-bench-readme.sh
// writes from bench/results/summary.md (make bench runs it), not edits by
// hand: running the script again changes nothing.
func TestGeneratedBenchmarkSectionsAreUpToDate(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"README.md": filepath.Join("..", "README.md"), "benchmarks.md": "benchmarks.md"}
	want := map[string][]byte{}
	for name, src := range files {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		want[name] = b
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	cmd := exec.Command(filepath.Join("..", "scripts", "update-bench-readme.sh"))
	cmd.Env = append(os.Environ(), "README="+filepath.Join(dir, "README.md"), "BENCH_DOC="+filepath.Join(dir, "benchmarks.md"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for name := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		have, gen := strings.Split(string(want[name]), "\n"), strings.Split(string(got), "\n")
		for i := range min(len(have), len(gen)) {
			require.Equal(t, gen[i], have[i], "%s:%d differs from what bench/results/summary.md generates; run scripts/update-bench-readme.sh", name, i+1)
		}
		require.Len(t, have, len(gen), "%s: the generated section's length differs from bench/results/summary.md's; run scripts/update-bench-readme.sh", name)
	}
}

// flagRow matches a row of the operating guide's flag table; its first
// cell names one or more flags.
var flagRow = regexp.MustCompile("^\\| (`--[^|]*)\\|")

// flagName matches a flag named in code: `--name`.
var flagName = regexp.MustCompile("`--([a-z0-9-]+)`")

// TestOperatingGuideListsEveryLuffyMQFlag: the flag table of
// docs/operating.md names exactly the flags luffymq has, so a new flag
// cannot go undocumented and a removed one cannot stay.
func TestOperatingGuideListsEveryLuffyMQFlag(t *testing.T) {
	b, err := os.ReadFile("operating.md")
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := flagRow.FindStringSubmatch(l); m != nil {
			for _, f := range flagName.FindAllStringSubmatch(m[1], -1) {
				documented[f[1]] = true
			}
		}
	}
	real := map[string]bool{}
	for name := range (commandFlags{}).of(t, "luffymq") {
		if name != "help" && name != "h" {
			real[name] = true
		}
	}
	require.Equal(t, real, documented, "docs/operating.md's flag table against luffymq --help")
}
