package main

import (
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestModuleVersions(t *testing.T) {
	t.Parallel()
	deps := func(q *debug.Module) *debug.BuildInfo {
		return &debug.BuildInfo{Deps: []*debug.Module{
			q,
			{Path: "github.com/go-redsync/redsync/v4", Version: "v4.18.1"},
			{Path: "github.com/bsm/redislock", Version: "v0.9.4"},
			{Path: "github.com/redis/go-redis/v9", Version: "v9.23.0"},
		}}
	}
	v := moduleVersions(deps(&debug.Module{Path: quorumlockModule, Version: "v1.2.3"}), "")
	if v.Quorumlock != "v1.2.3" || v.Libs["redsync"] != "v4.18.1" || v.Libs["redislock"] != "v0.9.4" || v.Libs["go-redis"] != "v9.23.0" {
		t.Errorf("moduleVersions(from a proxy) = %+v; want quorumlock v1.2.3 and the libraries' versions", v)
	}
	replaced := &debug.Module{Path: quorumlockModule, Version: "v0.0.0-00010101000000-000000000000", Replace: &debug.Module{Path: "../"}}
	if v := moduleVersions(deps(replaced), ""); !strings.Contains(v.Quorumlock, "replaced by ../") {
		t.Errorf("moduleVersions(replaced, no checkout) = %q; want it to say the commit is unknown", v.Quorumlock)
	}
	stamped := deps(replaced)
	stamped.Settings = []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}
	if v := moduleVersions(stamped, ""); v.Quorumlock != "0123456789ab-dirty" {
		t.Errorf("moduleVersions(stamped) = %q; want 0123456789ab-dirty", v.Quorumlock)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not on PATH")
	}
	// This test runs inside the repository's checkout.
	if v := moduleVersions(deps(replaced), sourceDir()); !regexp.MustCompile(`^[0-9a-f]{7,}(-dirty)?$`).MatchString(v.Quorumlock) {
		t.Errorf("moduleVersions(replaced, in the checkout) = %q; want a commit", v.Quorumlock)
	}
}

func TestVersionsString(t *testing.T) {
	t.Parallel()
	v := Versions{Go: "go1.26.0", Redis: "7.0.15", Quorumlock: "abc123", Libs: map[string]string{"redsync": "v4.18.1", "go-redis": "v9.23.0"}}
	if got, want := v.String(), "Go 1.26.0, Redis 7.0.15, quorumlock abc123, redsync v4.18.1, go-redis v9.23.0"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
}
