package benchmarks

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain stops the shared nodes after every benchmark, then checks that no
// goroutine is left behind (goleak.VerifyTestMain would exit before the
// nodes are stopped).
func TestMain(m *testing.M) {
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks: stopping nodes:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
