//go:build !unix

package main

import "time"

// processCPU cannot be read here: the client CPU column stays empty.
func processCPU() time.Duration { return -1 }
