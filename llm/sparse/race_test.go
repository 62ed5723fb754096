//go:build race

package sparse

// raceEnabled: the race detector allocates, so allocation counts are skipped under it.
const raceEnabled = true
