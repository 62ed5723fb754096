//go:build race

package abi

// goExitRunsCExit: with the race detector, Go's exit finishes the race runtime, which leaves
// through the C library's exit() and so runs the exit guard (which then checks its caller).
const goExitRunsCExit = true
