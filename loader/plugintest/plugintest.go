// Package plugintest builds the test plugin of loader/testdata (a small real xpu plugin) with
// gcc for tests, in one of its deliberately broken variants when asked.
package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/xpuhub/xpu/internal/modroot"
)

// Root is the module root (the folder holding go.mod), found by walking up from the working
// directory; "" when there is none.
func Root() string { return modroot.Find() }

// CC returns the C compiler, skipping the test when there is none.
func CC(t testing.TB) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the test plugin cannot be built")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the test plugins are built for linux")
	}
	return cc
}

// Build compiles loader/testdata/testplugin.c with the given -D defines into
// dir/libxpu-<name>.so and returns the path. cc "" means the native gcc.
func Build(t testing.TB, dir, name, cc string, defines ...string) string {
	t.Helper()
	if cc == "" {
		cc = CC(t)
	}
	root := Root()
	if root == "" {
		t.Fatal("module root not found")
	}
	out := filepath.Join(dir, "libxpu-"+name+".so")
	args := []string{"-std=c11", "-O1", "-g", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
		"-fvisibility=hidden", "-D_GNU_SOURCE", "-I" + filepath.Join(root, "abi"),
		"-I" + filepath.Join(root, "plugins", "common")}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, "-o", out, filepath.Join(root, "loader", "testdata", "testplugin.c"), "-lpthread", "-lm")
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cc, args, err, b)
	}
	return out
}

// builds caches Plugin's results for the test binary's life: a gcc run costs far more than
// the test that needs the plugin.
var builds struct {
	sync.Mutex
	dir   string
	paths map[string]string
}

// Plugin builds the test plugin with the given defines, once per test binary, into a folder of
// its own (file libxpu-testplugin.so). Call Cleanup from TestMain to remove the builds.
func Plugin(t testing.TB, defines ...string) string {
	t.Helper()
	builds.Lock()
	defer builds.Unlock()
	key := strings.Join(defines, "\x00")
	if p, ok := builds.paths[key]; ok {
		return p
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "xpu-plugintest-")
		if err != nil {
			t.Fatal(err)
		}
		builds.dir, builds.paths = dir, map[string]string{}
	}
	sub := filepath.Join(builds.dir, strconv.Itoa(len(builds.paths)))
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	p := Build(t, sub, "testplugin", "", defines...)
	builds.paths[key] = p
	return p
}

// Cleanup removes what Plugin built (plugins stay mapped in this process: the loader never
// dlcloses, and a mapped file outlives its name).
func Cleanup() {
	builds.Lock()
	defer builds.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
		builds.dir, builds.paths = "", nil
	}
}
