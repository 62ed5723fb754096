package jinja

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

func filterMap(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewList(nil), nil
	}

	list := args[0].AsList()

	// map(attribute="name") form
	if attr, ok := kwargs["attribute"]; ok {
		attrName := printValue(attr)
		defVal := Undefined()
		if d, ok := kwargs["default"]; ok {
			defVal = d
		}

		items := make([]Value, list.Len())
		for i, item := range list.Items {
			if item.IsDict() {
				v, found := item.AsDict().Get(attrName)
				if found {
					items[i] = v
				} else {
					items[i] = defVal
				}
			} else {
				items[i] = defVal
			}
		}
		return NewList(items), nil
	}

	return NewList(list.Items), nil
}

func filterSelect(args []Value, kwargs map[string]Value) (Value, error) {
	return filterByTest(args, false, true)
}

func filterReject(args []Value, kwargs map[string]Value) (Value, error) {
	return filterByTest(args, false, false)
}

func filterSelectattr(args []Value, kwargs map[string]Value) (Value, error) {
	return filterByTest(args, true, true)
}

func filterRejectattr(args []Value, kwargs map[string]Value) (Value, error) {
	return filterByTest(args, true, false)
}

// filterByTest is select/reject (attr false: args are list, test, test args) and
// selectattr/rejectattr (attr true: list, attribute, test, test args): it keeps the items whose
// value (or attribute) passes the test (want true) or fails it; no test means truthiness.
func filterByTest(args []Value, attr, want bool) (Value, error) {
	first := 1
	if attr {
		first = 2
	}
	if len(args) < first || !args[0].IsList() {
		return NewList(nil), nil
	}
	attrName := ""
	if attr {
		attrName = printValue(args[1])
	}
	testName := ""
	if len(args) > first && (attr || args[first].IsString()) {
		testName = printValue(args[first])
		if attr && testName == "truthy" {
			testName = ""
		}
	}
	testArgs := args[min(first+1, len(args)):]
	var items []Value
	for _, item := range args[0].AsList().Items {
		v := item
		if attr {
			v = Undefined()
			if item.IsDict() {
				if a, ok := item.AsDict().Get(attrName); ok {
					v = a
				}
			}
		}
		pass := v.IsTruthy()
		if testName != "" {
			var err error
			if pass, err = evalTest(testName, v, testArgs); err != nil {
				return Undefined(), err
			}
		}
		if pass == want {
			items = append(items, item)
		}
	}
	return NewList(items), nil
}

func filterIndent(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	s := printValue(args[0])
	width := 4
	if len(args) > 1 {
		width = int(toInt64(args[1]))
	}
	if w, ok := kwargs["width"]; ok {
		width = int(toInt64(w))
	}

	indentFirst := false
	if len(args) > 2 {
		indentFirst = args[2].IsTruthy()
	}
	if f, ok := kwargs["first"]; ok {
		indentFirst = f.IsTruthy()
	}

	if width < 0 || width > maxPad {
		return Undefined(), fmt.Errorf("indent: width %d: must be 0 to %d: %w", width, maxPad, ErrLimit)
	}
	pad := strings.Repeat(" ", width)
	lines := strings.Split(s, "\n")
	for i, line := range lines {
		if i == 0 && !indentFirst {
			continue
		}
		if line != "" {
			lines[i] = pad + line
		}
	}

	return NewString(strings.Join(lines, "\n")), nil
}

func filterWordcount(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}
	words := strings.Fields(printValue(args[0]))
	return NewInt(int64(len(words))), nil
}

func filterEscape(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s := printValue(args[0])
	s = strings.ReplaceAll(s, "&", "&amp;")
	s = strings.ReplaceAll(s, "<", "&lt;")
	s = strings.ReplaceAll(s, ">", "&gt;")
	s = strings.ReplaceAll(s, `"`, "&quot;")
	s = strings.ReplaceAll(s, "'", "&#39;")
	return NewString(s), nil
}

func filterDictsort(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsDict() {
		return NewList(nil), nil
	}

	d := args[0].AsDict()
	reverse := false
	if r, ok := kwargs["reverse"]; ok && r.IsBool() {
		reverse = r.AsBool()
	}

	keys := make([]string, len(d.Keys))
	copy(keys, d.Keys)

	sort.SliceStable(keys, func(i, j int) bool {
		if reverse {
			return keys[i] > keys[j]
		}
		return keys[i] < keys[j]
	})

	items := make([]Value, len(keys))
	for i, key := range keys {
		items[i] = NewList([]Value{NewString(key), d.Data[key]})
	}

	return NewList(items), nil
}

func filterMax(args []Value, _ map[string]Value) (Value, error) {
	return extremum(args, slices.MaxFunc[[]Value])
}

func filterMin(args []Value, _ map[string]Value) (Value, error) {
	return extremum(args, slices.MinFunc[[]Value])
}

// extremum is max or min (pick) of a non-empty list by compareValues, the first of equals;
// undefined for anything else.
func extremum(args []Value, pick func([]Value, func(a, b Value) int) Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() || args[0].AsList().Len() == 0 {
		return Undefined(), nil
	}
	return pick(args[0].AsList().Items, compareValues), nil
}

func filterSum(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewInt(0), nil
	}

	list := args[0].AsList()
	var sumF float64
	isFloat := false

	for _, item := range list.Items {
		if item.IsFloat() {
			isFloat = true
			sumF += item.AsFloat()
		} else if item.IsInt() {
			sumF += float64(item.AsInt())
		}
	}

	if isFloat {
		return NewFloat(sumF), nil
	}
	return NewInt(int64(sumF)), nil
}

func filterBatch(args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) < 2 || !args[0].IsList() {
		return NewList(nil), nil
	}

	list := args[0].AsList()
	linecount := int(toInt64(args[1]))
	if linecount <= 0 {
		return NewList(nil), nil
	}

	var batches []Value
	for i := 0; i < list.Len(); i += linecount {
		end := min(i+linecount, list.Len())
		batch := make([]Value, end-i)
		copy(batch, list.Items[i:end])
		batches = append(batches, NewList(batch))
	}

	return NewList(batches), nil
}
