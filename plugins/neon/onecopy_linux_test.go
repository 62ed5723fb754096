//go:build linux

package neon_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
)

// mappingRss is the resident size in KiB of this process's mapping that starts at addr, from
// /proc/self/smaps.
func mappingRss(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	head := fmt.Sprintf("%x-", addr)
	sc := bufio.NewScanner(f)
	found := false
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, head) {
			found = true
			continue
		}
		if rest, ok := strings.CutPrefix(l, "Rss:"); ok && found {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			require.NoError(t, err)
			return kb
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping at %#x in /proc/self/smaps", addr)
	return 0
}

// pageSink keeps the reads that fault pages in from being optimised away.
var pageSink byte

// TestRepackedWeightLeavesOneCopy: once a quantized weight mapped from a file is repacked, its
// file pages leave the process (the repacked copy is the one resident copy; a model held twice
// needs twice the memory), while its bytes stay readable. Pages of a private mapping, whose
// bytes may exist nowhere else, stay as they are.
func TestRepackedWeightLeavesOneCopy(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	const n, k = 512, 1024 // 288 KiB of Q4_0: 72 pages
	wdata, err := core.Quantize(core.Q4_0, randF32(rng, n*k), 1.0/64)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "w.bin")
	require.NoError(t, os.WriteFile(path, wdata, 0o644))
	wantKB := len(wdata) / 1024

	cases := []struct {
		name    string
		flags   int
		prot    int
		modify  bool // write into the private pages: they then hold the only copy of their bytes
		dropped bool
	}{
		{name: "shared file mapping", flags: unix.MAP_SHARED, prot: unix.PROT_READ, dropped: true},
		{name: "private mapping written to", flags: unix.MAP_PRIVATE, prot: unix.PROT_READ | unix.PROT_WRITE, modify: true},
	}
	for _, f := range pluginFiles(t) {
		for _, tc := range cases {
			t.Run(filepath.Base(f)+"/"+tc.name, func(t *testing.T) {
				fd, err := unix.Open(path, unix.O_RDWR, 0)
				require.NoError(t, err)
				mem, err := unix.Mmap(fd, 0, len(wdata), tc.prot, tc.flags)
				require.NoError(t, unix.Close(fd))
				require.NoError(t, err)
				t.Cleanup(func() { _ = unix.Munmap(mem) })
				want := append([]byte(nil), wdata...)
				if tc.modify {
					for i := 0; i < len(mem); i += 4096 {
						mem[i+2] ^= 0x5a // a quant byte of a block: any value is a valid weight
						want[i+2] ^= 0x5a
					}
				}
				for i := 0; i < len(mem); i += 4096 {
					pageSink += mem[i] // fault every page in
				}
				addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
				require.GreaterOrEqual(t, mappingRss(t, addr), wantKB-4, "the weight's pages are resident before the prepare")

				dev := openUsable(t, f).Devices()[0]
				cctx, err := dev.NewContext(ctx, map[string]string{"threads": "2"})
				require.NoError(t, err)
				defer func() { require.NoError(t, cctx.Close()) }()
				g := core.NewGraph()
				a := g.Input("a", core.F32, 1, k)
				g.Output(g.MatMul(a, g.Const("w", core.Q4_0, core.Shape{n, k}, mem)))
				require.NoError(t, g.Err())
				exe, err := cctx.Prepare(ctx, g)
				require.NoError(t, err)
				defer func() { require.NoError(t, exe.Close()) }()

				rss := mappingRss(t, addr)
				if tc.dropped {
					require.LessOrEqual(t, rss, 8, "the repacked weight's file pages must leave the process (%d KiB of %d stay)", rss, wantKB)
				} else {
					require.GreaterOrEqual(t, rss, wantKB-4, "a private mapping's pages must stay")
				}
				require.Equal(t, want, mem, "the weight's bytes must read the same after the repack")
			})
		}
	}
}
