//go:build !race

package neon_test

const raceEnabled = false
