package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/xpuhub/xpu/llm/grammar"
)

// grammarFlags are run's constrained-decoding flags, spelled as llama.cpp's.
type grammarFlags struct {
	text, file, schema *string
}

func addGrammarFlags(fs *flag.FlagSet) *grammarFlags {
	return &grammarFlags{
		text:   fs.String("grammar", "", "hold the output to this GBNF grammar (llama.cpp's syntax; the start rule is root)"),
		file:   fs.String("grammar-file", "", "hold the output to the GBNF grammar in this file"),
		schema: fs.String("json-schema", "", "hold the output to JSON that this JSON Schema accepts (the schema, or @FILE)"),
	}
}

// compile returns the grammar the flags name, nil when none does.
func (f *grammarFlags) compile() (*grammar.Grammar, error) {
	set := 0
	for _, s := range []string{*f.text, *f.file, *f.schema} {
		if s != "" {
			set++
		}
	}
	if set > 1 {
		return nil, errors.New("--grammar, --grammar-file and --json-schema: give one")
	}
	switch {
	case *f.text != "":
		g, err := grammar.Parse(*f.text)
		if err != nil {
			return nil, fmt.Errorf("--grammar: %w", err)
		}
		return g, nil
	case *f.file != "":
		src, err := readSmallFile(*f.file)
		if err != nil {
			return nil, fmt.Errorf("--grammar-file: %w", err)
		}
		g, err := grammar.Parse(src)
		if err != nil {
			return nil, fmt.Errorf("--grammar-file %s: %w", *f.file, err)
		}
		return g, nil
	case *f.schema != "":
		src := *f.schema
		if name, ok := strings.CutPrefix(src, "@"); ok {
			var err error
			if src, err = readSmallFile(name); err != nil {
				return nil, fmt.Errorf("--json-schema: %w", err)
			}
		}
		g, err := grammar.FromSchema([]byte(src))
		if err != nil {
			return nil, fmt.Errorf("--json-schema: %w", err)
		}
		return g, nil
	}
	return nil, nil
}

// maxGrammarBytes bounds a grammar or schema file: they are small texts.
const maxGrammarBytes = 4 << 20

// readSmallFile reads a grammar or schema file, refusing what is not a regular file (a FIFO
// would block) or is too large to be one.
func readSmallFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", path)
	}
	if st.Size() > maxGrammarBytes {
		return "", fmt.Errorf("%s: %d bytes; at most %d", path, st.Size(), maxGrammarBytes)
	}
	b, err := os.ReadFile(path)
	return string(b), err
}
