package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// RequireBinary returns the path of the named program. When it is not
// installed the test is skipped, or fails when the CI environment variable
// is "true" (CI installs it through `make deps`).
func RequireBinary(t testing.TB, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not installed (%v); install the Debian package %s (make deps does)", name, err, debianPackage)
	}
	t.Skipf("%s not installed; install the Debian package %s (make deps does)", name, debianPackage)
	return ""
}
