//go:build race

package session

// raceEnabled: the race detector keeps state of its own per goroutine and
// per synchronisation object, which memory checks must allow for.
const raceEnabled = true
