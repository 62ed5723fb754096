// Package futex sleeps on and wakes a 32-bit word: the one futex(2) wrapper of the runtime's
// worker handoff (process-private) and of the isolated backend's ring (shared with the child).
package futex

// Scope says who else may wait on or wake a word.
type Scope int

const (
	// Private: only this process's threads use the word (Linux's FUTEX_PRIVATE_FLAG, cheaper).
	Private Scope = iota
	// Shared: the word lives in memory shared with another process.
	Shared
)
