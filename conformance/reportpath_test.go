package conformance

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backend's name comes from its plugin: whatever it is, the report files stay inside the
// report folder and are not hidden.
func TestReportFilesStayInTheirFolder(t *testing.T) {
	tests := []struct {
		name, base string
	}{
		{"neon", "neon"},
		{"..", "backend"},
		{".", "backend"},
		{"../../etc/x", "_.._etc_x"},
		{".hidden", "hidden"},
		{"a/b", "a_b"},
		{"", "backend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &Report{Backend: BackendRecord{Name: tt.name}}
			assert.Equal(t, tt.base, rep.FileBase())
			parent := t.TempDir()
			dir := filepath.Join(parent, "reports")
			require.NoError(t, rep.WriteFiles(dir))
			for _, ext := range []string{".json", ".md", ".xml", ".html"} {
				_, err := os.Stat(filepath.Join(dir, tt.base+ext))
				assert.NoError(t, err, "report %s%s", tt.base, ext)
			}
			entries, err := os.ReadDir(parent)
			require.NoError(t, err)
			require.Len(t, entries, 1, "only the report folder is in its parent")
		})
	}
}
