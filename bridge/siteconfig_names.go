package bridge

import "github.com/luffymq/luffymq/bridge/siteconfig"

// The site configuration and the RabbitMQ names it refers to live in
// package siteconfig, which needs no broker (luffy-controller uses it);
// the bridge keeps its names for them.

type (
	// SiteConfig is siteconfig.SiteConfig.
	SiteConfig = siteconfig.SiteConfig
	// Upstream is siteconfig.Upstream.
	Upstream = siteconfig.Upstream
	// ExchangeFederation is siteconfig.ExchangeFederation.
	ExchangeFederation = siteconfig.ExchangeFederation
	configMessage      = siteconfig.Message
)

// Names from siteconfig.
const (
	UpstreamPrefix         = siteconfig.UpstreamPrefix
	ExchangeUpstreamPrefix = siteconfig.ExchangeUpstreamPrefix
	WorkQueuePrefix        = siteconfig.WorkQueuePrefix
	MaxAMQPNameLength      = siteconfig.MaxAMQPNameLength
)

// ErrInvalidConfig is siteconfig.ErrInvalidConfig: every configuration
// error of the bridge wraps it.
var ErrInvalidConfig = siteconfig.ErrInvalidConfig

// WorkQueueName returns the durable queue of shared group g: "wq.<g>".
func WorkQueueName(g string) string { return siteconfig.WorkQueueName(g) }

// DeadLetterExchangeName is siteconfig.DeadLetterExchangeName: "wq.<g>.dlx".
func DeadLetterExchangeName(g string) string { return siteconfig.DeadLetterExchangeName(g) }

// IntakeExchangeName is siteconfig.IntakeExchangeName: "wq.<g>.in".
func IntakeExchangeName(g string) string { return siteconfig.IntakeExchangeName(g) }

// RouteExchangeName is siteconfig.RouteExchangeName: "wq.<g>.to".
func RouteExchangeName(g string) string { return siteconfig.RouteExchangeName(g) }

// ConfigQueueName returns the site's configuration queue.
func ConfigQueueName(site string) string { return siteconfig.ConfigQueueName(site) }

// ParseSiteConfig is siteconfig.ParseSiteConfig.
func ParseSiteConfig(body []byte) (SiteConfig, error) { return siteconfig.ParseSiteConfig(body) }

// SiteConfigEntity is siteconfig.SiteConfigEntity.
func SiteConfigEntity(x string) (entity string, ok bool) { return siteconfig.SiteConfigEntity(x) }

func validName(s string) bool  { return siteconfig.ValidName(s) }
func redact(raw string) string { return siteconfig.Redact(raw) }
func federationFor(m configMessage) ([]ExchangeFederation, error) {
	return siteconfig.FederationFor(m)
}
