package controller

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"
)

// Algorithms names the placement algorithms --algorithm accepts.
const (
	// AlgorithmImproved is placement.Improved (the default).
	AlgorithmImproved = "improved"
	// AlgorithmThesis is placement.Heuristic, algorithm 2.1 as the thesis
	// writes it.
	AlgorithmThesis = "thesis"
)

// Defaults of the flags.
const (
	DefaultPeriod         = 2 * time.Minute
	DefaultLambda         = 100
	DefaultHTTPListen     = "127.0.0.1:9090"
	DefaultRequestTimeout = 10 * time.Second
	DefaultFirstWindow    = 10 * time.Second
	// MaxRateHalfLife is the longest --rate-half-life accepted, in periods.
	MaxRateHalfLife = 100
	// MinHTTPTokenLength is the shortest --http-token accepted.
	MinHTTPTokenLength = 16
)

// ErrInvalidConfig wraps every bad flag or setting.
var ErrInvalidConfig = errors.New("invalid configuration")

// ErrHelp is returned by ConfigFromArgs for -h and --help.
var ErrHelp = flag.ErrHelp

// Config configures a Controller.
type Config struct {
	// Sites are the sites and delays (LoadSites). Required.
	Sites *Sites
	// Period is the time between two reconfiguration rounds (2 min).
	Period time.Duration
	// Lambda is λ, the penalty for moving a synchronisation site (100, as
	// in the thesis).
	Lambda float64
	// Algorithm is AlgorithmImproved (default) or AlgorithmThesis.
	Algorithm string
	// HTTPListen serves /metrics and /api/v1/status ("" for none).
	HTTPListen string
	// HTTPToken, when set, must come as "Authorization: Bearer <token>"
	// with every HTTP request; required when HTTPListen is not loopback.
	HTTPToken string
	// Once runs one round, writes the status to Output and returns.
	Once bool
	// Output receives the status JSON of a --once round (io.Discard).
	Output io.Writer
	// RequestTimeout bounds each request to a site (10 s).
	RequestTimeout time.Duration
	// FirstWindow is how long traffic is measured on a site's first read
	// (the first round, --once, a site reached for the first time), which
	// has no previous read to count from (10 s, at most half the period).
	FirstWindow time.Duration
	// RateHalfLife is the half-life, in periods, of the moving average of
	// the rates placement sees (see DefaultRateHalfLife); 0 (the zero
	// value) uses each period's rates as they are.
	RateHalfLife float64
	// MoveMargin is the fraction by which moving an exchange's
	// synchronisation site must lower its cost (see DefaultMoveMargin); 0
	// (the zero value) moves on any gain beyond λ.
	MoveMargin float64
	// Logger receives the controller's logs (slog.Default()).
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Sites == nil || len(c.Sites.Sites) == 0 {
		return c, fmt.Errorf("%w: no sites (give --sites FILE)", ErrInvalidConfig)
	}
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.Period < time.Second {
		return c, fmt.Errorf("%w: period %v: use at least 1s", ErrInvalidConfig, c.Period)
	}
	if math.IsNaN(c.Lambda) || math.IsInf(c.Lambda, 0) || c.Lambda < 0 {
		return c, fmt.Errorf("%w: lambda %v: use a finite number >= 0", ErrInvalidConfig, c.Lambda)
	}
	if math.IsNaN(c.RateHalfLife) || c.RateHalfLife < 0 || c.RateHalfLife > MaxRateHalfLife {
		return c, fmt.Errorf("%w: rate-half-life %v: use a number of periods from 0 (no smoothing) to %v", ErrInvalidConfig, c.RateHalfLife, MaxRateHalfLife)
	}
	if math.IsNaN(c.MoveMargin) || c.MoveMargin < 0 || c.MoveMargin >= 1 {
		return c, fmt.Errorf("%w: move-margin %v: use a fraction from 0 (no hysteresis) to below 1, e.g. 0.1 or 10%%", ErrInvalidConfig, c.MoveMargin)
	}
	if c.Algorithm == "" {
		c.Algorithm = AlgorithmImproved
	}
	if c.Algorithm != AlgorithmImproved && c.Algorithm != AlgorithmThesis {
		return c, fmt.Errorf("%w: algorithm %q: use %s or %s", ErrInvalidConfig, c.Algorithm, AlgorithmImproved, AlgorithmThesis)
	}
	if c.HTTPListen != "" {
		host, _, err := net.SplitHostPort(c.HTTPListen)
		if err != nil {
			return c, fmt.Errorf("%w: http %q: want host:port, e.g. %s", ErrInvalidConfig, c.HTTPListen, DefaultHTTPListen)
		}
		if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" && c.HTTPToken == "" {
			return c, fmt.Errorf("%w: http %q accepts connections from other hosts: set http-token (clients then send Authorization: Bearer <token>), or bind http to 127.0.0.1", ErrInvalidConfig, c.HTTPListen)
		}
	}
	if c.HTTPToken != "" {
		if len(c.HTTPToken) < MinHTTPTokenLength {
			return c, fmt.Errorf("%w: http-token is %d characters long; use at least %d (e.g. openssl rand -hex 16)", ErrInvalidConfig, len(c.HTTPToken), MinHTTPTokenLength)
		}
		for i := 0; i < len(c.HTTPToken); i++ {
			if c.HTTPToken[i] <= ' ' || c.HTTPToken[i] >= 0x7f {
				return c, fmt.Errorf("%w: http-token holds a space, control or non-ASCII character at byte %d; use printable ASCII only", ErrInvalidConfig, i)
			}
		}
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.FirstWindow <= 0 {
		c.FirstWindow = DefaultFirstWindow
	}
	c.FirstWindow = min(c.FirstWindow, c.Period/2)
	if c.Output == nil {
		c.Output = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// ConfigFromArgs parses luffy-controller's command line and loads the
// sites file. Usage goes to usage; errors (bad flags, a bad sites file)
// wrap ErrInvalidConfig or ErrInvalidSites, or are ErrHelp.
func ConfigFromArgs(args []string, usage io.Writer) (Config, error) {
	fs := flag.NewFlagSet("luffy-controller", flag.ContinueOnError)
	fs.SetOutput(usage)
	var c Config
	sitesPath := fs.String("sites", "", "YAML file with the sites (name, amqp_url, management_url, luffymq_url, bandwidth limits) and the one-way delay matrix delays_ms (see examples/sites.yaml); required")
	fs.DurationVar(&c.Period, "period", DefaultPeriod, "time between two reconfiguration rounds (the thesis: 2m; 30s in benchmarks)")
	fs.Float64Var(&c.Lambda, "lambda", DefaultLambda, "λ, the penalty for moving an exchange's synchronisation site (the thesis used 100)")
	fs.StringVar(&c.Algorithm, "algorithm", AlgorithmImproved, "placement algorithm: improved (default: within 10 % of the exact optimum on 99 % of random instances) or thesis (algorithm 2.1 as written: 54-78 %; see bridge/placement)")
	fs.StringVar(&c.HTTPListen, "http", DefaultHTTPListen, "address serving /metrics and /api/v1/status (empty: no HTTP server)")
	fs.StringVar(&c.HTTPToken, "http-token", "", "bearer token the HTTP endpoints require (needed when --http is not loopback)")
	fs.BoolVar(&c.Once, "once", false, "run one round, print the status JSON on stdout and exit (1 if a site could not be read or configured); no HTTP server")
	fs.DurationVar(&c.FirstWindow, "first-window", DefaultFirstWindow, "how long the first round (and --once) measures each site's traffic before placing, as it has no earlier read to count from")
	c.RateHalfLife, c.MoveMargin = DefaultRateHalfLife, DefaultMoveMargin
	fs.Float64Var(&c.RateHalfLife, "rate-half-life", DefaultRateHalfLife, "half-life, in periods, of the moving average of the rates placement sees: with --move-margin, keeps short phases of traffic from moving synchronisation sites back and forth (0: each period's rates as they are)")
	fs.Var(fractionFlag{&c.MoveMargin}, "move-margin", "move an exchange's synchronisation site only when that lowers its cost (eq. 2.1, λ included) by more than this fraction, or relieves overloaded bandwidth, e.g. 10% or 0.1 (0: on any gain)")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", DefaultRequestTimeout, "bound on each request to a site's management API, luffymq API or RabbitMQ")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, ErrHelp
		}
		return c, fmt.Errorf("%w: %s", ErrInvalidConfig, oneLine(err))
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", ErrInvalidConfig, fs.Arg(0))
	}
	if *sitesPath == "" {
		return c, fmt.Errorf("%w: --sites FILE is required (see examples/sites.yaml)", ErrInvalidConfig)
	}
	sites, err := LoadSites(*sitesPath)
	if err != nil {
		return c, err
	}
	c.Sites = sites
	if strings.TrimSpace(c.HTTPListen) == "" {
		c.HTTPListen = ""
	}
	return c.withDefaults()
}
