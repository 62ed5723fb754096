package synth

import (
	"bytes"
	"fmt"
	"os"

	"github.com/xpuhub/xpu/llm/gguf"
)

// WriteFile writes the model s as a GGUF file at path, removing the partial file if writing
// fails.
func WriteFile(path string, s Spec) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if err := Write(f, s); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

// Parse writes the model s into memory and parses it: a model for tests and examples that
// need no file.
func Parse(s Spec) (*gguf.File, error) {
	var buf bytes.Buffer
	if err := Write(&buf, s); err != nil {
		return nil, err
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	return f, nil
}
