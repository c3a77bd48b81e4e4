package bridge

// Headers of routed work-queue messages, for the external tests that
// put such messages into a site's intake themselves.
const (
	HeaderRoutedForTest   = headerRouted
	HeaderRoutedByForTest = headerRoutedBy
)
