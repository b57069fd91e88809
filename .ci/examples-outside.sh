#!/usr/bin/env bash
# Builds every example under examples/ as a user would: copied into a
# scratch module outside this repository, with the quorumlock module
# replaced by this checkout. Then runs the minimal example and the quick
# start. Fails if an example imports anything a user's module cannot (an
# internal package of this module) or does not build or run.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# The README shows examples/minimal/main.go verbatim: the block that follows
# the line naming the file must be the file.
awk '/^`examples\/minimal\/main.go`/ {found=1} found && /^```go$/ {on=1; next} on && /^```$/ {exit} on {print}' \
  "$repo/README.md" >"$scratch/readme-minimal.go"
if ! diff -u "$repo/examples/minimal/main.go" "$scratch/readme-minimal.go"; then
  echo "README.md: the minimal program differs from examples/minimal/main.go (copy the file into the README)" >&2
  exit 1
fi

for dir in "$repo"/examples/*/; do
  name="$(basename "$dir")"
  mod="$scratch/$name"
  mkdir -p "$mod"
  cp "$dir"*.go "$mod/"
  (
    cd "$mod"
    go mod init "example.com/$name" >/dev/null 2>&1
    go mod edit -replace "github.com/quorumlock/quorumlock=$repo"
    if ! go mod tidy >"$mod.tidy.log" 2>&1; then
      cat "$mod.tidy.log" >&2
      exit 1
    fi
    go vet .
    go build -o "$scratch/bin/$name" .
  )
  echo "-- $name: builds outside the repository"
done

# The README's two replace lines, for a module that uses the Prometheus
# adapter (a nested module: both must be replaced).
prom="$scratch/with-prometheus"
mkdir -p "$prom"
cat >"$prom/main.go" <<'GO'
package main

import (
	"github.com/prometheus/client_golang/prometheus"

	redlockprom "github.com/quorumlock/quorumlock/prometheus"
	"github.com/quorumlock/quorumlock/redlock"
)

func main() {
	h := redlockprom.New()
	prometheus.MustRegister(h)
	_ = redlock.WithHooks(h)
}
GO
(
  cd "$prom"
  go mod init example.com/with-prometheus >/dev/null 2>&1
  go mod edit -replace "github.com/quorumlock/quorumlock=$repo"
  go mod edit -replace "github.com/quorumlock/quorumlock/prometheus=$repo/prometheus"
  go mod tidy >"$prom.tidy.log" 2>&1 || { cat "$prom.tidy.log" >&2; exit 1; }
  go build -o /dev/null .
)
echo "-- a program using the Prometheus adapter: builds outside the repository with the README's replace lines"

for name in minimal quickstart; do
  echo "-- $name: runs"
  (cd "$scratch" && timeout 120 "$scratch/bin/$name")
done
