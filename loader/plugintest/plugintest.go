// Package plugintest builds the test plugin of loader/testdata (a small real xpu plugin) with
// gcc for tests, in one of its deliberately broken variants when asked.
package plugintest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the module root (the folder holding go.mod), found by walking up from the working
// directory; "" when there is none.
func Root() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

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
	args = append(args, "-o", out, filepath.Join(root, "loader", "testdata", "testplugin.c"), "-lpthread")
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cc, args, err, b)
	}
	return out
}

// Plugin builds the intact test plugin into a fresh temporary folder.
func Plugin(t testing.TB, defines ...string) string {
	t.Helper()
	return Build(t, t.TempDir(), "testplugin", "", defines...)
}
