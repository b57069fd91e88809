package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock/internal/redistest"
)

// qlockBin is the qlock binary the end-to-end tests run, built once by
// TestMain into a temporary directory.
var qlockBin string

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	redistest.WaitingParallel(2)
	dir, err := os.MkdirTemp("", "qlock-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	qlockBin = filepath.Join(dir, "qlock")
	goTool, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "the qlock tests build the binary and need the go command on PATH:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	build := exec.Command(goTool, "build", "-o", qlockBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building qlock:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := 0
	defer func() {
		os.RemoveAll(dir)
		os.Exit(code)
	}()
	code = runLeakChecked(m)
}

func runLeakChecked(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}
