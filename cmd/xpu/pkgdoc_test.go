package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// packageDocProblems lists the Go packages under root whose package comment is missing, is
// given in more than one file (two comments drift apart), or does not begin the way go doc
// expects ("Package name ..." or, for a command, "Command dir ..."). A folder holding only
// tests is judged by its test files.
func packageDocProblems(root string) ([]string, error) {
	files := map[string][]string{} // folder → its non-test .go files, or its test files if none
	tests := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build" || name == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		dir := filepath.Dir(p)
		if strings.HasSuffix(name, "_test.go") {
			tests[dir] = append(tests[dir], p)
		} else {
			files[dir] = append(files[dir], p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for dir, ts := range tests {
		if len(files[dir]) == 0 {
			files[dir] = ts
		}
	}
	var problems []string
	for dir, ps := range files {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return nil, err
		}
		var docs []string
		pkg := ""
		for _, p := range ps {
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				return nil, err
			}
			pkg = strings.TrimSuffix(f.Name.Name, "_test")
			if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
				docs = append(docs, filepath.Base(p)+": "+f.Doc.Text())
			}
		}
		want := "Package " + pkg + " "
		if pkg == "main" {
			want = "Command " + filepath.Base(dir) + " "
		}
		switch {
		case len(docs) == 0:
			problems = append(problems, fmt.Sprintf("%s: no package comment (a doc.go saying what the package is for, in one sentence)", rel))
		case len(docs) > 1:
			problems = append(problems, fmt.Sprintf("%s: package comments in %d files (keep one): %s", rel, len(docs), strings.Join(docs, " | ")))
		case !strings.HasPrefix(docs[0][strings.Index(docs[0], ": ")+2:], want):
			problems = append(problems, fmt.Sprintf("%s: the package comment should begin %q: %s", rel, want, docs[0]))
		}
	}
	slices.Sort(problems)
	return problems, nil
}

// TestEveryPackageHasDoc: every package of the repository says what it is for in one package
// comment; the fixture shows that each kind of problem is found.
func TestEveryPackageHasDoc(t *testing.T) {
	problems, err := packageDocProblems(filepath.Join("..", ".."))
	require.NoError(t, err)
	assert.Empty(t, problems)

	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	}
	write("good/a.go", "// Package good is documented.\npackage good\n")
	write("good/b.go", "package good\n")
	write("none/a.go", "package none\n")
	write("twice/a.go", "// Package twice is documented.\npackage twice\n")
	write("twice/b.go", "// Package twice is documented again.\npackage twice\n")
	write("wrong/a.go", "// This package is documented the wrong way.\npackage wrong\n")
	write("cmd/tool/main.go", "// Command tool is documented.\npackage main\n")
	write("onlytests/a_test.go", "package onlytests_test\n")
	write("testdata/x/a.go", "package x\n")
	problems, err = packageDocProblems(root)
	require.NoError(t, err)
	require.Len(t, problems, 4, "%q", problems)
	for i, want := range []string{"none: no package comment", "onlytests: no package comment", "twice: package comments in 2 files", `wrong: the package comment should begin "Package wrong "`} {
		assert.Contains(t, problems[i], want)
	}
}
