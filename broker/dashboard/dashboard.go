// Package dashboard serves LuffyMQ's operator dashboard: one self-contained
// HTML page (its CSS and JavaScript inline, its charts drawn as SVG by the
// page itself, nothing fetched from elsewhere) showing the broker summary,
// charts of the last minutes, every shared group with its members, recent
// rejected load reports and, when it is on, the site bridge.
//
// The page follows GET /api/v1/events (Server-Sent Events: the history on
// connect, then a snapshot every second). When the stream cannot be opened
// it polls GET /api/v1/groups and GET /api/v1/overview (and the rejected
// reports and bridge endpoints) every second, trying the stream again every
// 15 s. The broker mounts Handler at / and /dashboard.
package dashboard

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

//go:embed index.html
var page []byte

// The API endpoints the page reads: EventsPath live, the others when it
// falls back to polling.
const (
	EventsPath          = "/api/v1/events"
	GroupsPath          = "/api/v1/groups"
	OverviewPath        = "/api/v1/overview"
	RejectedReportsPath = "/api/v1/rejected-reports"
	BridgePath          = "/api/v1/bridge"
)

// contentSecurityPolicy allows exactly the page's own inline script and
// style (by hash) and requests to its own origin, so a client ID that
// looks like markup can never run as code.
var contentSecurityPolicy = buildCSP(page)

// Handler returns an http.Handler that serves the dashboard page to GET
// and HEAD requests, whatever the path it is mounted at.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Length", strconv.Itoa(len(page)))
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(page)
		}
	})
}

var (
	inlineScript = regexp.MustCompile(`(?s)<script>(.*?)</script>`)
	inlineStyle  = regexp.MustCompile(`(?s)<style>(.*?)</style>`)
)

// buildCSP returns a Content-Security-Policy naming the hashes of the
// inline <script> and <style> blocks of html.
func buildCSP(html []byte) string {
	hashes := func(re *regexp.Regexp) string {
		var out []string
		for _, m := range re.FindAllSubmatch(html, -1) {
			sum := sha256.Sum256(m[1])
			out = append(out, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		}
		if len(out) == 0 {
			return "'none'"
		}
		return strings.Join(out, " ")
	}
	return strings.Join([]string{
		"default-src 'none'",
		"script-src " + hashes(inlineScript),
		"style-src " + hashes(inlineStyle),
		"connect-src 'self'",
		"img-src data:",
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}, "; ")
}
