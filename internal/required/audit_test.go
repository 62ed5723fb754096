package required

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/modroot"
)

// No test skips on a backend that could not be opened, or on a command that failed, other than
// through Skip: a bare t.Skip there passes on CI exactly when the backend XPU_REQUIRE_BACKENDS
// promises has gone missing. The rule read from the syntax: an if whose body calls
// Skip/Skipf on anything but this package and whose condition tests an error just returned by
// an Open call (loader.Open, Open in the loader), or a command's stderr (errOut), is flagged,
// unless a comment in the if's body says "not a missing backend" and why.
func TestNoBareSkipOnBackendErrors(t *testing.T) {
	root := modroot.Find()
	require.NotEmpty(t, root)
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "build", "lab", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, at := range bareSkips(f) {
			rel, _ := filepath.Rel(root, path)
			found = append(found, rel+":"+strconv.Itoa(fset.Position(at).Line))
		}
		return nil
	})
	require.NoError(t, err)
	assert.Empty(t, found, "tests that skip on a backend error without required.Skip (use required.Skip(t, backend, ...))")
}

// The rule flags the shapes it is meant for and leaves the others alone.
func TestBareSkipsRule(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		flagged   int
	}{
		{"skip on loader.Open", `b, err := loader.Open(ctx, "neon")
			if err != nil { t.Skipf("no neon: %v", err) }`, 1},
		{"skip on Open in the loader", `b, err := Open(ctx, "neon")
			if errors.Is(err, core.ErrNotFound) { t.Skip("no neon") }`, 1},
		{"skip on a command's stderr", `code, out, errOut := runCLI(t, "run")
			if code != 0 && strings.Contains(errOut, "neon") { t.Skipf("neon: %s", errOut) }`, 1},
		{"required.Skip", `b, err := loader.Open(ctx, "neon")
			if err != nil { required.Skip(t, "neon", "no neon: %v", err) }`, 0},
		{"exempted", `b, err := loader.Open(ctx, path)
			if errors.Is(err, core.ErrUnsupported) {
				// not a missing backend: another build of it runs here
				t.Skip("this build does not run here")
			}`, 0},
		{"skip on something else", `_, err := os.Stat(model)
			if err != nil { t.Skip("no model") }`, 0},
		{"skip on a later error", `b, err := loader.Open(ctx, "neon")
			top, err := cputopo.Read()
			if err != nil { t.Skip("no topology") }`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parser.ParseFile(token.NewFileSet(), "x_test.go", "package x\nfunc f() {\n"+tc.src+"\n}\n", parser.ParseComments)
			require.NoError(t, err)
			assert.Len(t, bareSkips(f), tc.flagged)
			// the same in a benchmark, run by hand: never flagged
			f, err = parser.ParseFile(token.NewFileSet(), "x_test.go", "package x\nfunc BenchmarkF(b *testing.B) {\n"+tc.src+"\n}\n", 0)
			require.NoError(t, err)
			assert.Empty(t, bareSkips(f))
		})
	}
}

// bareSkips returns the positions of the flagged Skip calls in f, benchmarks aside (run by
// hand, never under XPU_REQUIRE_BACKENDS).
func bareSkips(f *ast.File) []token.Pos {
	var out []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		if fd, ok := n.(*ast.FuncDecl); ok && takesB(fd) {
			return false
		}
		blk, ok := n.(*ast.BlockStmt)
		if !ok {
			return true
		}
		opened := false // an Open's error is in scope of the statements that follow
		for _, st := range blk.List {
			if as, ok := st.(*ast.AssignStmt); ok {
				opened = false
				for _, r := range as.Rhs {
					opened = opened || isOpenCall(r)
				}
				continue
			}
			is, ok := st.(*ast.IfStmt)
			if !ok {
				continue
			}
			if (opened && mentions(is.Cond, "err")) || mentions(is.Cond, "errOut") {
				if at, ok := skipIn(is.Body); ok && !exempt(f, is.Body) {
					out = append(out, at)
				}
			}
		}
		return true
	})
	return out
}

func isOpenCall(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		return fn.Name == "Open"
	case *ast.SelectorExpr:
		x, ok := fn.X.(*ast.Ident)
		return ok && x.Name == "loader" && fn.Sel.Name == "Open"
	}
	return false
}

func mentions(e ast.Expr, name string) bool {
	hit := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			hit = true
		}
		return !hit
	})
	return hit
}

// skipIn finds a t.Skip/t.Skipf (any receiver but this package) directly in body.
func skipIn(body *ast.BlockStmt) (token.Pos, bool) {
	for _, st := range body.List {
		es, ok := st.(*ast.ExprStmt)
		if !ok {
			continue
		}
		call, ok := es.X.(*ast.CallExpr)
		if !ok {
			continue
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Skip" && sel.Sel.Name != "Skipf") {
			continue
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == "required" {
			continue
		}
		return call.Pos(), true
	}
	return token.NoPos, false
}

// takesB reports a benchmark: a function with a *testing.B parameter.
func takesB(fd *ast.FuncDecl) bool {
	for _, p := range fd.Type.Params.List {
		if st, ok := p.Type.(*ast.StarExpr); ok {
			if sel, ok := st.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "B" {
				return true
			}
		}
	}
	return false
}

// exempt reports a body holding a comment that says why the skip is not a missing backend.
func exempt(f *ast.File, body *ast.BlockStmt) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > body.Lbrace && cg.End() < body.Rbrace && strings.Contains(cg.Text(), "not a missing backend") {
			return true
		}
	}
	return false
}
