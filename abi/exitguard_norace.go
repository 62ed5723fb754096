//go:build !race

package abi

// goExitRunsCExit: without the race detector, Go's exit is the exit_group system call and
// runs no C exit handler.
const goExitRunsCExit = false
