//go:build race

package main

// raceEnabled makes the tests build the daemon with the race detector
// when they run with it.
const raceEnabled = true
