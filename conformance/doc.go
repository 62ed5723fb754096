// Package conformance checks a backend against the CPU reference (core/ref), the way
// llama.cpp's test-backend-ops does, and writes reports a vendor can publish.
//
// Run takes any core.Backend through five levels:
//
//  1. ABI and lifecycle, through the raw plugin API (abi.Plugin): probe and info, stale and
//     foreign handles, wrong call order, wrong bindings, malformed IR, NULL pointers, fences,
//     release while in flight; every failure must carry a last_error message.
//  2. Ops: every v1 op × the dtypes it takes × shapes that break kernels (1, odd, tails of SIMD
//     widths and blocks, large, broadcast, zero-size), judged by NMSE and max-abs error under
//     the thresholds of TOLERANCES.md, with guard bytes around every tensor, NaN/Inf parity and
//     a second run that must give the same bytes.
//  3. Buffers: zero-copy import of host memory, outputs bound at an offset inside a larger
//     buffer (a KV-cache append), two executions of one executable in parallel.
//  4. Graphs: a Llama-style transformer block with a KV cache, and chunked attention over a KV
//     cache whose rows past the valid length are NaN.
//  5. Models: cases other packages register with RegisterModelCase.
//
// A case declined before prepare (op_support or graph_analyze) is unsupported, not failed;
// declining after claiming support is a capability lie. Every case's inputs come from a hash
// of its name and the seed, so a failing case prints the one command that reruns it.
package conformance
