package cachedir

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDir(t *testing.T) {
	for _, c := range []struct {
		name, xpu, xdg, home, sub, want string
		err                             bool
	}{
		{name: "XPU_CACHE_DIR wins", xpu: "/x", xdg: "/g", home: "/h", sub: "probe", want: "/x/probe"},
		{name: "then XDG", xdg: "/g", home: "/h", sub: "aecs", want: "/g/xpu/aecs"},
		{name: "then home", home: "/h", sub: "w8a8", want: "/h/.cache/xpu/w8a8"},
		{name: "root", xpu: "/x", want: "/x"},
		{name: "nothing set", sub: "spec", err: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(Env, c.xpu)
			t.Setenv("XDG_CACHE_HOME", c.xdg)
			t.Setenv("HOME", c.home)
			got, err := Dir(c.sub)
			if c.err {
				require.ErrorIs(t, err, ErrNoCacheDir)
				return
			}
			require.NoError(t, err)
			require.Equal(t, filepath.Clean(c.want), got)
		})
	}
}

func ExampleDir() {
	os.Setenv(Env, "/var/cache/xpu") // as a user would, before starting xpu
	d, _ := Dir("probe")
	fmt.Println(d)
	// Output: /var/cache/xpu/probe
}
