package redistest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks, after all tests, that Close stopped every goroutine the
// harness started: proxy loops, pumps and process reapers.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
