package jinja

import (
	"fmt"
	"slices"
)

func (e *evaluator) evalExpr(ex expr) (Value, error) {
	switch n := ex.(type) {
	case *litExpr:
		return n.val, nil

	case *nameExpr:
		v, _ := e.scope.get(n.name)
		return v, nil

	case *attrExpr:
		return e.evalAttr(n)

	case *itemExpr:
		return e.evalItem(n)

	case *sliceExpr:
		return e.evalSlice(n)

	case *unaryExpr:
		return e.evalUnary(n)

	case *binExpr:
		return e.evalBinary(n)

	case *condExpr:
		return e.evalCond(n)

	case *callExpr:
		return e.evalCallExpr(n)

	case *filterExpr:
		return e.evalFilter(n)

	case *testExpr:
		return e.evalTestExpr(n)

	case *listExpr:
		items := make([]Value, len(n.items))
		for i, item := range n.items {
			v, err := e.evalExpr(item)
			if err != nil {
				return Undefined(), err
			}
			items[i] = v
		}
		return NewList(items), nil

	case *dictExpr:
		d := NewDict()
		dict := d.AsDict()
		for _, pair := range n.pairs {
			key, err := e.evalExpr(pair.key)
			if err != nil {
				return Undefined(), err
			}
			val, err := e.evalExpr(pair.value)
			if err != nil {
				return Undefined(), err
			}
			dict.Set(printValue(key), val)
		}
		return d, nil

	default:
		return Undefined(), fmt.Errorf("unknown expression type %T", ex)
	}
}

func (e *evaluator) evalAttr(n *attrExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	// Dict attribute access.
	if obj.IsDict() {
		if v, ok := obj.AsDict().Get(n.attr); ok {
			return v, nil
		}

		// Dict methods.
		return e.dictMethod(obj, n.attr)
	}

	// String methods.
	if obj.IsString() {
		return e.stringMethod(obj, n.attr)
	}

	// List methods.
	if obj.IsList() {
		return e.listMethod(obj, n.attr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalItem(n *itemExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	key, err := e.evalExpr(n.key)
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		idx := int(toInt64(key))
		list := obj.AsList()
		if idx < 0 {
			idx += list.Len()
		}
		if idx < 0 || idx >= list.Len() {
			return Undefined(), nil
		}
		return list.Get(idx), nil
	}

	if obj.IsDict() {
		k := printValue(key)
		if v, ok := obj.AsDict().Get(k); ok {
			return v, nil
		}
		return Undefined(), nil
	}

	if obj.IsString() {
		idx := int(toInt64(key))
		s := obj.AsString()
		runes := []rune(s)
		if idx < 0 {
			idx += len(runes)
		}
		if idx < 0 || idx >= len(runes) {
			return Undefined(), nil
		}
		return NewString(string(runes[idx])), nil
	}

	return Undefined(), nil
}

func (e *evaluator) evalSlice(n *sliceExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	switch {
	case obj.IsList():
		items := obj.AsList().Items
		start, stop, step := resolveSlice(n, e, len(items))
		return NewList(sliceOf(items, start, stop, step)), nil
	case obj.IsString():
		s := obj.AsString()
		// ASCII fast path. Most chat-template string slicing operates on tag/role names or
		// message content that is ASCII; for those byte indexing is code-point indexing, and
		// the []rune conversion, the dominant cost when a system prompt is tens of thousands
		// of bytes, is skipped (a step of 1 is a substring, no copy at all).
		if isASCII(s) {
			start, stop, step := resolveSlice(n, e, len(s))
			if step == 1 {
				start, stop = max(start, 0), min(stop, len(s))
				if start >= stop {
					return NewString(""), nil
				}
				return NewString(s[start:stop]), nil
			}
			return NewString(string(sliceOf([]byte(s), start, stop, step))), nil
		}
		runes := []rune(s)
		start, stop, step := resolveSlice(n, e, len(runes))
		return NewString(string(sliceOf(runes, start, stop, step))), nil
	}
	return Undefined(), nil
}

// sliceOf is items[start:stop:step] in Python's sense, for the bounds resolveSlice gives
// (step is never 0): a new slice, since aliasing items would let a later List.Append write
// into the source's backing array.
func sliceOf[T any](items []T, start, stop, step int) []T {
	length := len(items)
	if step == 1 {
		// the overwhelmingly common case (messages[1:] in chat templates): one copy
		start, stop = max(start, 0), min(stop, length)
		if start >= stop {
			return nil
		}
		return slices.Clone(items[start:stop])
	}
	// pre-sized to the most iterations, against append's geometric growth
	var count int
	if step > 0 {
		count = (stop - start + step - 1) / step
	} else {
		count = (start - stop - step - 1) / -step
	}
	var out []T
	if count > 0 {
		out = make([]T, 0, count)
	}
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if i >= 0 && i < length {
			out = append(out, items[i])
		}
	}
	return out
}

// isASCII reports whether s contains only 7-bit ASCII bytes. Used to
// skip the []rune conversion in evalSlice's string branch when byte
// indexing produces the same result as code-point indexing.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func resolveSlice(n *sliceExpr, e *evaluator, length int) (int, int, int) {
	step := 1
	if n.step != nil {
		v, _ := e.evalExpr(n.step)
		step = int(toInt64(v))
		if step == 0 {
			step = 1
		}
	}

	var start, stop int

	if step > 0 {
		start = 0
		stop = length
	} else {
		start = length - 1
		stop = -length - 1
	}

	if n.start != nil {
		v, _ := e.evalExpr(n.start)
		start = int(toInt64(v))
		if start < 0 {
			start += length
		}
	}

	if n.stop != nil {
		v, _ := e.evalExpr(n.stop)
		stop = int(toInt64(v))
		if stop < 0 {
			stop += length
		}
	}

	return start, stop, step
}

func (e *evaluator) evalUnary(n *unaryExpr) (Value, error) {
	operand, err := e.evalExpr(n.operand)
	if err != nil {
		return Undefined(), err
	}

	switch n.op {
	case "not":
		return NewBool(!operand.IsTruthy()), nil
	case "-":
		if operand.IsInt() {
			return NewInt(-operand.AsInt()), nil
		}
		if operand.IsFloat() {
			return NewFloat(-operand.AsFloat()), nil
		}
		return NewInt(0), nil
	case "+":
		return operand, nil
	}

	return Undefined(), fmt.Errorf("unknown unary operator %q", n.op)
}

func (e *evaluator) evalBinary(n *binExpr) (Value, error) {
	// Short-circuit for and/or.
	if n.op == "and" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if !left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	if n.op == "or" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	left, err := e.evalExpr(n.left)
	if err != nil {
		return Undefined(), err
	}

	right, err := e.evalExpr(n.right)
	if err != nil {
		return Undefined(), err
	}

	if err := e.lim.chargeBinary(n.op, left, right); err != nil {
		return Undefined(), err
	}
	switch n.op {
	case "+":
		return addValues(left, right), nil
	case "-":
		return subValues(left, right), nil
	case "*":
		return mulValues(left, right), nil
	case "/":
		return divValues(left, right), nil
	case "//":
		return floorDivValues(left, right), nil
	case "%":
		return modValues(left, right), nil
	case "**":
		return powValues(left, right), nil
	case "~":
		return NewString(printValue(left) + printValue(right)), nil
	case "==":
		return NewBool(valuesEqual(left, right)), nil
	case "!=":
		return NewBool(!valuesEqual(left, right)), nil
	case "<":
		return NewBool(compareValues(left, right) < 0), nil
	case ">":
		return NewBool(compareValues(left, right) > 0), nil
	case "<=":
		return NewBool(compareValues(left, right) <= 0), nil
	case ">=":
		return NewBool(compareValues(left, right) >= 0), nil
	case "in":
		return NewBool(containsValue(right, left)), nil
	case "not in":
		return NewBool(!containsValue(right, left)), nil
	}

	return Undefined(), fmt.Errorf("unknown binary operator %q", n.op)
}

func (e *evaluator) evalCond(n *condExpr) (Value, error) {
	cond, err := e.evalExpr(n.condition)
	if err != nil {
		return Undefined(), err
	}

	if cond.IsTruthy() {
		return e.evalExpr(n.trueExpr)
	}

	if n.falseExpr != nil {
		return e.evalExpr(n.falseExpr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalCallExpr(n *callExpr) (Value, error) {
	fn, err := e.evalExpr(n.fn)
	if err != nil {
		return Undefined(), err
	}

	if !fn.IsCallable() {
		return Undefined(), fmt.Errorf("%s is not callable: %s", callableName(n.fn), fn.String())
	}

	args, kwargs, err := e.evalArgs(nil, n.args, n.kwargs)
	if err != nil {
		return Undefined(), err
	}
	return fn.AsCallable().Fn(args, kwargs)
}

// evalArgs evaluates a call's arguments, after lead (a filter's input), and its keyword
// arguments (nil when there are none).
func (e *evaluator) evalArgs(lead []Value, exprs []expr, kws []kwarg) ([]Value, map[string]Value, error) {
	args := make([]Value, len(lead), len(lead)+len(exprs))
	copy(args, lead)
	for _, a := range exprs {
		v, err := e.evalExpr(a)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, v)
	}
	var kwargs map[string]Value
	if len(kws) > 0 {
		kwargs = make(map[string]Value, len(kws))
		for _, kw := range kws {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return nil, nil, err
			}
			kwargs[kw.name] = v
		}
	}
	return args, kwargs, nil
}

func callableName(ex expr) string {
	switch n := ex.(type) {
	case *nameExpr:
		return n.name

	case *attrExpr:
		return callableName(n.obj) + "." + n.attr

	case *itemExpr:
		return callableName(n.obj) + "[item]"

	default:
		return ex.nodeType()
	}
}

func (e *evaluator) evalFilter(n *filterExpr) (Value, error) {
	input, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	// Look up filter in builtins.
	filterVal, ok := lookupFilter(e.builtins, n.name)
	if !ok {
		// Also check scope for user-defined filters.
		filterVal, ok = e.scope.get(n.name)
		if !ok {
			return Undefined(), fmt.Errorf("unknown filter %q", n.name)
		}
	}

	if !filterVal.IsCallable() {
		return Undefined(), fmt.Errorf("filter %q is not callable", n.name)
	}

	// the input first, then the filter's own arguments
	args, kwargs, err := e.evalArgs([]Value{input}, n.args, n.kwargs)
	if err != nil {
		return Undefined(), err
	}
	return filterVal.AsCallable().Fn(args, kwargs)
}

func (e *evaluator) evalTestExpr(n *testExpr) (Value, error) {
	val, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	testArgs, _, err := e.evalArgs(nil, n.args, nil)
	if err != nil {
		return Undefined(), err
	}

	result, err := evalTest(n.name, val, testArgs)
	if err != nil {
		return Undefined(), err
	}

	if n.negated {
		result = !result
	}

	return NewBool(result), nil
}
