package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Versions says what was measured, so that two runs can be told apart: the
// Go toolchain, the Redis servers, the quorumlock source and the version of
// every other library in the tables.
type Versions struct {
	Go string `json:"go"`
	// Redis lists the distinct redis_version values the nodes report, in
	// node order ("unknown" when INFO failed on every node), or the
	// miniredis module version for embedded miniredis nodes.
	Redis string `json:"redis"`
	// Quorumlock is the commit of the checkout the benchmarks module
	// replaces it with (a "-dirty" suffix when tracked files differ from
	// it), or the module version when it comes from a module proxy.
	Quorumlock string `json:"quorumlock"`
	// Libs maps each compared library to its module version, from the
	// binary's build information.
	Libs map[string]string `json:"libs"`
}

const quorumlockModule = "github.com/quorumlock/quorumlock"

// libModules are the modules whose versions the report names, by the name
// the tables use.
var libModules = []struct{ name, path string }{
	{"redsync", "github.com/go-redsync/redsync/v4"},
	{"redislock", "github.com/bsm/redislock"},
	{"go-redis", "github.com/redis/go-redis/v9"}, // every library's client, and the floor
}

// miniredisModule is the embedded server when redis-server is not used; its
// version then stands for the Redis version.
const miniredisModule = "github.com/alicebob/miniredis/v2"

// String is the one-line form for the header and the chart.
func (v Versions) String() string {
	parts := []string{"Go " + strings.TrimPrefix(v.Go, "go"), "Redis " + v.Redis, "quorumlock " + v.Quorumlock}
	for _, m := range libModules {
		if ver := v.Libs[m.name]; ver != "" {
			parts = append(parts, m.name+" "+ver)
		}
	}
	return strings.Join(parts, ", ")
}

// readVersions collects the versions of this binary's toolchain and
// dependencies and asks the nodes for theirs (unless they are embedded
// miniredis nodes, which report the Redis version they imitate).
func readVersions(ctx context.Context, nodes []redis.UniversalClient, miniredis bool) Versions {
	bi, _ := debug.ReadBuildInfo()
	v := moduleVersions(bi, sourceDir())
	v.Go = runtime.Version()
	if miniredis {
		v.Redis = "miniredis " + v.Libs["miniredis"]
		return v
	}
	var seen []string
	for _, n := range nodes {
		if s := serverVersion(ctx, n); s != "" && !slices.Contains(seen, s) {
			seen = append(seen, s)
		}
	}
	v.Redis = "unknown"
	if len(seen) > 0 {
		v.Redis = strings.Join(seen, " and ")
	}
	return v
}

// moduleVersions reads the library versions and the quorumlock source from
// bi; dir is where to ask git for the commit when quorumlock is replaced by
// a local directory (this repository).
func moduleVersions(bi *debug.BuildInfo, dir string) Versions {
	v := Versions{Libs: map[string]string{}, Quorumlock: "unknown"}
	if bi == nil {
		return v
	}
	for _, d := range bi.Deps {
		if d.Path == quorumlockModule {
			if d.Replace == nil {
				v.Quorumlock = d.Version
			} else if c := gitCommit(dir); c != "" {
				v.Quorumlock = c
			} else if c := vcsCommit(bi); c != "" {
				v.Quorumlock = c
			} else {
				v.Quorumlock = "unknown commit (replaced by " + d.Replace.Path + ")"
			}
		}
		if d.Path == miniredisModule {
			v.Libs["miniredis"] = d.Version
		}
		for _, m := range libModules {
			if d.Path == m.path {
				v.Libs[m.name] = d.Version
				if d.Replace != nil && d.Replace.Version != "" {
					v.Libs[m.name] = d.Replace.Version
				}
			}
		}
	}
	return v
}

// vcsCommit is the revision the go command stamped into the binary (go
// build in a checkout, unless -buildvcs=false), with "-dirty" when the
// tree had changes.
func vcsCommit(bi *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return ""
	}
	rev = rev[:min(len(rev), 12)]
	if modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// gitCommit returns the short commit of the git checkout holding dir, with
// "-dirty" when tracked files differ from it, or "" when dir is not in a
// checkout or git is missing.
func gitCommit(dir string) string {
	if dir == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	status, err := exec.CommandContext(ctx, "git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(strings.TrimSpace(string(status))) > 0 {
		rev += "-dirty"
	}
	return rev
}

// sourceDir is the directory of this source file when it still exists (go
// run, or go build without -trimpath, in the repository), else the working
// directory: either way a directory inside the checkout that quorumlock is
// replaced by, when lockbench runs from it.
func sourceDir() string {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if st, err := os.Stat(filepath.Dir(file)); err == nil && st.IsDir() {
			return filepath.Dir(file)
		}
	}
	wd, _ := os.Getwd()
	return wd
}
