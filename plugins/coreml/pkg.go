package coreml

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Paths inside an .mlpackage (the layout coremltools writes and MLModel compileModelAtURL:
// reads): Manifest.json names the root item, the items live under Data/.
const (
	manifestName = "Manifest.json"
	specPath     = "com.apple.CoreML/model.mlmodel"
	weightsPath  = "com.apple.CoreML/weights"
)

type manifestItem struct {
	Author      string `json:"author"`
	Description string `json:"description"`
	Name        string `json:"name"`
	Path        string `json:"path"`
}

type manifest struct {
	FileFormatVersion   string                  `json:"fileFormatVersion"`
	ItemInfoEntries     map[string]manifestItem `json:"itemInfoEntries"`
	RootModelIdentifier string                  `json:"rootModelIdentifier"`
}

// key is the package's content hash: the compiled-model cache key (with the build id).
func (l *lowered) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(l.model))
	h.Write(l.model)
	h.Write(l.weights)
	return hex.EncodeToString(h.Sum(nil))
}

// uuid makes a stable identifier from the content hash, so that one graph always gives the same
// package bytes.
func uuid(key, salt string) string {
	s := sha256.Sum256([]byte(key + salt))
	x := hex.EncodeToString(s[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// writePackage writes the .mlpackage directory dir (created; it must not exist).
func writePackage(dir string, l *lowered) error {
	k := l.key()
	specID, weightsID := uuid(k, "spec"), uuid(k, "weights")
	m := manifest{
		FileFormatVersion: "1.0.0",
		ItemInfoEntries: map[string]manifestItem{
			specID:    {"com.apple.CoreML", "CoreML Model Specification", "model.mlmodel", specPath},
			weightsID: {"com.apple.CoreML", "CoreML Model Weights", "weights", weightsPath},
		},
		RootModelIdentifier: specID,
	}
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	data := filepath.Join(dir, "Data")
	if err := os.MkdirAll(filepath.Join(data, filepath.FromSlash(weightsPath)), 0o755); err != nil {
		return fmt.Errorf("coreml: package: %w", err)
	}
	files := []struct {
		path string
		b    []byte
	}{
		{filepath.Join(dir, manifestName), js},
		{filepath.Join(data, filepath.FromSlash(specPath)), l.model},
		{filepath.Join(data, filepath.FromSlash(weightsPath), "weight.bin"), l.weights},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.b, 0o644); err != nil {
			return fmt.Errorf("coreml: package: %w", err)
		}
	}
	return nil
}
