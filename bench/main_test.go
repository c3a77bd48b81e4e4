package bench

import "testing"

func TestMain(m *testing.M) { testMainWithMochi(m) }
