package throughput

import (
	"testing"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

func TestMain(m *testing.M) { harness.TestMain(m) }
