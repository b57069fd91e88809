package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"

	"github.com/quorumlock/quorumlock/redlock"
)

// cmdElect is qlock elect: campaign, run the command while leader, stop it
// on loss and campaign again; exit with its code when it exits on its own.
func cmdElect(args []string, stdout, stderr io.Writer) int {
	var c common
	name, command, code, ok := c.parseCommand("elect", "NAME", args, stdout, stderr)
	if !ok {
		return code
	}
	if c.permits != 0 {
		return fail(stderr, exitUsage, fmt.Errorf("elect: -n is for run and status (see qlock help)"))
	}
	sigs := make(chan os.Signal, 8)
	notifySignals(sigs)
	defer signal.Stop(sigs)

	s := session{c: &c, name: name, stderr: stderr, elect: true,
		lockOpts: []redlock.Option{redlock.WithTTL(c.ttl), redlock.WithFencing(c.fencing)}}
	defer s.close()
	for {
		term, code := s.acquire(sigs, -1)
		if term == nil {
			return code
		}
		res := runChild(term, name, command, &c, sigs, stderr)
		s.resign(term)
		if res.lost == nil {
			return res.code
		}
		if res.sig != 0 {
			// Asked to end (systemctl stop, Ctrl-C) while the command
			// was being stopped after a loss: do not campaign again.
			fmt.Fprintf(stderr, "qlock: %s: leadership lost; stopped by %v, not campaigning again\n", name, res.sig)
			return 128 + int(res.sig)
		}
		fmt.Fprintf(stderr, "qlock: %s: leadership lost; campaigning again\n", name)
	}
}
