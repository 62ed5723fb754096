// Package hostsync is the host side of cross-unit synchronisation: a completion Signal that
// sleeps, spins and then blocks (a futex on Linux), a per-key duration Predictor that tells a
// waiter how long to sleep first, and OS-thread CPU affinity for workers pinned to cores.
//
// It imports nothing of the scheduler, so backends, profilers and benchmarks can use the same
// primitives the scheduler's workers wait on.
package hostsync
