package dashboard

import (
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHandlerServesPage(t *testing.T) {
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)

	for _, path := range []string{"/", "/dashboard"} {
		t.Run(path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + path)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)

			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
			require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
			require.NotEmpty(t, resp.Header.Get("Content-Security-Policy"))
			require.Contains(t, string(body), `"`+GroupsPath+`"`)
			require.Contains(t, string(body), `"`+OverviewPath+`"`)
			require.Contains(t, string(body), `id="error-banner"`)
			require.Contains(t, string(body), "No shared groups yet")
		})
	}
}

func TestHandlerMethods(t *testing.T) {
	tests := []struct {
		method   string
		status   int
		wantBody bool
	}{
		{http.MethodGet, http.StatusOK, true},
		{http.MethodHead, http.StatusOK, false},
		{http.MethodPost, http.StatusMethodNotAllowed, false},
		{http.MethodDelete, http.StatusMethodNotAllowed, false},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Handler().ServeHTTP(rec, httptest.NewRequest(tt.method, "/", nil))
			require.Equal(t, tt.status, rec.Code)
			if tt.wantBody {
				require.Equal(t, page, rec.Body.Bytes())
			} else if tt.status == http.StatusOK {
				require.Empty(t, rec.Body.Bytes())
			} else {
				require.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
			}
		})
	}
}

// The page must work offline: nothing it loads may come from another
// origin.
func TestPageIsSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href|action)\s*=\s*["']?\s*(https?:)?//|@import|url\(|\bimport\s*\(`)
	require.Nil(t, external.Find(page), "page references an external resource")
	require.Len(t, inlineScript.FindAll(page, -1), 1)
	require.Len(t, inlineStyle.FindAll(page, -1), 1)
}

func TestContentSecurityPolicyHashesInlineCode(t *testing.T) {
	hashOf := func(re *regexp.Regexp) string {
		sum := sha256.Sum256(re.FindSubmatch(page)[1])
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	require.Contains(t, contentSecurityPolicy, "script-src "+hashOf(inlineScript)+";")
	require.Contains(t, contentSecurityPolicy, "style-src "+hashOf(inlineStyle)+";")
	require.Contains(t, contentSecurityPolicy, "connect-src 'self'")
	require.NotContains(t, contentSecurityPolicy, "unsafe-inline")

	require.Equal(t, "default-src 'none'; script-src 'none'; style-src 'none'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		buildCSP([]byte("<p>no code</p>")))
}
