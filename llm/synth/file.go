package synth

import (
	"fmt"
	"os"
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
