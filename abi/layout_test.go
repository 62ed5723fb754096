package abi

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mirrors pairs every Go mirror with the C struct it mirrors.
var mirrors = []struct {
	c   string
	go_ any
}{
	{"xpu_probe_result", cProbeResult{}},
	{"xpu_host_info", cHostInfo{}},
	{"xpu_plugin_info", cPluginInfo{}},
	{"xpu_device_info", cDeviceInfo{}},
	{"xpu_op_query", cOpQuery{}},
	{"xpu_node_verdict", cNodeVerdict{}},
	{"xpu_import_desc", cImportDesc{}},
	{"xpu_prepare_desc", cPrepareDesc{}},
	{"xpu_fence_point", cFencePoint{}},
	{"xpu_api", cAPI{}},
}

// TestStructLayout compiles a C program that prints sizeof and offsetof of every field the Go
// mirrors name, as gcc lays them out from xpu_backend.h, and compares with unsafe.Sizeof /
// Offsetof (through reflect). A field added to the header without its Go mirror shows up as a
// size mismatch.
func TestStructLayout(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot compare the Go mirrors with the C header")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the layout program is run natively on linux only")
	}
	var src strings.Builder
	src.WriteString("#include <stddef.h>\n#include <stdio.h>\n#include \"xpu_backend.h\"\nint main(void) {\n")
	for _, m := range mirrors {
		fmt.Fprintf(&src, "  printf(\"%s sizeof %%zu\\n\", sizeof(%s));\n", m.c, m.c)
		ty := reflect.TypeOf(m.go_)
		for i := range ty.NumField() {
			f := ty.Field(i)
			cname := f.Tag.Get("c")
			require.NotEmpty(t, cname, "%s.%s has no c tag", ty.Name(), f.Name)
			fmt.Fprintf(&src, "  printf(\"%s.%s %%zu %%zu\\n\", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n",
				m.c, cname, m.c, cname, m.c, cname)
		}
	}
	src.WriteString("  return 0;\n}\n")

	dir := t.TempDir()
	cfile := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	require.NoError(t, os.WriteFile(cfile, []byte(src.String()), 0o644))
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I.", "-o", bin, cfile).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)

	got := map[string][2]uint64{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		require.Len(t, parts, 3, "line %q", sc.Text())
		a, err1 := strconv.ParseUint(parts[1], 10, 64)
		b, err2 := strconv.ParseUint(parts[2], 10, 64)
		if parts[1] == "sizeof" {
			a, err1 = b, err2
		}
		require.NoError(t, err1)
		require.NoError(t, err2)
		got[parts[0]] = [2]uint64{a, b}
	}

	for _, m := range mirrors {
		ty := reflect.TypeOf(m.go_)
		t.Run(m.c, func(t *testing.T) {
			require.Equal(t, got[m.c][0], uint64(ty.Size()), "sizeof(%s) vs unsafe.Sizeof(%s)", m.c, ty.Name())
			for i := range ty.NumField() {
				f := ty.Field(i)
				key := m.c + "." + f.Tag.Get("c")
				c, ok := got[key]
				require.True(t, ok, "%s missing from the C output", key)
				require.Equal(t, c[0], uint64(f.Offset), "offsetof(%s)", key)
				require.Equal(t, c[1], uint64(f.Type.Size()), "sizeof(%s)", key)
			}
		})
	}
	// the table's entry count is derived from the mirror: the raw API must cover every entry
	require.Len(t, entryNames, (int(reflect.TypeOf(cAPI{}).Size())-apiHeaderSize)/8)
}
